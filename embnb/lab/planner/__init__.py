"""Notebook 03's layer over `embnb.planner` (import each from its module):

- `models`: random models like production ones, their enumerated options.
- `reference`: the knapsack recurrence in plain Python (what the notebook shows).
- `brute_force`: every combination placed and rated as torchrec would.
- `planning`: one proposer run in torchrec's planner, timed (`run_planner`),
  and `create_planner` from the model to the plan (`time_end_to_end`).
- `comparison`: proposers side by side, also as the HBM budget shrinks.
- `quality`: each proposer's rating over brute force's, on small instances.
- `hosts`: how many hosts each topology has, as torchrec counts them.
- `pitfall`: tiny instances where the least summed perf is not the best plan.
- `ablation`: the proposer's pieces added one at a time (`LADDER`).
- `explain`: the options, the DP table, the frontier.
- `candidates`: the plans measured rank by rank (`embnb.steptime`), with
  torchrec's estimates beside them, and Spearman's rank correlation;
  `measured` runs them rank by rank for section 10 (on the notebook's
  device where FBGEMM's CUDA kernels are, else the CPU) and draws the figure.
- `calibrated`: the committed calibrate bench loaded for section 11 (held-out
  errors, the plans measured fastest, the scatter), not refitted.
- `results`, `plots`, `widgets`: the notebook's parts and results dict,
  figures, explorer.
"""

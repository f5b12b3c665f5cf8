"""Notebook 03's layer over `embnb.planner` (import each from its module): models and their
options, the knapsack written plainly (`reference`) and brute force, planning runs in torchrec's
planner (`planning`, `comparison`, `ablation`, `quality`, `pitfall`, `explain`, `hosts`), the plans
measured rank by rank (`candidates`, `measured`) and the committed calibration (`calibrated`), and
the notebook's results, figures and explorer (`results`, `plots`, `widgets`). docs/architecture.md
says what each module holds.
"""

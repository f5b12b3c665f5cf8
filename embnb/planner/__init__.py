"""Technique 3: a dynamic-programming sharding proposer inside torchrec's planner.

- `proposer`: `DynamicProgrammingProposer`, a torchrec `Proposer`;
  `knapsack`: its building blocks (the options as arrays, the DP over memory bins).
- `topology`: topologies, random models, enumerated options, `create_planner`.
- `study`: running proposers in torchrec's planner and comparing them
  (side by side, as the budget shrinks, against brute force).
- `inspect`: the options, the DP table, the frontier, the brute-force optimum.
- `results`: notebook 03's results dict.
- `plots`: the notebook's figures; `widgets`: its explorer (`PlannerExplorer`).

    from embnb.planner import DynamicProgrammingProposer, create_planner
"""

from embnb.planner.inspect import (
    PlanExtremes,
    brute_force_rating,
    knapsack_frontier,
    knapsack_table,
    option_label,
    options_table,
    plan_extremes,
)
from embnb.planner.knapsack import GB
from embnb.planner.proposer import DynamicProgrammingProposer
from embnb.planner.results import notebook_results
from embnb.planner.study import (
    PlanRun,
    ProposerFactory,
    budget_sweep,
    compare_proposers,
    default_proposers,
    quality_study,
    quality_summary,
    random_instance,
    rank_loads,
    rate_every_plan,
    run_planner,
)
from embnb.planner.topology import (
    Enumerated,
    Model,
    create_planner,
    enumerate_options,
    fused_table_gb,
    make_model,
    make_topology,
    reserved_topology,
    topology_for_device,
)

__all__ = [
    "DynamicProgrammingProposer",
    "create_planner",
    "make_topology",
    "topology_for_device",
    "Model",
    "make_model",
    "fused_table_gb",
    "Enumerated",
    "enumerate_options",
    "reserved_topology",
    "PlanRun",
    "run_planner",
    "rank_loads",
    "ProposerFactory",
    "default_proposers",
    "compare_proposers",
    "budget_sweep",
    "rate_every_plan",
    "random_instance",
    "quality_study",
    "quality_summary",
    "notebook_results",
    "option_label",
    "options_table",
    "knapsack_table",
    "knapsack_frontier",
    "brute_force_rating",
    "PlanExtremes",
    "plan_extremes",
    "GB",
]

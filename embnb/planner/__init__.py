"""Technique 3: a dynamic-programming sharding proposer inside torchrec's planner.

- `proposer`: `DynamicProgrammingProposer`, a torchrec `Proposer`, on its
  building blocks: `space` (the options as arrays), `knapsack` (the DP over
  memory bins) and `replica` (torchrec's partitioner and perf model on arrays).
- `topology`: topologies, random models, enumerated options, `create_planner`.
- `enumerator`: `DistinctShardEnumerator`, torchrec's enumerator with each
  distinct shard's perf estimated once (opt-in: `enumerator="embnb"`).
- `study`: running proposers in torchrec's planner and comparing them
  (side by side, as the budget shrinks, against brute force).
- `pitfall`: tiny instances where the least summed perf is not the best plan.
- `ablation`: the proposer's pieces added one at a time (`LADDER`).
- `inspect`: the options, the DP table, the frontier, the brute-force optimum.
- `results`: notebook 03's results dict.
- `plots`: the notebook's figures; `widgets`: its explorer (`PlannerExplorer`).

    from embnb.planner import DynamicProgrammingProposer, create_planner
"""

# Each module lists its public names once (its __all__); this gathers them.
from embnb.planner import ablation, enumerator, inspect, pitfall, proposer, results, study, topology
from embnb.planner.ablation import *  # noqa: F403
from embnb.planner.enumerator import *  # noqa: F403
from embnb.planner.inspect import *  # noqa: F403
from embnb.planner.pitfall import *  # noqa: F403
from embnb.planner.proposer import *  # noqa: F403
from embnb.planner.results import *  # noqa: F403
from embnb.planner.space import GB
from embnb.planner.study import *  # noqa: F403
from embnb.planner.topology import *  # noqa: F403

__all__ = [
    *proposer.__all__,
    *enumerator.__all__,
    *topology.__all__,
    *study.__all__,
    *ablation.__all__,
    *pitfall.__all__,
    *inspect.__all__,
    *results.__all__,
    "GB",
]

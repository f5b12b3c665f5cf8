"""Technique 3: a dynamic-programming sharding proposer inside torchrec's planner.

The library (what this package exports; none of it imports pandas or matplotlib):

- `proposer`: `DynamicProgrammingProposer`, a torchrec `Proposer`, on its
  building blocks: `space` (the options as arrays), `knapsack` (the DP over
  memory bins), `search` (the runs of knapsacks and the hill climb) and
  `replica` (torchrec's partitioner and perf model on arrays).
- `factory`: `create_planner`, torchrec's planner with the DP proposer first.
- `partitioner`: `HeapSearchPartitioner`, torchrec's GreedyPerfPartitioner
  (create_planner's), its device partition without popping full devices.
- `topology`: `make_topology`, `topology_for_device`.
- `enumerator`: `DistinctShardEnumerator`, torchrec's enumerator with each
  distinct shard's perf estimated once (create_planner's default).
- `calibration`: `Calibration`, torchrec's perf config fitted to measured
  ranks (`fit`, `shard_terms`); `create_planner(..., calibration=...)`.
- `perf_model`: `KernelCallPerfModel`, a torchrec PerfModel: NoopPerfModel's
  rating (ms) plus each rank's TBE calls and the plan's collectives
  (`create_planner`'s with a calibration; `tbe_group_key`: torchrec's key).

Notebook 03's models, brute force, studies, figures and widgets live in
`embnb.lab.planner`.

    from embnb.planner import DynamicProgrammingProposer, create_planner
"""

from embnb.planner.calibration import Calibration
from embnb.planner.enumerator import ENUMERATORS, DistinctShardEnumerator
from embnb.planner.factory import EmbnbShardingPlanner, create_planner
from embnb.planner.partitioner import HeapSearchPartitioner
from embnb.planner.perf_model import KernelCallPerfModel, tbe_group_key
from embnb.planner.proposer import DynamicProgrammingProposer
from embnb.planner.topology import make_topology, topology_for_device

__all__ = [
    "DynamicProgrammingProposer",
    "create_planner",
    "EmbnbShardingPlanner",
    "make_topology",
    "topology_for_device",
    "DistinctShardEnumerator",
    "ENUMERATORS",
    "Calibration",
    "HeapSearchPartitioner",
    "KernelCallPerfModel",
    "tbe_group_key",
]

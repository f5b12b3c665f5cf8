"""Technique 3: a dynamic-programming sharding proposer inside torchrec's planner.

`DynamicProgrammingProposer` (`proposer`, on `space`, `knapsack`, `search` and
`replica`), `create_planner` (`factory`: torchrec's planner with it first, the
`HeapSearchPartitioner` of `partitioner` and the `DistinctShardEnumerator` of
`enumerator`), topologies (`topology`), and a perf config fitted to measured
ranks (`calibration`, rated by `perf_model`'s `KernelCallPerfModel`). None of
it imports pandas or matplotlib; notebook 03's models, studies, figures and
widgets live in `embnb.lab.planner`.

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

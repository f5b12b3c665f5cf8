"""The planner a user calls: torchrec's EmbeddingShardingPlanner with embnb's DP first.

planner = create_planner(topology, batch_size=512)   # or create_planner("auto", 512)
plan = planner.plan(module, sharders)
"""

from __future__ import annotations

import torch
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.proposers import UniformProposer
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, Topology

from embnb._checks import check_int, check_number
from embnb.planner.enumerator import make_enumerator
from embnb.planner.proposer import DynamicProgrammingProposer
from embnb.planner.topology import topology_for_device

__all__ = ["create_planner"]


def create_planner(
    topology: Topology | str | torch.device,
    batch_size: int,
    *,
    world_size: int | None = None,
    local_world_size: int | None = None,
    storage_reservation_percentage: float = 0.15,
    intra_host_bw: float | None = None,
    inter_host_bw: float | None = None,
    bins_per_device: int = 100,
    constraints: dict[str, ParameterConstraints] | None = None,
    timeout_seconds: int | None = None,
    enumerator: str = "embnb",
) -> EmbeddingShardingPlanner:
    """torchrec's EmbeddingShardingPlanner with this DP proposer first and
    torchrec's UniformProposer as a fallback.

    `topology` is a Topology, or a device ("auto", "cpu", "cuda") whose
    topology is read from the machine for `world_size` ranks (default: the
    process group's, else 1). `storage_reservation_percentage` of each
    device is kept for everything but the embedding tables. `enumerator`:
    "embnb" (`DistinctShardEnumerator`: torchrec's options, equal to its
    EmbeddingEnumerator's field by field on both supported torchrec versions,
    each distinct shard's perf estimated once) or "torchrec" (its
    EmbeddingEnumerator).
    """
    check_int("batch_size", batch_size, low=1)
    check_number(
        "storage_reservation_percentage", storage_reservation_percentage, low=0, high=1, high_open=True
    )
    if not isinstance(topology, Topology):
        if world_size is None:
            dist = torch.distributed
            world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        topology = topology_for_device(topology, world_size, local_world_size, intra_host_bw, inter_host_bw)
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        enumerator=make_enumerator(enumerator, topology, batch_size, constraints),
        constraints=constraints,
        storage_reservation=FixedPercentageStorageReservation(percentage=storage_reservation_percentage),
        proposer=[DynamicProgrammingProposer(bins_per_device=bins_per_device), UniformProposer()],
        timeout_seconds=timeout_seconds,
        debug=False,
    )

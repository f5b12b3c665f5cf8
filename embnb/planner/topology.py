"""Topologies, models and their sharding options: what the planner plans for.

topology = make_topology(8, "cuda", hbm_cap_gb=16)     # or topology_for_device("auto", 8)
model = make_model(40, seed=0)                           # random tables like production ones
enumerated = enumerate_options(model.tables, topology, 512, model.constraints)
enumerated = enumerate_options(..., enumerator="embnb")  # the same options, estimated faster
planner = create_planner(topology, batch_size=512)       # torchrec's planner, embnb's DP first
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.proposers import UniformProposer
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    HardwareConfig,
    KernelConfig,
    ParameterConstraints,
    ShardingOption,
    Topology,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb._checks import check_choice, check_int, check_number
from embnb.planner.enumerator import make_enumerator
from embnb.planner.proposer import DynamicProgrammingProposer
from embnb.planner.space import GB

__all__ = [
    "make_topology",
    "topology_for_device",
    "create_planner",
    "Model",
    "make_model",
    "fused_table_gb",
    "Enumerated",
    "enumerate_options",
    "reserved_topology",
]


def make_topology(
    world_size: int,
    compute_device: str = "cuda",
    hbm_cap_gb: float | None = None,
    ddr_cap_gb: float | None = None,
    local_world_size: int | None = None,
    intra_host_bw: float | None = None,
    inter_host_bw: float | None = None,
) -> Topology:
    """A torchrec Topology (through TopologyFactory). Caps are per device in
    GiB; bandwidths in torchrec's unit, bytes per ms (None: its defaults)."""
    check_int("world_size", world_size, low=1)
    local_world_size = world_size if local_world_size is None else local_world_size
    check_int("local_world_size", local_world_size, low=1)
    if world_size % local_world_size:
        raise ValueError(f"local_world_size {local_world_size} must divide world_size {world_size}")
    check_choice("compute_device", compute_device, ("cuda", "cpu"))
    for name, value in (
        ("hbm_cap_gb", hbm_cap_gb),
        ("ddr_cap_gb", ddr_cap_gb),
        ("intra_host_bw", intra_host_bw),
        ("inter_host_bw", inter_host_bw),
    ):
        if value is not None:  # None: torchrec's default
            check_number(name, value, low=0, low_open=True)
    bandwidths = intra_host_bw is not None or inter_host_bw is not None
    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(
            world_size=world_size,
            local_world_size=local_world_size,
            hbm_cap_bytes=None if hbm_cap_gb is None else int(hbm_cap_gb * GB),
            ddr_cap_bytes=None if ddr_cap_gb is None else int(ddr_cap_gb * GB),
        ),
        hardware_config=HardwareConfig(intra_host_bw=intra_host_bw, inter_host_bw=inter_host_bw),
        kernel_config=KernelConfig(compute_device=compute_device, use_hardware_based_bandwidth=bandwidths),
    )


def _planning_device(device: str | torch.device) -> torch.device:
    """The kind of device planned for: "auto" is cuda when a GPU is visible,
    else cpu. (Unlike `embnb.dist.resolve_device`, one GPU stands for a
    cluster of them: planning needs none per rank.)"""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from error
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but no GPU is visible")
    return resolved


def topology_for_device(
    device: str | torch.device,
    world_size: int,
    local_world_size: int | None = None,
    intra_host_bw: float | None = None,
    inter_host_bw: float | None = None,
) -> Topology:
    """The Topology of `world_size` ranks like this machine: HBM from the GPU,
    DDR from system memory shared by the local ranks."""
    device = _planning_device(device)
    local_world_size = world_size if local_world_size is None else local_world_size
    check_int("local_world_size", local_world_size, low=1)
    hbm = torch.cuda.get_device_properties(device).total_memory / GB if device.type == "cuda" else None
    return make_topology(
        world_size,
        device.type,
        hbm,
        _system_memory() / local_world_size / GB,
        local_world_size,
        intra_host_bw,
        inter_host_bw,
    )


def _system_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:  # psutil comes with jupyter; plain POSIX otherwise
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


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
    enumerator: str = "torchrec",
) -> EmbeddingShardingPlanner:
    """torchrec's EmbeddingShardingPlanner with this DP proposer first and
    torchrec's UniformProposer as a fallback.

    `topology` is a Topology, or a device ("auto", "cpu", "cuda") whose
    topology is read from the machine for `world_size` ranks (default: the
    process group's, else 1). `storage_reservation_percentage` of each
    device is kept for everything but the embedding tables. `enumerator`:
    "torchrec" (its EmbeddingEnumerator) or "embnb" (`DistinctShardEnumerator`:
    the same options, each distinct shard's perf estimated once).
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


@dataclass(frozen=True)
class Model:
    """Embedding tables and their ParameterConstraints (pooling factors), by table name."""

    tables: list[EmbeddingBagConfig]
    constraints: dict[str, ParameterConstraints]


def make_model(num_tables: int, seed: int = 0, max_rows: int = 10_000_000) -> Model:
    """A model like production ones: row counts log-uniform from 1,000 to
    `max_rows` (a few huge tables, many small), dims 16 to 256, pooling
    factors 1 to 50."""
    check_int("num_tables", num_tables, low=1)
    check_int("max_rows", max_rows, low=1000)
    rng = np.random.default_rng(seed)
    tables, constraints = [], {}
    for i in range(num_tables):
        name = f"table_{i}"
        tables.append(
            EmbeddingBagConfig(
                name=name,
                feature_names=[f"feature_{i}"],
                num_embeddings=int(10 ** rng.uniform(3, math.log10(max_rows))),
                embedding_dim=int(rng.choice([16, 32, 64, 128, 256])),
            )
        )
        constraints[name] = ParameterConstraints(pooling_factors=[float(rng.choice([1, 2, 5, 10, 20, 50]))])
    return Model(tables, constraints)


def fused_table_gb(tables: Sequence[EmbeddingBagConfig]) -> float:
    """Memory of every table's rows in fp32, in GiB: a scale for budgets."""
    return sum(t.num_embeddings * t.embedding_dim * 4 for t in tables) / GB


@dataclass(frozen=True)
class Enumerated:
    """An enumerator's output (torchrec's or embnb's: the same options), kept so
    every proposer plans over the same options (enumerating is the slow part:
    torchrec's estimators)."""

    module: EmbeddingBagCollection  # on the meta device
    sharders: list[EmbeddingBagCollectionSharder]
    options: list[ShardingOption]
    seconds: float  # enumerating took


def enumerate_options(
    tables: Sequence[EmbeddingBagConfig],
    topology: Topology,
    batch_size: int,
    constraints: dict[str, ParameterConstraints] | None = None,
    enumerator: str = "torchrec",
) -> Enumerated:
    """Sharding options of an EmbeddingBagCollection of `tables` (on meta), from
    torchrec's EmbeddingEnumerator (`enumerator="torchrec"`) or embnb's
    `DistinctShardEnumerator` ("embnb": the same options, faster)."""
    if not tables:
        raise ValueError("no tables to plan: pass at least one EmbeddingBagConfig")
    check_int("batch_size", batch_size, low=1)
    chosen = make_enumerator(enumerator, topology, batch_size, constraints)
    module = EmbeddingBagCollection(tables=list(tables), device=torch.device("meta"))
    sharders = [EmbeddingBagCollectionSharder()]
    start = time.perf_counter()
    options = chosen.enumerate(module, sharders)
    return Enumerated(module, sharders, options, time.perf_counter() - start)


def reserved_topology(
    topology: Topology, enumerated: Enumerated, batch_size: int, storage_reservation_percentage: float = 0.15
) -> Topology:
    """The storage constraint the planner hands its proposers and partitioner."""
    return FixedPercentageStorageReservation(storage_reservation_percentage).reserve(
        topology, batch_size, enumerated.module, enumerated.sharders
    )

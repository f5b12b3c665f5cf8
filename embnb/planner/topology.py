"""Topologies: the devices a plan is for, and the storage the planner keeps.

topology = make_topology(8, "cuda", hbm_cap_gb=16)   # or topology_for_device("auto", 8)
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    HardwareConfig,
    KernelConfig,
    Topology,
    TopologyFactory,
    TrainerConfig,
)

from embnb._checks import check_choice, check_int, check_number
from embnb.planner.space import GB

__all__ = ["make_topology", "topology_for_device", "reserved_topology"]


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
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / local_world_size / GB,  # POSIX
        local_world_size,
        intra_host_bw,
        inter_host_bw,
    )


def reserved_topology(
    topology: Topology, enumerated: Any, batch_size: int, storage_reservation_percentage: float = 0.15
) -> Topology:
    """The storage constraint the planner hands its proposers and partitioner, for the `module` and
    `sharders` of `enumerated` (an `embnb.lab.planner.models.Enumerated`)."""
    return FixedPercentageStorageReservation(storage_reservation_percentage).reserve(
        topology, batch_size, enumerated.module, enumerated.sharders
    )

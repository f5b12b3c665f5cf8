"""The fixed latency of each sharding type's collectives, measured on a real process group: a
calibration's `collective_ms` (the per-plan term of `KernelCallPerfModel`'s rating).

A sharded module runs, per sharding type its plan uses, one input distribution and one output
distribution, and every rank waits for them (`embnb.steptime.comms` lists each with its bytes, as
torchrec/distributed/dist_data.py moves them). Their bytes are in torchrec's per-shard comms
estimate; what a call costs whatever its bytes is not. `measure_collective_ms` runs each type's
collectives on payloads of one element per rank (the bytes ~0, so what is timed is the latency),
all ranks started together, and takes per type the median over repeats of the slowest rank's
time (ms, one module's collectives of that type in one step, forward and backward). The ranks
should each have a core (or a GPU) of their own: ranks taking turns on fewer cores time the
scheduler (on the 2-core machine, 8 gloo ranks took 17-46 ms a type, 2 ranks 0.5-3 ms).

    latency = measure_collective_ms(world_size=2, device="cpu")   # gloo ranks, as a CPU job runs
    calibration = dataclasses.replace(calibration, collective_ms=latency.collective_ms)
"""

from __future__ import annotations

import functools
import os
import pathlib
import statistics
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from embnb._checks import check_choice, check_int
from embnb.collectives import collective_seconds
from embnb.devices import device_plan
from embnb.dist import collective_device, launch

__all__ = ["COLLECTIVES", "CollectiveLatency", "measure_collective_ms"]

# The input distribution (torchrec's KJTAllToAll): the splits, then the lengths, then the ids.
_INPUT = (("all_to_all_single", "world"),) * 3
_POOLED = _INPUT + (("all_to_all_single", "world"),) * 2  # the pooled embeddings, then their gradient
_REDUCED = _INPUT + (("reduce_scatter_tensor", "world"), ("all_gather_into_tensor", "world"))
# Table-row-wise (and grid, per column block): a reduce-scatter within the host, an all-to-all
# across hosts among the devices of one local rank, and back.
_HOSTS = _INPUT + (
    ("reduce_scatter_tensor", "host"),
    ("all_to_all_single", "across hosts"),
    ("all_to_all_single", "across hosts"),
    ("all_gather_into_tensor", "host"),
)
# Per sharding type, its collectives in a training step as (kind, group), in the order
# `embnb.steptime.comms` lists them: the input distribution, the output distribution's forward,
# its backward. Timed with all ranks on one host: the host's group is the world, the group across
# hosts one rank (torchrec still calls it). Data-parallel runs none: its input and output
# distributions are local, its gradients join the all-reduce DistributedDataParallel runs for the
# dense parameters in every plan.
COLLECTIVES = {
    "table_wise": _POOLED,
    "column_wise": _POOLED,
    "table_column_wise": _POOLED,
    "row_wise": _REDUCED,
    "table_row_wise": _HOSTS,
    "grid_shard": _HOSTS,
    "data_parallel": (),
}


@dataclass(frozen=True)
class CollectiveLatency:
    """What `measure_collective_ms` measured: `collective_ms` per sharding type (ms, median over
    `repeats` of the slowest rank; empty where not measured), on `world_size` ranks over `backend`;
    `why`: where nothing was measured, why (else "")."""

    collective_ms: dict[str, float]
    world_size: int
    backend: str | None
    repeats: int
    why: str = ""


def measure_collective_ms(
    world_size: int, device: str = "cpu", repeats: int = 20, warmup: int = 3, timeout_s: float = 300.0
) -> CollectiveLatency:
    """Each sharding type's collectives (`COLLECTIVES`) timed on `world_size` ranks of `device`
    ("cpu": gloo; "cuda": nccl, one GPU per rank), each distinct sequence once, the sequences
    interleaved within each repeat so that a machine that slows slows them alike. On CUDA with
    fewer GPUs than ranks nothing is measured (ranks sharing a GPU talk over gloo through host
    memory, not as a multi-GPU job does): the result is empty and says why. Raises ValueError for
    a `world_size` below 2, a `repeats` below 1, a negative `warmup` or an unknown `device`;
    `embnb.dist.RankError` where a rank fails."""
    check_int("world_size", world_size, low=2)
    check_int("repeats", repeats, low=1)
    check_int("warmup", warmup, low=0)
    check_choice("device", device, ("cpu", "cuda"))
    plan = device_plan(device, world_size)
    if device == "cuda" and plan.backend != "nccl":
        why = (
            f"not measured: {plan.gpus} GPU(s) for {world_size} ranks, which would talk over gloo "
            "through host memory, not over NCCL as a job of one GPU per rank does"
        )
        return CollectiveLatency({}, world_size, None, repeats, why)
    per_rank = launch(_rank_times, world_size, warmup, repeats, device=device, timeout_s=timeout_s)
    # per distinct sequence of collectives: the median over repeats of the slowest rank
    sequence_ms = [
        1e3 * statistics.median(max(ranks) for ranks in zip(*(times[i] for times in per_rank)))
        for i in range(len(per_rank[0]))
    ]
    sequences = _sequences()
    collective_ms = {
        t: sequence_ms[sequences.index(calls)] if calls else 0.0 for t, calls in COLLECTIVES.items()
    }
    return CollectiveLatency(dict(sorted(collective_ms.items())), world_size, plan.backend, repeats)


def _rank_times(rank: int, world_size: int, warmup: int, repeats: int) -> list[list[float]]:
    """On one rank: per sequence of `_sequences`, the wall time (s) of each repeat. On a CPU each
    rank's threads (gloo's too) run on a core of their own, rank modulo the machine's cores, as a
    job's rank does, even where the launching process is pinned to fewer (Linux)."""
    device = collective_device()
    if device.type == "cpu" and pathlib.Path("/proc/self/task").is_dir():
        core = {rank % (os.cpu_count() or 1)}
        for thread in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(thread), core)
    # one host of all the ranks: the group across hosts holds this rank alone (every rank makes
    # every group, in one order, as torch.distributed requires)
    alone = [dist.new_group([r]) for r in range(world_size)][rank]
    groups = {"world": None, "host": None, "across hosts": alone}
    # torch 2.13 deprecates reduce_scatter_tensor and all_gather_into_tensor; torchrec calls them
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    sequences = _sequences()
    times: list[list[float]] = [[] for _ in sequences]
    for index in range(warmup + repeats):
        for calls, timed in zip(sequences, times):
            seconds = collective_seconds(functools.partial(_run, calls, groups, device), 1)
            if index >= warmup:
                timed += seconds
    return times


def _sequences() -> list[tuple[tuple[str, str], ...]]:
    """The distinct non-empty values of `COLLECTIVES`, each timed once: sharding types that run
    the same collectives differ only by noise."""
    return list(dict.fromkeys(calls for calls in COLLECTIVES.values() if calls))


def _run(calls: tuple[tuple[str, str], ...], groups: dict, device: torch.device) -> None:
    """`calls` one after another, one element to and from each rank of each call's group."""
    for kind, name in calls:
        group = groups[name]
        send = torch.zeros(dist.get_world_size(group), dtype=torch.int64, device=device)
        if kind == "all_to_all_single":
            dist.all_to_all_single(torch.empty_like(send), send, group=group)
        elif kind == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(send.new_empty(1), send, group=group)
        else:
            dist.all_gather_into_tensor(torch.empty_like(send), send[:1], group=group)

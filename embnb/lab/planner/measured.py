"""Notebook 03a's measured section: the candidate plans (`candidates`) of one model on a topology
of the measuring device, each run rank by rank with real kernels (`embnb.steptime`), beside
torchrec's estimates.

On a CPU the clock is each rank's thread CPU time at one intra-op thread (other processes on a
shared machine stretch wall time, not the CPU time the rank's kernels used); on a GPU (FBGEMM's
CUDA TBEs) it is wall time with the device synchronized at each phase's edges. Communication is
not run: its time per rank is computed from the counted bytes (`steptime.comms.LINK_MODEL`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pandas as pd
import torch

from embnb._checks import check_int
from embnb.lab.planner.candidates import POOR, candidate_plans, estimated_per_rank, plan_shape
from embnb.lab.planner.comparison import UVM_KERNELS
from embnb.lab.planner.models import Model, hosts_of
from embnb.planner.topology import make_topology
from embnb.steptime import make_batch, measure_plan, measure_plans_interleaved
from embnb.steptime.kernels import fbgemm_cuda_available
from embnb.timing import Stopwatch, machine_name, paired_difference, verdict

__all__ = ["MeasuredPlan", "MeasuredWorld", "MeasureSettings", "measure_world", "measure_device"]

REFERENCE_PLAN = "embnb DP"  # each plan's step minus its, round by round
CLOCKS = {"cpu": "cpu", "cuda": "wall"}  # per device type: the clock its kernels' time is read on


@dataclass(frozen=True)
class MeasuredPlan:
    """One plan: torchrec's rating (ms, its estimate of the slowest rank) and, if it has a plan,
    each rank's measured lookups (forward + backward with the fused optimizer) and step (lookups +
    dense), ms on the world's clock."""

    name: str
    rating_ms: float
    note: str
    shape: dict[str, int] | None = None
    step_ms: float | None = None  # the critical path: the slowest rank's step (median)
    lookup_ms: float | None = None  # the slowest rank's lookups
    critical_rank: int | None = None
    step_wall_ms: float | None = None
    lookup_per_rank_ms: list[float] | None = None
    estimated_per_rank_ms: list[float] | None = None  # torchrec's total per rank
    computed_comms_per_rank_ms: list[float] | None = None  # from counted bytes, not measured
    uvm_tables: int = 0  # tables with rows in DDR (fused_uvm, fused_uvm_caching): GPU-only kernels
    step_ms_repeats: list[float] | None = None  # per repeat; a planner's plan: per interleaved round
    # its step minus REFERENCE_PLAN's, round by round (`Difference.as_dict`); None: not paired
    minus_paired: dict[str, float] | None = None

    @property
    def measured(self) -> bool:
        return self.step_ms is not None

    @property
    def verdict(self) -> str | None:
        """Against REFERENCE_PLAN round by round: "slower", "faster" or "not told apart"."""
        paired = self.minus_paired
        return None if paired is None else verdict(paired["ci_low"], paired["ci_high"])


@dataclass(frozen=True)
class MeasureSettings:
    """How each plan is measured rank by rank (`embnb.steptime.measure_plan`)."""

    local_batch_size: int  # samples per rank
    repeats: int = 3  # interleaved rounds, each measuring every planner's plan once
    poor_repeats: int = 1  # timed steps of each poor plan, measured after the rounds
    warmup: int = 1
    threads: int = 1  # intra-op threads while a rank is measured
    hidden: tuple[int, ...] = (128,)  # the dense MLP's widths
    timeout_s: float = 60.0  # each planner's time limit
    seed: int = 0  # of the global batch
    device: str = "cpu"  # "cpu" or "cuda": the topology's compute_device and where kernels run


@dataclass(frozen=True)
class MeasuredWorld:
    world_size: int
    plans: list[MeasuredPlan]
    settings: MeasureSettings
    hosts: int = 1  # of its topology (`hosts_of`)
    device: str = "cpu"  # where the kernels ran, and the topology's compute_device
    device_name: str = ""  # the CPU or the GPU's name (`embnb.timing.machine_name`)
    clock: str = "cpu"  # "cpu" (thread CPU time) or "wall" (synchronized, on a GPU)
    device_note: str = ""  # why the kernels ran elsewhere than asked (`measure_device`)
    seconds: float = field(default=math.nan)  # planning and measuring took

    def measured(self, planners_only: bool = False) -> list[MeasuredPlan]:
        """The plans measured; `planners_only`: those a planner made (not the poor ones)."""
        return [p for p in self.plans if p.measured and not (planners_only and p.note == POOR)]

    def table(self) -> pd.DataFrame:
        """One row per plan: rating, measured step and lookups, slowest rank, computed comms, and
        against embnb DP round by round (mean and 95% interval of the difference, verdict)."""
        rows = []
        for plan in self.plans:
            paired = plan.minus_paired or {}
            rows.append(
                {
                    "plan": plan.name,
                    "poor": plan.note == POOR,
                    "torchrec rating, ms": plan.rating_ms,
                    "step, ms": plan.step_ms,
                    "lookups, ms": plan.lookup_ms,
                    "slowest rank": plan.critical_rank,
                    "computed comms, ms": max(plan.computed_comms_per_rank_ms or [math.nan]),
                    "minus embnb DP, ms": paired.get("mean"),
                    "ci low": paired.get("ci_low"),
                    "ci high": paired.get("ci_high"),
                    "verdict": plan.verdict or ("" if plan.measured else plan.note[:60]),
                }
            )
        return pd.DataFrame(rows).set_index("plan")


def measure_device(asked: str) -> tuple[str, str]:
    """(device, note) for a notebook's `device` parameter: "cpu" runs on the CPU; "cuda" and
    "auto" run FBGEMM's CUDA TBEs where a GPU and fbgemm_gpu's CUDA build are here, else on the
    CPU with a note saying why (the CPU wheel has no CUDA kernels)."""
    if asked not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device {asked!r} is not one of ['auto', 'cpu', 'cuda']")
    if asked == "cpu":
        return "cpu", ""
    if fbgemm_cuda_available():
        return "cuda", ""
    why = "no CUDA GPU here" if not torch.cuda.is_available() else "this fbgemm_gpu has no CUDA kernels"
    return "cpu", f"device={asked!r}: {why}, so the CUDA measurement is skipped and the plans run on the CPU"


def _measured_plan(candidate, topology, times, clock: str) -> MeasuredPlan:
    if times is None:
        return MeasuredPlan(candidate.name, candidate.rating, candidate.note)
    estimate = estimated_per_rank(candidate.options, topology.world_size)
    lookups = [r.lookup.median_s(clock) * 1e3 for r in times.ranks]
    return MeasuredPlan(
        candidate.name, candidate.rating, candidate.note, plan_shape(candidate.options),
        times.critical_path_s(clock) * 1e3, max(lookups), times.critical_rank(clock),
        times.critical_path_s("wall") * 1e3, lookups, [s * 1e3 for s in estimate["total"]],
        [c.computed_seconds(topology) * 1e3 for c in times.comms],
        sum(o.compute_kernel in UVM_KERNELS for o in candidate.options),
        [s * 1e3 for s in times.critical_paths_s(clock)],
    )  # fmt: skip


def _paired(plans: list[MeasuredPlan]) -> list[MeasuredPlan]:
    """Each planner's measured plan with its step minus REFERENCE_PLAN's, round by round (the poor
    plans were not measured in those rounds)."""
    reference = next((p for p in plans if p.name == REFERENCE_PLAN and p.measured), None)
    if reference is None:
        return plans
    return [
        replace(p, minus_paired=paired_difference(p.step_ms_repeats, reference.step_ms_repeats).as_dict())
        if p.measured and p.note != POOR and p is not reference
        else p
        for p in plans
    ]


def measure_world(
    model: Model, world_size: int, settings: MeasureSettings, asked: str = "cpu"
) -> MeasuredWorld:
    """Plan `model` on `world_size` devices (of `measure_device(asked)`) with `candidate_plans`,
    and measure every plan rank by rank on one global batch: the planners' plans in
    `settings.repeats` interleaved rounds (`steptime.measure_plans_interleaved`), each one's step
    paired with embnb DP's round by round, then the poor plans one by one."""
    check_int("world_size", world_size, low=2)
    device, note = measure_device(asked)
    settings = replace(settings, device=device)
    topology = make_topology(world_size, device)
    with Stopwatch() as watch:
        candidates = candidate_plans(model, topology, settings.local_batch_size, timeout_s=settings.timeout_s)
        batch = make_batch(
            model.tables, model.constraints, world_size, settings.local_batch_size, settings.seed
        )
        options = {k: getattr(settings, k) for k in ("threads", "warmup", "hidden")}
        planned = {
            n: c.sharding_plan(topology) for n, c in candidates.items() if c.options and c.note != POOR
        }
        times = measure_plans_interleaved(
            planned, model.tables, batch, settings.repeats, device=device, **options
        )
        for name, candidate in candidates.items():  # slower by far: one by one, not in every round
            if candidate.options and candidate.note == POOR:
                times[name] = measure_plan(
                    candidate.sharding_plan(topology), model.tables, batch, device=device,
                    repeats=settings.poor_repeats, **options,
                )  # fmt: skip
    for got in times.values():
        if isinstance(got, ValueError):  # every candidate's sharding types replay: a bug if not
            raise got
    clock = CLOCKS[device]
    plans = _paired([_measured_plan(c, topology, times.get(n), clock) for n, c in candidates.items()])
    return MeasuredWorld(
        world_size,
        plans,
        settings,
        hosts_of(topology),
        device,
        machine_name(device),
        clock,
        note,
        watch.wall_s,
    )

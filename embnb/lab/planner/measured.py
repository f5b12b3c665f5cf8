"""Notebook 03's measured section: the candidate plans (`candidates`) of one
model on a topology of the measuring device, each run rank by rank with real kernels
(`embnb.steptime.measure_plan`), beside torchrec's estimates.

On a CPU the primary clock is each rank's thread CPU time at one intra-op
thread: on a shared machine other processes stretch wall time, not the CPU
time the rank's kernels used. On a GPU (FBGEMM's CUDA TBEs) it is wall time
with the device synchronized at each phase's edges (`steptime.measure`): the
calling thread's CPU time there counts launches, not kernels.
Communication is not measured: its time per rank is computed from the
counted bytes (`steptime.comms.LINK_MODEL`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from importlib.metadata import version

import torch
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from embnb._checks import check_int
from embnb.lab.planner.candidates import POOR, candidate_plans, estimated_per_rank, plan_shape
from embnb.lab.planner.comparison import UVM_KERNELS
from embnb.lab.planner.hosts import hosts_of
from embnb.lab.planner.models import Model
from embnb.lab.planner.planning import plain
from embnb.lab.plotting import new_figure
from embnb.metrics import spearman
from embnb.planner.topology import make_topology
from embnb.steptime import StepTimes, make_batch, measure_plan, measure_plans_interleaved
from embnb.steptime.kernels import fbgemm_cuda_available
from embnb.timing import Stopwatch, machine_name, paired_difference, verdict

__all__ = [
    "MeasuredPlan",
    "MeasuredWorld",
    "MeasureSettings",
    "measure_world",
    "MeasuredWorlds",
    "measure_worlds",
    "measured_vs_estimated",
    "estimate_over_measured",
    "CLOCK",
    "REFERENCE_PLAN",
    "MeasureDevice",
    "measure_device",
]

CLOCK = "cpu"  # on a CPU: thread CPU time (module docstring)
REFERENCE_PLAN = "embnb DP"  # each plan's step minus its, round by round
CLOCKS = {"cpu": "cpu", "cuda": "wall"}  # per device type: the clock its kernels' time is read on


@dataclass(frozen=True)
class MeasuredPlan:
    """One plan: torchrec's rating (ms, its estimate of the slowest rank) and,
    if it has a plan, each rank's measured lookups (forward + backward with
    the fused optimizer) and whole step (lookups + dense), thread CPU ms."""

    name: str
    rating_ms: float
    note: str
    shape: dict[str, int] | None = None
    step_ms: float | None = None  # the critical path: the slowest rank's step
    lookup_ms: float | None = None  # the slowest rank's lookups
    critical_rank: int | None = None
    step_wall_ms: float | None = None
    lookup_per_rank_ms: list[float] | None = None
    estimated_per_rank_ms: list[float] | None = None  # torchrec's total per rank
    computed_comms_per_rank_ms: list[float] | None = None  # from counted bytes, not measured
    uvm_tables: int = 0  # tables with rows in DDR (fused_uvm, fused_uvm_caching): GPU-only kernels
    # the slowest rank's step per repeat: for the planners' plans each repeat is an interleaved round
    step_ms_repeats: list[float] | None = None
    # its step minus REFERENCE_PLAN's, round by round: `Difference.as_dict` (None for REFERENCE_PLAN itself)
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
class MeasuredWorld:
    world_size: int
    plans: list[MeasuredPlan]
    settings: MeasureSettings
    hosts: int = 1  # of its topology (`hosts_of`)
    device: str = "cpu"  # where the kernels ran, and the topology's compute_device
    device_name: str = ""  # the CPU or the GPU's name (`embnb.timing.machine_name`)
    clock: str = CLOCK  # "cpu" (thread CPU time) or "wall" (synchronized, on a GPU)

    def measured(self, planners_only: bool = False) -> list[MeasuredPlan]:
        """The plans measured; `planners_only`: those a planner made (not the poor ones)."""
        return [p for p in self.plans if p.measured and not (planners_only and p.note == POOR)]

    def spearman(self, key: str = "step_ms", planners_only: bool = False) -> float:
        """Spearman's rank correlation across measured plans of `key` and
        torchrec's rating (NaN with fewer than two plans)."""
        plans = self.measured(planners_only)
        if len(plans) < 2:
            return math.nan
        return spearman([getattr(p, key) for p in plans], [p.rating_ms for p in plans])

    def winner(self, key: str = "step_ms", planners_only: bool = False) -> MeasuredPlan:
        return min(self.measured(planners_only), key=lambda p: getattr(p, key))

    def to_json(self) -> dict:
        return plain(
            {
                **asdict(self),
                "plans": {p.name: asdict(p) for p in self.plans},
                "spearman_step": self.spearman("step_ms"),
                "spearman_lookup": self.spearman("lookup_ms"),
                "spearman_step_planners": self.spearman("step_ms", planners_only=True),
                "winner": self.winner().name,
                "fastest_planner": self.winner(planners_only=True).name,
            }
        )


@dataclass(frozen=True)
class MeasureDevice:
    """Where section 10's kernels run: `device` ("cpu" or "cuda"), the clock
    read there, and `note`: why it is not the device asked for ("" if it is)."""

    device: str
    clock: str
    note: str = ""


def measure_device(asked: str) -> MeasureDevice:
    """The device to measure on for a notebook's `device` parameter: "cpu" runs
    on the CPU; "cuda" and "auto" run FBGEMM's CUDA TBEs where a GPU and
    fbgemm_gpu's CUDA build are here, else on the CPU with a note saying why
    (the CPU wheel has no CUDA kernels; a dry-run topology needs none)."""
    if asked not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device {asked!r} is not one of ['auto', 'cpu', 'cuda']")
    if asked == "cpu":
        return MeasureDevice("cpu", CLOCKS["cpu"])
    if fbgemm_cuda_available():
        return MeasureDevice("cuda", CLOCKS["cuda"])
    why = "no CUDA GPU here" if not torch.cuda.is_available() else "this fbgemm_gpu has no CUDA kernels"
    note = f"device={asked!r}: {why}, so the CUDA measurement is skipped and the plans run on the CPU"
    return MeasureDevice("cpu", CLOCKS["cpu"], note)


def _measured_plan(candidate, topology, times: StepTimes | None, clock: str) -> MeasuredPlan:
    if times is None:
        return MeasuredPlan(candidate.name, candidate.rating, candidate.note)
    estimate = estimated_per_rank(candidate.options, topology.world_size)
    lookups = [r.lookup.median_s(clock) * 1e3 for r in times.ranks]
    return MeasuredPlan(
        candidate.name,
        candidate.rating,
        candidate.note,
        plan_shape(candidate.options),
        times.critical_path_s(clock) * 1e3,
        max(lookups),
        times.critical_rank(clock),
        times.critical_path_s("wall") * 1e3,
        lookups,
        [s * 1e3 for s in estimate["total"]],
        [c.computed_seconds(topology) * 1e3 for c in times.comms],
        sum(o.compute_kernel in UVM_KERNELS for o in candidate.options),
        [s * 1e3 for s in times.critical_paths_s(clock)],
    )


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


@dataclass(frozen=True)
class MeasureSettings:
    """How each plan is measured rank by rank (`embnb.steptime.measure_plan`)."""

    local_batch_size: int  # samples per rank
    repeats: int = 2  # rounds, each measuring every planner's plan once (a timed step after the warm-ups)
    warmup: int = 1
    threads: int = 1  # intra-op threads while a rank is measured
    hidden: tuple[int, ...] = (128,)  # the dense MLP's widths
    timeout_s: float = 60.0  # each planner's time limit
    seed: int = 0  # of the global batch
    device: str = "cpu"  # "cpu" or "cuda": the topology's compute_device and where kernels run


def measure_world(model: Model, world_size: int, settings: MeasureSettings) -> MeasuredWorld:
    """Plan `model` on `world_size` devices of `settings.device` (`measure_device` picks it) with
    `candidate_plans`, and measure every plan rank by rank on one global batch: the planners' plans
    in interleaved rounds (`steptime.measure_plans_interleaved`), each one's step paired with
    embnb DP's round by round, then the poor plans one by one."""
    check_int("world_size", world_size, low=2)
    device = settings.device
    if device not in CLOCKS:
        raise ValueError(f"device {device!r} is not one of {sorted(CLOCKS)} (measure_device resolves 'auto')")
    topology = make_topology(world_size, device)
    batch_size = settings.local_batch_size
    candidates = candidate_plans(model, topology, batch_size, timeout_s=settings.timeout_s)
    batch = make_batch(model.tables, model.constraints, world_size, batch_size, settings.seed)
    options = {k: getattr(settings, k) for k in ("threads", "warmup", "hidden")}
    # The planners' plans in interleaved rounds, to pair them; the poor ones (2-4x slower, one of
    # them a dense update of every table on every rank) after, plan by plan: rebuilding their
    # kernels every round would take minutes for nothing a pairing could add.
    planned = {n: c.sharding_plan(topology) for n, c in candidates.items() if c.options and c.note != POOR}
    times = measure_plans_interleaved(
        planned, model.tables, batch, settings.repeats, device=device, **options
    )
    for name, candidate in candidates.items():
        if candidate.options and candidate.note == POOR:
            times[name] = measure_plan(
                candidate.sharding_plan(topology), model.tables, batch, device=device,
                repeats=settings.repeats, **options,
            )  # fmt: skip
    for got in times.values():
        if isinstance(got, ValueError):  # every candidate's sharding types replay: a bug if not
            raise got
    clock = CLOCKS[device]
    plans = _paired([_measured_plan(c, topology, times.get(name), clock) for name, c in candidates.items()])
    return MeasuredWorld(
        world_size, plans, settings, hosts_of(topology), device, machine_name(device), CLOCKS[device]
    )


@dataclass(frozen=True)
class MeasuredWorlds:
    """Notebook 03's measured section: one `MeasuredWorld` per world size of
    one model, and how long planning and measuring them took."""

    num_tables: int
    worlds: list[MeasuredWorld]
    seconds: float
    device_note: str = ""  # why the kernels ran elsewhere than asked (`MeasureDevice.note`)

    def to_json(self) -> dict:
        first = self.worlds[0]
        return {
            "clock": first.clock,
            "device": first.device,
            "device_name": first.device_name,
            "device_note": self.device_note,
            "torchrec_version": version("torchrec"),
            "num_tables": self.num_tables,
            "seconds": self.seconds,
            "worlds": {str(world.world_size): world.to_json() for world in self.worlds},
        }


def measure_worlds(
    model: Model, world_sizes: Sequence[int], settings: MeasureSettings, where: MeasureDevice | None = None
) -> MeasuredWorlds:
    """`measure_world` at each of `world_sizes` on `where` (default: the CPU)."""
    if not world_sizes:
        raise ValueError("world_sizes is empty: give at least one world size to measure")
    where = where or measure_device("cpu")
    settings = replace(settings, device=where.device)
    with Stopwatch() as watch:
        worlds = [measure_world(model, w, settings) for w in world_sizes]
    return MeasuredWorlds(len(model.tables), worlds, watch.wall_s, where.note)


MARKERS = "os^DvP<>"  # one per plan: plans rated alike overlap, their shapes still show
PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 0.5, 2, 30: not 5x10^-1


def measured_vs_estimated(worlds: Sequence[MeasuredWorld]) -> Figure:
    """Top: per plan, the measured critical path (filled: the step; hollow: the lookups) against
    torchrec's rating. Bottom: per rank, the measured lookups against torchrec's estimated total
    (ranks with no shard left out: a log axis has no 0). Log axes; one colour and marker per plan."""
    if not worlds:
        raise ValueError("worlds is empty: nothing to plot")
    names = list(dict.fromkeys(p.name for w in worlds for p in w.measured()))
    styles = {name: dict(color=f"C{i}", marker=MARKERS[i % len(MARKERS)]) for i, name in enumerate(names)}
    fig = new_figure(4.2 * len(worlds) + 2.2, 7.4)
    axes = fig.subplots(2, len(worlds), squeeze=False)
    for (top, bottom), world in zip(axes.T, worlds):
        skipped, clock = 0, _clock_name(world.clock)
        for plan in world.measured():
            style = styles[plan.name]
            top.scatter(plan.rating_ms, plan.step_ms, s=40, label=plan.name, zorder=3, **style)
            hollow = dict(facecolors="none", edgecolors=style["color"], marker=style["marker"])
            top.scatter(plan.rating_ms, plan.lookup_ms, s=40, zorder=3, **hollow)
            pairs = [
                (e, m) for e, m in zip(plan.estimated_per_rank_ms, plan.lookup_per_rank_ms) if e > 0 and m > 0
            ]
            skipped += len(plan.lookup_per_rank_ms) - len(pairs)
            if pairs:
                bottom.scatter(*zip(*pairs), s=14, alpha=0.7, **style)
        top.set(xlabel="torchrec's estimated rating, ms", ylabel=f"measured critical path, ms ({clock})")
        top.set_title(f"W = {world.world_size}: plan by plan\n(filled: step; hollow: lookups)", fontsize=9)
        bottom.set(
            xlabel="torchrec's estimated total of the rank, ms",
            ylabel=f"measured lookups of the rank, ms ({clock})",
        )
        bottom.set_title(
            f"W = {world.world_size}: rank by rank ({skipped} ranks with no shard left out)", fontsize=9
        )
        for ax in (top, bottom):
            ax.set(xscale="log", yscale="log")
            ax.grid(True, which="major", alpha=0.3)
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
                axis.set_major_formatter(PLAIN)
                axis.set_minor_formatter(NullFormatter())
    legend = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(legend.values(), legend.keys(), loc="outside right center", fontsize=8, title="plan")
    where = worlds[0]
    fig.suptitle(f"Measured on {where.device.upper()} ({where.device_name}) against torchrec's estimates")
    return fig


def _clock_name(clock: str) -> str:
    return "thread CPU time" if clock == "cpu" else "wall time, synchronized"


def estimate_over_measured(world: MeasuredWorld) -> list[float]:
    """Per measured plan, torchrec's rating over the measured lookups' critical path."""
    return [
        p.rating_ms / p.lookup_ms for p in world.measured() if p.lookup_ms and not math.isnan(p.rating_ms)
    ]

"""Rank by rank: each rank's own work run with real kernels on this device,
one rank after another, warmed up and repeated.

Per rank and repeat, four phases are timed by `embnb.timing.time_phase`: the lookups' forward
(every TBE of the rank), their backward (FBGEMM's fused optimizer runs inside it; the dense
kernel's SGD step after it), the dense part's forward and its backward. On a CPU each phase records
wall time and the calling thread's CPU time: at `threads=1` all of the kernels' compute, which other
processes sharing the cores do not stretch. On a GPU the "wall" clock is the phase's time between
two CUDA events and the "cpu" clock the time to enqueue it (a synchronized thread's CPU time would
count synchronize's spin-wait).

    times = measure_plan(plan, model.tables, batch, threads=1)
    times.critical_rank()          # the slowest rank (median compute)
    times.ranks[3].phases["lookup_forward"].median_s
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from embnb._checks import check_choice, check_int
from embnb.steptime.comms import RankComms
from embnb.steptime.kernels import DEFAULT_OPTIMIZER, DenseLookup, lookup_module, make_mlp
from embnb.steptime.work import RankWork
from embnb.timing import machine_name, time_phase

__all__ = [
    "PHASES",
    "CPU_CLOCK",
    "Timing",
    "RankTime",
    "StepTimes",
    "StepOptions",
    "measure_rank",
    "lookup_steps",
    "measure_ranks",
    "join_rounds",
    "DEFAULT_HIDDEN",
]

PHASES = ("lookup_forward", "lookup_backward", "dense_forward", "dense_backward")
CPU_CLOCK = {"cpu": "thread", "cuda": "enqueue"}  # what Timing.cpu_s holds on each device type
DEFAULT_HIDDEN = (512, 256)  # the dense MLP's hidden widths


@dataclass(frozen=True)
class Timing:
    """Seconds per repeat: wall (CUDA events on a GPU) and the calling thread's CPU time (the
    enqueue time on a GPU: `CPU_CLOCK`)."""

    wall_s: list[float]
    cpu_s: list[float]

    def values(self, clock: str = "wall") -> list[float]:
        return self.wall_s if check_choice("clock", clock, ("wall", "cpu")) == "wall" else self.cpu_s

    def median_s(self, clock: str = "wall") -> float:
        return statistics.median(self.values(clock))

    def range_s(self, clock: str = "wall") -> tuple[float, float]:
        values = self.values(clock)
        return min(values), max(values)

    @staticmethod
    def added(timings: Sequence[Timing]) -> Timing:
        """Repeat by repeat, the sum of `timings` (phases of one step)."""
        return Timing(
            [sum(v) for v in zip(*(t.wall_s for t in timings))],
            [sum(v) for v in zip(*(t.cpu_s for t in timings))],
        )


@dataclass(frozen=True)
class RankTime:
    """One rank's phases; `compute` is their sum per repeat. `groups`: its TBEs, one
    `LookupGroup.describe()` each (sharding type, kernel type, shards), in the order they ran."""

    rank: int
    phases: dict[str, Timing]
    num_ids: int  # ids its lookups read
    groups: tuple[dict, ...] = ()
    bytes_read: int = 0  # of table rows its lookups' forward gathers (`RankWork.bytes_read`)

    @property
    def compute(self) -> Timing:
        return Timing.added(list(self.phases.values()))

    @property
    def lookup(self) -> Timing:
        return Timing.added([self.phases["lookup_forward"], self.phases["lookup_backward"]])


@dataclass(frozen=True)
class StepTimes:
    """Every rank's measured phases, how they were measured, and each rank's
    collectives (bytes counted; times only computed: `comms.LINK_MODEL`)."""

    ranks: list[RankTime]
    comms: list[RankComms]
    device: str
    threads: int
    warmup: int
    repeats: int
    machine: str
    notes: list[str] = field(default_factory=list)

    def critical_rank(self, clock: str = "wall") -> int:
        """The slowest rank: the largest median compute time."""
        medians = [r.compute.median_s(clock) for r in self.ranks]
        return max(range(len(medians)), key=medians.__getitem__)

    def critical_path_s(self, clock: str = "wall") -> float:
        return self.ranks[self.critical_rank(clock)].compute.median_s(clock)

    def critical_paths_s(self, clock: str = "wall", phase: str = "compute") -> list[float]:
        """Per repeat, the slowest rank's `phase` ("compute": the step; "lookup"): with
        `join_rounds`, one value per round."""
        return [max(getattr(r, phase).values(clock)[i] for r in self.ranks) for i in range(self.repeats)]


def _lookup_inputs(work: RankWork, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each TBE's (indices, offsets): its ids, and where each bag starts, then the end."""
    offsets = [nn.functional.pad(g.lengths.cumsum(0), (1, 0)) for g in work.groups]
    return [(g.ids.to(device), o.to(device)) for g, o in zip(work.groups, offsets)]


@dataclass(frozen=True)
class StepOptions:
    """How each rank's step is measured: on `device` at `threads` intra-op
    threads, `warmup` untimed steps then `repeats` timed ones, the tables
    trained by `optimizer` at `learning_rate`, a dense MLP of `hidden` layers."""

    device: torch.device | str = "cpu"
    threads: int = 1
    warmup: int = 2
    repeats: int = 5
    optimizer: str = DEFAULT_OPTIMIZER
    learning_rate: float = 0.01
    hidden: Sequence[int] = DEFAULT_HIDDEN

    def __post_init__(self) -> None:
        check_int("threads", self.threads, low=1)
        check_int("warmup", self.warmup, low=0)
        check_int("repeats", self.repeats, low=1)


def _output_grads(work: RankWork, device: torch.device) -> list[torch.Tensor]:
    """A gradient of each TBE's pooled output (bags x pooled dim), as the dense part would send back."""
    return [
        torch.randn(len(g.lengths) // len(g.feature_shard), g.pooled_dim, device=device) for g in work.groups
    ]


def lookup_steps(
    works: Sequence[RankWork], options: StepOptions = StepOptions(), seed: int = 0
) -> list[Callable[[], None]]:
    """One rank's lookups, forward and backward (the fused optimizer inside), as one call per work
    of `works`: the same shards (one plan's rank) fed each its own ids, e.g. at several batch sizes.
    The TBEs are built once, from `works[0]`, and shared; every input is built here, so a call runs
    only the kernels. Raises ValueError unless every work has the same TBE groups."""
    if not works:
        raise ValueError("works is empty: pass one RankWork per batch")
    shapes = [[(g.sharding_type, g.compute_kernel, g.shards) for g in w.groups] for w in works]
    if any(shape != shapes[0] for shape in shapes):
        raise ValueError("the works hold different TBE groups: pass one plan's rank at several batches")
    device = torch.device(options.device)
    torch.manual_seed(seed)
    modules = [lookup_module(g, device, options.optimizer, options.learning_rate) for g in works[0].groups]

    def step(inputs, grads) -> None:
        _backward(modules, [m(*x) for m, x in zip(modules, inputs)], grads)

    return [partial(step, _lookup_inputs(w, device), _output_grads(w, device)) for w in works]


def measure_rank(work: RankWork, options: StepOptions = StepOptions(), seed: int = 0) -> RankTime:
    """Time one rank's work (module docstring); its modules are built here
    and freed on return, so ranks measured one after another share memory."""
    device = torch.device(options.device)
    torch.manual_seed(seed)
    modules = [lookup_module(g, device, options.optimizer, options.learning_rate) for g in work.groups]
    inputs = _lookup_inputs(work, device)
    dense = make_mlp(work.dense_width, options.hidden).to(device)
    dense_input = torch.randn(work.dense_samples, work.dense_width, device=device, requires_grad=True)
    grads = _output_grads(work, device)
    record = {phase: Timing([], []) for phase in PHASES}

    def run(phase: str, fn: Callable[[], object], keep: bool):
        out = []
        timed = time_phase(lambda: out.append(fn()), device)  # CUDA events on a GPU
        if keep:
            record[phase].wall_s.append(timed.seconds)
            record[phase].cpu_s.append(timed.enqueue_s if device.type == "cuda" else timed.thread_s)
        return out[0]

    for step in range(options.warmup + options.repeats):
        keep = step >= options.warmup
        outputs = run("lookup_forward", lambda: [m(*x) for m, x in zip(modules, inputs)], keep)
        run("lookup_backward", lambda out=outputs: _backward(modules, out, grads), keep)
        loss = run("dense_forward", lambda: dense(dense_input).sum(), keep)
        run("dense_backward", loss.backward, keep)
        dense.zero_grad(set_to_none=True)
        dense_input.grad = None
    groups = tuple(group.describe() for group in work.groups)
    return RankTime(work.rank, record, work.num_ids, groups, work.bytes_read)


def _backward(modules, outputs, grads) -> None:
    with warnings.catch_warnings():
        # fbgemm 1.8.0's CPU dense TBE backprops through torch's fallback and
        # warns once; the gradient it gives is the op's (torchrec's dense kernel runs the same)
        warnings.filterwarnings("ignore", "fbgemm::dense_embedding_codegen_lookup_function")
        for module, output, grad in zip(modules, outputs, grads):
            output.backward(grad)
            if isinstance(module, DenseLookup):
                module.step()


def measure_ranks(
    works: Callable[[int], RankWork],
    world_size: int,
    comms_of: Callable[[int, int], RankComms] | None = None,
    options: StepOptions = StepOptions(),
) -> StepTimes:
    """`measure_rank(works(rank), options)` for every rank in turn at
    `options.threads` intra-op threads (put back afterwards); with
    `comms_of(rank, dense_parameters)`, every rank's collectives too."""
    check_int("world_size", world_size, low=1)
    before = torch.get_num_threads()
    torch.set_num_threads(options.threads)
    ranks, comms = [], []
    try:
        for rank in range(world_size):
            work = works(rank)
            ranks.append(measure_rank(work, options))
            if comms_of is not None:
                dense = sum(p.numel() for p in make_mlp(work.dense_width, options.hidden).parameters())
                comms.append(comms_of(rank, dense))
    finally:
        torch.set_num_threads(before)
    device = str(torch.device(options.device))
    return StepTimes(
        ranks, comms, device, options.threads, options.warmup, options.repeats, machine_name(options.device)
    )


def join_rounds(rounds: Sequence[StepTimes]) -> StepTimes:
    """Rounds of one plan's measurement (each its own `measure_ranks` call, e.g. one repeat per
    round, interleaved with other plans' rounds so that a machine that slows mid-run slows every
    plan alike) as one StepTimes: each rank's repeats in round order; `warmup` is each round's."""
    if not rounds:
        raise ValueError("rounds is empty: pass one StepTimes per round")
    first = rounds[0]
    shapes = [(len(times.ranks), times.device, times.threads, times.warmup) for times in rounds]
    for index, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise ValueError(
                f"rounds[{index}] has (ranks, device, threads, warmup) {shape}, rounds[0] {shapes[0]}: "
                "rounds of one plan only"
            )
    ranks = []
    for position, rank in enumerate(first.ranks):
        parts = {phase: [times.ranks[position].phases[phase] for times in rounds] for phase in rank.phases}
        phases = {
            phase: Timing([v for t in timings for v in t.wall_s], [v for t in timings for v in t.cpu_s])
            for phase, timings in parts.items()
        }
        ranks.append(RankTime(rank.rank, phases, rank.num_ids, rank.groups, rank.bytes_read))
    notes = [*first.notes, f"{len(rounds)} rounds, interleaved with other plans' (join_rounds)"]
    repeats = sum(times.repeats for times in rounds)
    return StepTimes(
        ranks, first.comms, first.device, first.threads, first.warmup, repeats, first.machine, notes
    )

"""One world's candidate plans measured rank by rank, the one loop notebook 03a, `python -m
embnb.bench steptime` and `python -m embnb.bench calibrate` run.

The plans of `plans` run in interleaved rounds: each round measures every plan once (`warmup`
untimed steps, then one timed step, its kernels built anew), so a machine that slows mid-run slows
every plan alike and round i of two plans is one pair: each plan's step minus the reference's,
round by round, is a paired difference (`embnb.timing.paired_difference`: mean and 95%
t-interval). Plans of `alone` (slow ones, e.g. built to be slow) run after the rounds,
`alone_repeats` timed steps each, unpaired.

    world = measure_world({"a": plan_a, "b": plan_b}, model.tables, batch, rounds=5, reference="a")
    world.plans["b"].minus_reference.ci_low, world.told_apart()
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from embnb._checks import check_choice, check_int
from embnb.steptime.batch import GlobalBatch
from embnb.steptime.kernels import fbgemm_cuda_available
from embnb.steptime.measure import StepOptions, StepTimes, join_rounds, measure_ranks
from embnb.steptime.step import plan_ranks
from embnb.timing import Difference, Stopwatch, machine_name, paired_difference, verdict

__all__ = ["CLOCKS", "PlanTimes", "WorldTimes", "measure_world", "kernel_device"]

# The clock a device's kernels are read on: on a CPU the rank thread's CPU time at one thread (other
# processes on a shared machine stretch wall time, not it); on a GPU the time between CUDA events.
CLOCKS = {"cpu": "cpu", "cuda": "wall"}


@dataclass(frozen=True)
class PlanTimes:
    """One plan of a world: every rank's measured phases (`times`; None where it could not run,
    `error` says why) and, on the world's clock in ms, the slowest rank's step (lookups + dense
    part) and lookups per round (per repeat for a plan measured alone), the rank with the largest
    median step, and its step minus the reference's round by round (None: not paired)."""

    name: str
    times: StepTimes | None = None
    error: str = ""
    interleaved: bool = True  # measured in the rounds (else alone, after them)
    step_ms: list[float] = field(default_factory=list)
    lookup_ms: list[float] = field(default_factory=list)
    critical_rank: int | None = None
    minus_reference: Difference | None = None

    @property
    def measured(self) -> bool:
        return self.times is not None

    @property
    def median_step_ms(self) -> float | None:
        return statistics.median(self.step_ms) if self.step_ms else None

    @property
    def verdict(self) -> str | None:
        """Against the reference round by round: "slower", "faster" or "not told apart"."""
        paired = self.minus_reference
        return None if paired is None else verdict(paired.ci_low, paired.ci_high)


@dataclass(frozen=True)
class WorldTimes:
    """A world's plans (in the order given: the rounds' plans, then those measured alone)."""

    plans: dict[str, PlanTimes]
    reference: str | None  # the plan every other round's plan is paired with
    rounds: int
    clock: str  # "cpu" (thread CPU time) or "wall"
    device: str
    machine: str  # `embnb.timing.machine_name`
    seconds: float  # measuring took

    def told_apart(self) -> dict[str, str]:
        """The paired plans whose interval excludes 0 -> "slower" or "faster" than the reference;
        empty: this machine cannot tell these plans apart from it."""
        return {n: p.verdict for n, p in self.plans.items() if p.verdict in ("slower", "faster")}


def kernel_device(asked: str) -> tuple[str, str]:
    """(device, note) where FBGEMM's TBEs run for `asked` ("auto", "cpu" or "cuda"): "cuda" where
    a GPU and fbgemm_gpu's CUDA build are here, else "cpu" with a note saying why (the
    fbgemm-gpu-cpu wheel has no CUDA kernels). Raises ValueError for another value."""
    if check_choice("device", asked, ("auto", "cpu", "cuda")) == "cpu" or fbgemm_cuda_available():
        return ("cpu", "") if asked == "cpu" else ("cuda", "")
    why = "no CUDA GPU here" if not torch.cuda.is_available() else "this fbgemm_gpu has no CUDA kernels"
    return "cpu", f"device={asked!r}: {why}, so the CUDA measurement is skipped and the plans run on the CPU"


def _measure(ranks, **options) -> StepTimes | str:
    """`measure_ranks` of `ranks` (a thunk of `plan_ranks`' result, kept over rounds by the caller)."""
    try:
        return measure_ranks(*ranks(), options=StepOptions(**options))
    except (RuntimeError, ValueError) as error:  # one plan that cannot run must not lose the others
        return f"not measured: {type(error).__name__}: {str(error).splitlines()[0][:300]}"


def _plan_times(name: str, got: StepTimes | str, clock: str, interleaved: bool) -> PlanTimes:
    if isinstance(got, str):
        return PlanTimes(name, error=got, interleaved=interleaved)
    step = [s * 1e3 for s in got.critical_paths_s(clock)]
    lookup = [s * 1e3 for s in got.critical_paths_s(clock, "lookup")]
    return PlanTimes(name, got, "", interleaved, step, lookup, got.critical_rank(clock))


def measure_world(
    plans: Mapping[str, ShardingPlan],
    tables: Sequence[EmbeddingBagConfig],
    batch: GlobalBatch,
    rounds: int,
    *,
    reference: str | None = None,
    alone: Mapping[str, ShardingPlan] | None = None,
    alone_repeats: int = 1,
    **options: Any,
) -> WorldTimes:
    """Every plan of one world (`batch.world_size` ranks) rank by rank (module docstring).

    Args:
        plans: name -> torchrec ShardingPlan of an EmbeddingBagCollection of `tables`, measured in
            `rounds` interleaved rounds.
        reference: a name of `plans` every other measured plan is paired with (None: no pairing).
        alone: name -> plan, measured after the rounds, `alone_repeats` timed steps each.
        options: `StepOptions`' fields but `repeats` (device, threads, warmup, hidden, ...).

    A plan steptime cannot replay, or that fails to run, keeps its error (`PlanTimes.error`).
    Raises ValueError for rounds or alone_repeats < 1, `repeats` in options, or a reference not
    in `plans`."""
    check_int("rounds", rounds, low=1)
    check_int("alone_repeats", alone_repeats, low=1)
    if "repeats" in options:
        raise ValueError("repeats: one per round here; ask for `rounds` (or `alone_repeats`) instead")
    if reference is not None and reference not in plans:
        raise ValueError(f"reference {reference!r} is not one of the plans {list(plans)}")
    device = str(torch.device(options.get("device", "cpu")))
    clock = CLOCKS[torch.device(device).type]
    # each plan's ranks (works, collectives) built once over the rounds
    ranks = {n: functools.cache(functools.partial(plan_ranks, p, tables, batch)) for n, p in plans.items()}
    with Stopwatch() as watch:
        got: dict[str, Any] = {name: [] for name in plans}
        for _ in range(rounds):
            for name in plans:
                if not isinstance(got[name], str):
                    times = _measure(ranks[name], repeats=1, **options)
                    got[name] = times if isinstance(times, str) else [*got[name], times]
        ranks.clear()
        alone_got = {
            n: _measure(functools.partial(plan_ranks, p, tables, batch), repeats=alone_repeats, **options)
            for n, p in (alone or {}).items()
        }
    measured = {
        n: _plan_times(n, g if isinstance(g, str) else join_rounds(g), clock, True) for n, g in got.items()
    }
    base = measured.get(reference)
    if base is not None and base.measured:
        measured = {
            n: p
            if n == reference or not p.measured
            else replace(p, minus_reference=paired_difference(p.step_ms, base.step_ms))
            for n, p in measured.items()
        }
    measured |= {n: _plan_times(n, g, clock, False) for n, g in alone_got.items()}
    return WorldTimes(measured, reference, rounds, clock, device, machine_name(device), watch.wall_s)

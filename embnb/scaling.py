"""How a rank's time scales with its work: the acceptance check a measured comparison passes first.

A comparison of plans or balancing methods means something only where the device is bound by the work
the methods move (FLOPs, bytes), not by a fixed cost per step (kernel launches, Python, the
framework's dispatch) that no method moves. Issue #70's check: run the critical rank at a base
batch and at 4x and 16x it (`SWEEP_FACTORS`), fit

    t(b) = fixed_s + per_work_s * work(b)

by ordinary least squares over the batches (`fit_fixed_cost`: slope = cov(work, t) / var(work),
intercept = mean(t) - slope * mean(work)), and read the fixed share fixed_s / t(b) at each batch, t(b)
the measured median. Methods are compared at the smallest batch whose fixed share is at most
`MAX_FIXED_SHARE[unit]`: 10% for a dense block's FLOPs, 20% for lookups' bytes (issue #70). Where no
batch passes, the result is `NOT_COMPARED`, and the caller reports no comparison. A negative fitted
fixed cost (time growing faster than the work) passes: the work bounds that rank.

The achieved rate is work / t(b) at each batch: FLOP/s for a dense block (its training FLOPs:
`TRAINING_FLOPS_PER_FORWARD` times the forward's), bytes/s for lookups, set beside the device's copy
bandwidth (`copy_bandwidth`, measured on the same device) as `reference_rate`.

    check = check_scaling([32, 128, 512], flops, seconds, "flops")
    check.chosen_batch            # None: overhead-bound
    check.verdict                 # "compared at batch 128" or NOT_COMPARED
    check = measure_scaling({32: step_32, 128: step_128, 512: step_512}, flops, "flops", 3, "cuda")
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from embnb._checks import check_choice, check_int, check_number
from embnb.timing import interleaved_phases

__all__ = [
    "SWEEP_FACTORS",
    "MAX_FIXED_SHARE",
    "NOT_COMPARED",
    "TRAINING_FLOPS_PER_FORWARD",
    "LinearFit",
    "fit_fixed_cost",
    "ScalingCheck",
    "check_scaling",
    "measure_scaling",
    "sweep_clock",
    "sweep_batches",
    "copy_bandwidth",
]

SWEEP_FACTORS = (1, 4, 16)  # the base batch, 4x and 16x it (issue #70)
MAX_FIXED_SHARE = {"flops": 0.10, "bytes": 0.20}  # a dense block's FLOPs; lookups' bytes
NOT_COMPARED = "overhead-bound: not compared"
# Forward and backward of a dense layer: the backward computes two matmuls (input and weight
# gradients) per forward matmul, so a training step is 3x the forward's FLOPs (Kaplan et al.,
# "Scaling Laws for Neural Language Models", 2020, section 2.1: C = 6N per token against 2N forward).
TRAINING_FLOPS_PER_FORWARD = 3


@dataclass(frozen=True)
class LinearFit:
    """t = fixed_s + per_work_s * work (seconds; per_work_s in seconds per unit of work)."""

    fixed_s: float
    per_work_s: float

    def seconds(self, work: float) -> float:
        return self.fixed_s + self.per_work_s * work


def fit_fixed_cost(work: Sequence[float], seconds: Sequence[float]) -> LinearFit:
    """Ordinary least squares of `seconds` on `work` (module docstring). Raises ValueError unless both
    have the same length, >= 2 values, all finite, and `work` holds two different values."""
    if len(work) != len(seconds) or len(work) < 2:
        raise ValueError(
            f"need as many seconds as work values, at least 2; got {len(seconds)} and {len(work)}"
        )
    for name, values in (("work", work), ("seconds", seconds)):
        for i, v in enumerate(values):
            check_number(f"{name}[{i}]", float(v))
    if len(set(work)) < 2:
        raise ValueError(f"work must hold at least two different values to fit a slope, got {list(work)}")
    slope, intercept = statistics.linear_regression(work, seconds)
    return LinearFit(intercept, slope)


@dataclass(frozen=True)
class ScalingCheck:
    """A batch sweep of one rank and its verdict. Per batch (samples per rank, ascending): `work`
    (FLOPs or bytes), `seconds` (the timed repeats); `fit` over the batches' medians; `reference_rate`:
    the device's copy bandwidth in bytes/s for `unit` "bytes" (None if not measured)."""

    unit: str
    batches: list[int]
    work: list[float]
    seconds: list[list[float]]
    fit: LinearFit
    max_fixed_share: float
    reference_rate: float | None = None

    @property
    def median_s(self) -> list[float]:
        return [statistics.median(s) for s in self.seconds]

    @property
    def fixed_share(self) -> list[float]:
        """fixed_s / the measured median at each batch."""
        return [self.fit.fixed_s / t for t in self.median_s]

    @property
    def achieved_rate(self) -> list[float]:
        """work / the measured median at each batch: FLOP/s or bytes/s."""
        return [w / t for w, t in zip(self.work, self.median_s)]

    @property
    def chosen_batch(self) -> int | None:
        """The smallest batch whose fixed share is at most `max_fixed_share`; None: overhead-bound."""
        return next((b for b, s in zip(self.batches, self.fixed_share) if s <= self.max_fixed_share), None)

    @property
    def verdict(self) -> str:
        chosen = self.chosen_batch
        return NOT_COMPARED if chosen is None else f"compared at batch {chosen}"

    def as_dict(self) -> dict[str, Any]:
        """The fields (`fit` as {fixed_s, per_work_s}) and every property, with the rate's unit and
        the achieved rate over `reference_rate` (None if not measured)."""
        rate, reference = self.achieved_rate, self.reference_rate
        return asdict(self) | {
            "median_s": self.median_s,
            "fixed_share": self.fixed_share,
            "achieved_rate": rate,
            "rate_unit": "FLOP/s" if self.unit == "flops" else "bytes/s",
            "of_reference": None if reference is None else [r / reference for r in rate],
            "chosen_batch": self.chosen_batch,
            "verdict": self.verdict,
        }


def check_scaling(
    batches: Sequence[int],
    work: Sequence[float],
    seconds: Sequence[Sequence[float]],
    unit: str,
    max_fixed_share: float | None = None,
    reference_rate: float | None = None,
) -> ScalingCheck:
    """The sweep's fit and verdict (module docstring): `seconds[i]` are the repeats timed at
    `batches[i]` (ascending), `work[i]` that batch's work in `unit` ("flops" or "bytes");
    `max_fixed_share` defaults to `MAX_FIXED_SHARE[unit]`. Raises ValueError on unsorted or
    mismatched batches, an empty repeat list, a non-positive time or a share outside (0, 1]."""
    check_choice("unit", unit, tuple(MAX_FIXED_SHARE))
    if not len(batches) == len(work) == len(seconds):
        raise ValueError(
            f"need one work and one list of seconds per batch, got {len(batches)}, "
            f"{len(work)} and {len(seconds)}"
        )
    batches = [check_int(f"batches[{i}]", b, low=1) for i, b in enumerate(batches)]
    if batches != sorted(set(batches)):
        raise ValueError(f"batches must be ascending and distinct, got {batches}")
    for i, repeats in enumerate(seconds):
        if not repeats or min(repeats) <= 0:
            raise ValueError(f"seconds[{i}] must hold at least one time > 0, got {list(repeats)}")
    share = MAX_FIXED_SHARE[unit] if max_fixed_share is None else max_fixed_share
    check_number("max_fixed_share", share, low=0, high=1, low_open=True)
    work = [float(w) for w in work]
    fit = fit_fixed_cost(work, [statistics.median(s) for s in seconds])
    seconds = [list(map(float, s)) for s in seconds]
    return ScalingCheck(unit, batches, work, seconds, fit, share, reference_rate)


def sweep_clock(device: torch.device | str) -> str:
    """The `PhaseTime` clock a sweep reads: "device" (CUDA events) on a GPU; "thread" (the thread's
    CPU time; a bench at one torch thread) on a CPU, where other processes stretch wall time."""
    return "device" if torch.device(device).type == "cuda" else "thread"


def measure_scaling(
    steps: Mapping[int, Callable[[], Any]],
    work: Sequence[float],
    unit: str,
    repeats: int,
    device: torch.device | str = "cpu",
    max_fixed_share: float | None = None,
    reference_rate: float | None = None,
    warmup: int = 1,
) -> ScalingCheck:
    """`check_scaling` of one rank's step at each batch: `steps[batch]` runs it (inputs built
    beforehand), the batches timed in `repeats` interleaved rounds after `warmup` calls each
    (`embnb.timing.interleaved_phases`, at this thread's torch thread count) on `sweep_clock(device)`;
    `work[i]` is the i-th batch's (ascending order)."""
    check_int("repeats", repeats, low=1)
    batches = sorted(steps)
    times, _ = interleaved_phases(
        {str(b): steps[b] for b in batches}, repeats, warmup, device, threads=torch.get_num_threads()
    )
    clock = sweep_clock(device)
    seconds = [[t.value(clock) for t in times[str(b)]] for b in batches]
    return check_scaling(batches, work, seconds, unit, max_fixed_share, reference_rate)


def sweep_batches(base: int, factors: Sequence[int] = SWEEP_FACTORS) -> list[int]:
    """The sweep's batches: `base` times each factor. Raises ValueError on a base or factor below 1."""
    check_int("base", base, low=1)
    return [base * check_int(f"factors[{i}]", f, low=1) for i, f in enumerate(factors)]


def copy_bandwidth(device: torch.device | str = "cpu", nbytes: int = 1 << 28, repeats: int = 5) -> float:
    """The device's copy bandwidth in bytes/s: a device-to-device copy of `nbytes` (float32; on a GPU
    256 MiB by default, far above its L2 cache), counted as the bytes read plus the bytes written
    (STREAM's "Copy" count, McCalpin 1995), the median over `repeats` copies timed by
    `embnb.timing.time_phase` (CUDA events on a GPU) after one warm-up, at this thread's torch
    thread count. Lookups' achieved bytes/s over this rate says how close they come to the memory.
    Raises ValueError on `nbytes` below 4 or `repeats` below 1."""
    check_int("nbytes", nbytes, low=4)
    check_int("repeats", repeats, low=1)
    source = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    copy = {"copy": lambda: target.copy_(source)}
    times, _ = interleaved_phases(copy, repeats, warmup=1, device=device, threads=torch.get_num_threads())
    return 2 * source.numel() * 4 / statistics.median(t.seconds for t in times["copy"])

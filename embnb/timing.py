"""Timing, the one module the library, the notebooks and the benchmarks use:
a block's wall and thread CPU time with the GPU synchronized (`Stopwatch`),
medians after warm-up, interleaved rounds of several calls, paired ratios and
differences with their spread, and the machine's name to print next to
them. Speeds are only reported as ratios against a peer timed in the same
run (see `python -m embnb.bench`)."""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from embnb.cuda.loader import quiet_cpp_extension

__all__ = [
    "Stopwatch",
    "synchronize",
    "median_seconds",
    "interleaved_seconds",
    "machine_name",
    "Ratio",
    "paired_ratio",
    "Difference",
    "paired_difference",
    "t_quantile_975",
]


def synchronize(device: torch.device | str | None, stream_only: bool = False) -> None:
    """Wait until `device` has run the work queued so far (all its streams, or
    with `stream_only` this thread's current stream); nothing on the CPU."""
    if device is None or torch.device(device).type != "cuda":
        return
    if stream_only:
        torch.cuda.current_stream(device).synchronize()
    else:
        torch.cuda.synchronize(device)


class Stopwatch:
    """A block's wall seconds (`start`, `end`, `wall_s`, perf_counter) and this
    thread's CPU seconds (`cpu_s`), with `device` synchronized at both edges
    so a GPU's queued work counts until it ran (`stream_only`: this thread's
    stream alone, for a thread whose work is on its own stream). Used again,
    it times the new block; `total_s` sums the wall seconds of all of them.

        with Stopwatch(device) as watch:
            step()
        watch.wall_s, watch.cpu_s
    """

    def __init__(self, device: torch.device | str | None = None, stream_only: bool = False) -> None:
        self.device, self.stream_only = device, stream_only
        self.start = self.end = self.wall_s = self.cpu_s = float("nan")
        self.total_s = 0.0

    def __enter__(self) -> Stopwatch:
        synchronize(self.device, self.stream_only)
        self._cpu_ns = time.thread_time_ns()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        synchronize(self.device, self.stream_only)
        self.end = time.perf_counter()
        self.wall_s = self.end - self.start
        self.total_s += self.wall_s
        self.cpu_s = (time.thread_time_ns() - self._cpu_ns) / 1e9


def median_seconds(
    fn: Callable[[], Any],
    repeats: int = 10,
    warmup: int = 2,
    device: torch.device | str = "cpu",
    budget_s: float | None = None,
) -> float:
    """Median wall time of one `fn()` after `warmup` calls, at this thread's
    torch thread count.

    `repeats` timed calls, each timed alone with the standard library's
    `timeit` (the garbage collector off while timed) on a clock that waits
    for the accelerator when `device` is one (`torch.utils.benchmark.timer`).
    With `budget_s`, `torch.utils.benchmark.Timer.blocked_autorange` takes
    about that long instead: it warms up while it picks how many calls to
    time together, and reports their median per call.
    """
    benchmark = _benchmark()
    for _ in range(warmup):
        fn()
    if budget_s is not None:
        timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        return timer.blocked_autorange(min_run_time=budget_s).median
    clock = benchmark.timer if torch.device(device).type != "cpu" else timeit.default_timer
    return statistics.median(timeit.Timer(fn, timer=clock).repeat(repeat=repeats, number=1))


def interleaved_seconds(
    calls: dict[str, Callable[[], Any]],
    repeats: int,
    warmup: int = 2,
    device: torch.device | str = "cpu",
    threads: int = 0,
    first_rounds_only: dict[str, int] | None = None,
) -> tuple[dict[str, list[float]], int]:
    """Each call's seconds over `repeats` rounds in which every call runs once
    in turn (so load from other processes hits them alike), after `warmup`
    calls each, at `threads` torch threads (0: all cores), which is restored
    after. `first_rounds_only[name] = n` times that call in the first n
    rounds only (a slow reference). Returns the times and the thread count."""
    limits = first_rounds_only or {}
    before = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        used_threads = torch.get_num_threads()
        for fn in calls.values():
            for _ in range(warmup):
                fn()
        times: dict[str, list[float]] = {name: [] for name in calls}
        for round_ in range(repeats):
            for name, fn in calls.items():
                if round_ < limits.get(name, repeats):
                    times[name].append(median_seconds(fn, 1, 0, device))
    finally:
        torch.set_num_threads(before)
    return times, used_threads


def _benchmark():
    """torch.utils.benchmark, which imports torch.utils.cpp_extension: that
    module is imported first with its import-time log held back."""
    quiet_cpp_extension()
    from torch.utils import benchmark

    return benchmark


def machine_name(device: torch.device | str = "cpu") -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()} cores"


@dataclass(frozen=True)
class Ratio:
    """A time ratio over repeats that each timed both sides back to back:
    its median and its range (the spread a reader should see with it)."""

    median: float
    low: float
    high: float
    repeats: int

    def __str__(self) -> str:
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f} over {self.repeats})"

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "low": self.low, "high": self.high, "repeats": self.repeats}


def paired_ratio(numerator_seconds: Sequence[float], denominator_seconds: Sequence[float]) -> Ratio:
    """numerator / denominator per repeat (pair i timed in repeat i), summarized.
    With the peer as numerator, > 1 means faster than the peer."""
    if len(numerator_seconds) != len(denominator_seconds) or not numerator_seconds:
        raise ValueError(
            f"need the same number (>= 1) of timings on both sides, got "
            f"{len(numerator_seconds)} and {len(denominator_seconds)}"
        )
    if min(denominator_seconds) <= 0:
        raise ValueError(f"denominator timings must be > 0, got {list(denominator_seconds)}")
    ratios = [n / d for n, d in zip(numerator_seconds, denominator_seconds)]
    return Ratio(statistics.median(ratios), min(ratios), max(ratios), len(ratios))


def t_quantile_975(degrees_of_freedom: int) -> float:
    """The 0.975 quantile of Student's t: half-width of a 95% interval in
    standard errors: scipy's (the `notebooks` extra), imported here so that
    `import embnb` stays light."""
    from scipy.stats import t

    return float(t.ppf(0.975, degrees_of_freedom))


@dataclass(frozen=True)
class Difference:
    """A paired difference a - b over repeats that each timed both sides:
    its mean with a 95% t-interval, and the range of the repeats' differences."""

    mean: float
    ci_low: float
    ci_high: float
    low: float
    high: float
    repeats: int

    @property
    def excludes_zero(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0

    def __str__(self) -> str:
        return (
            f"{self.mean:+.3g} (95% CI {self.ci_low:+.3g} to {self.ci_high:+.3g}; "
            f"range {self.low:+.3g} to {self.high:+.3g} over {self.repeats})"
        )

    def as_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "excludes_zero": self.excludes_zero}


VERDICTS = ("slower", "faster", "not told apart")  # a's time against b's, by a paired difference


def verdict(ci_low: float, ci_high: float) -> str:
    """A paired difference a - b of times, by its 95% interval: a "slower" or "faster" than b
    where the interval excludes 0, else "not told apart"."""
    return VERDICTS[0] if ci_low > 0 else VERDICTS[1] if ci_high < 0 else VERDICTS[2]


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Difference:
    """a[i] - b[i] per repeat, summarized; the interval needs >= 2 repeats
    (with one it is that difference, NaN either side)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same number (>= 1) of values on both sides, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return Difference(mean, float("nan"), float("nan"), mean, mean, 1)
    half = t_quantile_975(len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    return Difference(mean, mean - half, mean + half, min(diffs), max(diffs), len(diffs))

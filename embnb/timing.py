"""Timing, the one module the library, the notebooks and the benchmarks use: a block's wall and
thread CPU time (`Stopwatch`), one call's device and enqueue time (`time_phase`: CUDA events on a GPU),
medians after warm-up, interleaved rounds of several calls, paired ratios and differences with their
spread, and the machine's name to print next to them. Speeds are only reported as ratios against a peer
timed in the same run (see `python -m embnb.bench`).

On a GPU a synchronized block's thread CPU time is **not** the host's share of it:
`torch.cuda.synchronize` spin-waits, so `Stopwatch.cpu_s` equals `wall_s` whether the GPU or the host
bounds the block, and autograd launches a backward's kernels from its own thread, which no clock of the
caller counts. The host's share is `PhaseTime.enqueue_s`; the GPU's own time `PhaseTime.seconds`."""

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
    "PhaseTime",
    "time_phase",
    "interleaved_phases",
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
    On a GPU `cpu_s` includes the closing synchronize's spin-wait (module
    docstring): it is no measure of the host's share there; `time_phase` is.

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
    quiet_cpp_extension()  # torch.utils.benchmark imports torch.utils.cpp_extension: its import log held back
    from torch.utils import benchmark

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
    """`interleaved_phases` (the same arguments) on the device's clock alone: each call's seconds per
    round (`PhaseTime.seconds`: CUDA events on a GPU, wall time on a CPU), and the thread count."""
    times, used_threads = interleaved_phases(calls, repeats, warmup, device, threads, first_rounds_only)
    return {name: [phase.seconds for phase in phases] for name, phases in times.items()}, used_threads


PHASE_CLOCKS = ("device", "enqueue", "thread")  # PhaseTime's clocks


@dataclass(frozen=True)
class PhaseTime:
    """One call of a phase, timed by `time_phase` (seconds):

    - `seconds`: the phase's time on the device's clock: on a GPU the time between two CUDA
      events recorded on the current stream before and after the call (the GPU's own time of
      the work the call queued there, launch gaps included); on a CPU perf_counter's wall time.
    - `enqueue_s`: wall time until the call returned, with nothing synchronized: on a GPU the
      time to launch the phase (a backward's launches included: `backward()` returns once
      autograd's device thread has queued them), what a "host's share" means; on a CPU the
      work itself, so equal to `seconds` up to the clock's reads.
    - `thread_s`: this thread's CPU time until the call returned (no synchronize inside it):
      on a CPU at one torch thread, the phase's compute undisturbed by other processes; on a
      GPU this thread's share of the launches only (autograd's device thread is not counted).
    """

    seconds: float
    enqueue_s: float
    thread_s: float

    def value(self, clock: str) -> float:
        """`clock`: "device" (`seconds`), "enqueue" or "thread". Raises ValueError on another."""
        if clock not in PHASE_CLOCKS:
            raise ValueError(f"clock must be one of {PHASE_CLOCKS}, got {clock!r}")
        return self.seconds if clock == "device" else self.enqueue_s if clock == "enqueue" else self.thread_s


def time_phase(fn: Callable[[], Any], device: torch.device | str | None = None) -> PhaseTime:
    """One call of `fn` timed on `device`'s clock (`PhaseTime`). On a GPU the device is first
    synchronized (nothing queued before counts, and the launches do not wait on a full queue),
    then `fn` runs between two CUDA events (`torch.cuda.Event(enable_timing=True)`) on the current
    stream, and the end event is waited for; work `fn` puts on other streams counts only where the
    current stream waits for it. On a CPU, perf_counter and the thread's CPU clock around `fn`.
    The caller builds `fn`'s inputs once, outside it, so that only the phase is timed."""
    on_gpu = device is not None and torch.device(device).type == "cuda"
    if on_gpu:
        synchronize(device)
        stream = torch.cuda.current_stream(device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
    cpu_ns, start = time.thread_time_ns(), time.perf_counter()
    fn()
    enqueue = time.perf_counter() - start
    thread = (time.thread_time_ns() - cpu_ns) / 1e9
    if not on_gpu:  # the work itself ran in the call
        return PhaseTime(enqueue, enqueue, thread)
    end.record(stream)
    end.synchronize()
    return PhaseTime(begin.elapsed_time(end) / 1e3, enqueue, thread)


def interleaved_phases(
    calls: dict[str, Callable[[], Any]],
    repeats: int,
    warmup: int = 2,
    device: torch.device | str = "cpu",
    threads: int = 0,
    first_rounds_only: dict[str, int] | None = None,
) -> tuple[dict[str, list[PhaseTime]], int]:
    """Each call's `time_phase` on `device` over `repeats` rounds in which every call runs once in turn
    (so load from other processes hits them alike), after `warmup` calls each, at `threads` torch
    threads (0: all cores), which is restored after; `first_rounds_only[name] = n` times that call in
    the first n rounds only (a slow reference). Returns the times and the thread count. Pair the rounds
    with `paired_ratio` or `paired_difference` on one clock, e.g. `[p.seconds for p in times["a"]]`."""
    limits = first_rounds_only or {}
    before = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        used_threads = torch.get_num_threads()
        for fn in calls.values():
            for _ in range(warmup):
                fn()
        times: dict[str, list[PhaseTime]] = {name: [] for name in calls}
        for round_ in range(repeats):
            for name, fn in calls.items():
                if round_ < limits.get(name, repeats):
                    times[name].append(time_phase(fn, device))
    finally:
        torch.set_num_threads(before)
    return times, used_threads


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

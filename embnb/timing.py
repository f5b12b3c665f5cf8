"""Timing that notebooks and benchmarks share: medians after warm-up, and
the machine's name to print next to them. Speeds are only reported as
ratios against a peer timed in the same run (see `python -m embnb.bench`)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["median_seconds", "machine_name", "Ratio", "paired_ratio"]


def median_seconds(
    fn: Callable[[], Any],
    repeats: int = 10,
    warmup: int = 2,
    device: torch.device | str = "cpu",
    budget_s: float | None = None,
) -> float:
    """Median wall time of `fn()` after warm-up; CUDA work timed with events.

    With `budget_s`, `repeats` is chosen (3 to 200) so that the timed calls
    take about that long, from one timed warm-up call.
    """
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    if budget_s is not None:
        start = time.perf_counter()
        fn()
        once = time.perf_counter() - start
        repeats = max(3, min(200, int(budget_s / max(once, 1e-6))))
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


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

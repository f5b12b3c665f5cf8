"""Timing that notebooks and benchmarks share: medians after warm-up, and
the machine's name to print next to them. Speeds are only reported as
ratios against a peer timed in the same run (see `python -m embnb.bench`)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["median_seconds", "machine_name"]


def median_seconds(
    fn: Callable[[], Any], repeats: int = 10, warmup: int = 2, device: torch.device | str = "cpu"
) -> float:
    """Median wall time of `fn()` after warm-up; CUDA work timed with events."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
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

"""Timing and result files shared by the benchmarks."""

from __future__ import annotations

import datetime
import json
import pathlib
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

RESULTS_DIR = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"


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
    import os

    return f"{platform.processor() or platform.machine()} x{os.cpu_count()} cores"


def write_results(name: str, payload: dict[str, Any], out_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Write `payload` (plus date and machine) to RESULTS_DIR/NAME-DATE-MACHINE.json."""
    out_dir = pathlib.Path(out_dir or RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    machine = payload.setdefault("machine", machine_name())
    payload.setdefault("date", stamp)
    slug = "".join(c if c.isalnum() else "-" for c in machine.lower()).strip("-")
    path = out_dir / f"{name}-{stamp}-{slug}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path

"""When each phase of each step ran, per rank and thread, and how much of
the balancer's time the training loop never waited for."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["Timeline", "hidden_fraction"]


class Timeline:
    """Spans (phase, step, start, end) in perf_counter seconds; threads may
    add spans concurrently (list.append is atomic). `step` is the batch a
    span works on, `iteration` the training-loop iteration it ran in: when
    overlapped, batch s+1 is loaded and balanced during iteration s."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.warmup = False  # spans added while True are marked "warmup"
        self.iteration = -1  # set by the training loop

    def add(self, phase: str, step: int, start: float, end: float, **extra: Any) -> None:
        self.spans.append(
            {
                "phase": phase,
                "step": step,
                "start": start,
                "end": end,
                "warmup": self.warmup,
                "iteration": self.iteration,
                **extra,
            }
        )

    @contextlib.contextmanager
    def span(self, phase: str, step: int, sync_device: torch.device | None = None) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if sync_device is not None and sync_device.type == "cuda":
                torch.cuda.synchronize(sync_device)  # GPU work belongs to this span
            self.add(phase, step, start, time.perf_counter())


def hidden_fraction(spans: list[dict[str, Any]]) -> float:
    """Share of KK time the main thread did not wait for.

    For each step, the exposed part of KK is the overlap of its "kk" span
    with the main thread's "wait_kk" span; a KK run in the main thread
    (sync mode, no wait span) is fully exposed. Warm-up spans (the first
    batch of an overlapped run, with no step to hide behind) are left out.
    Returns 1 - exposed / total over all KK spans, or NaN when there is none.
    """
    waits = {s["step"]: s for s in spans if s["phase"] == "wait_kk"}
    total = exposed = 0.0
    for kk in (s for s in spans if s["phase"] == "kk" and not s.get("warmup")):
        duration = kk["end"] - kk["start"]
        total += duration
        wait = waits.get(kk["step"])
        if kk.get("thread") == "main" or wait is None:
            exposed += duration
        else:
            exposed += max(0.0, min(kk["end"], wait["end"]) - max(kk["start"], wait["start"]))
    return 1.0 - exposed / total if total > 0 else float("nan")

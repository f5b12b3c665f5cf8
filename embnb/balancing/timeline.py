"""When each phase of each step ran, per rank and thread, and how much of
the balanced shuffle's time the training loop never waited for."""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from embnb.timing import Stopwatch

__all__ = ["SHUFFLE_PHASES", "Timeline", "hidden_fraction", "phase_seconds"]

# The balanced shuffle's own work (embnb.balancing.shuffle): in the worker
# thread when overlapped, on the critical path otherwise.
SHUFFLE_PHASES = ("gather_workloads", "kk", "exchange")


class Timeline:
    """Spans (phase, step, start, end, thread) in perf_counter seconds;
    threads may add spans concurrently (list.append is atomic); the thread
    that made the Timeline is "main", any other "worker". `step` is
    the batch a span works on, `iteration` the training-loop iteration it
    ran in: when overlapped, batch s+1 is shuffled during iteration s."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.warmup = False  # spans added while True are marked "warmup"
        self.iteration = -1  # set by the training loop
        self._loop_thread = threading.get_ident()  # the training loop's: "main"; any other: "worker"

    def add(self, phase: str, step: int, start: float, end: float, **extra: Any) -> None:
        thread = "main" if threading.get_ident() == self._loop_thread else "worker"
        span = {"phase": phase, "step": step, "start": start, "end": end, "thread": thread}
        self.spans.append(span | {"warmup": self.warmup, "iteration": self.iteration, **extra})

    @contextlib.contextmanager
    def span(self, phase: str, step: int, device: torch.device | None = None) -> Iterator[None]:
        """Time the block; on a GPU, until this thread's stream has run it."""
        watch = Stopwatch(device, stream_only=True)
        try:
            with watch:
                yield
        finally:
            self.add(phase, step, watch.start, watch.end)


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(0.0, min(a["end"], b["end"]) - max(a["start"], b["start"]))


def hidden_fraction(spans: Sequence[dict[str, Any]]) -> float:
    """Share of the shuffle's time (`SHUFFLE_PHASES`) the main thread did
    not wait for, over the spans of one rank or of several (by their "rank").

    A shuffle span in the main thread (sync mode) is fully exposed; one in
    the worker is exposed where it overlaps its rank's main thread's "wait"
    span for the same batch. Warm-up spans (the first batch of an overlapped
    run, with no step to hide behind) are left out. NaN when there is no
    shuffle.
    """
    waits = {(s.get("rank"), s["step"]): s for s in spans if s["phase"] == "wait"}
    shuffles = [s for s in spans if s["phase"] in SHUFFLE_PHASES and not s.get("warmup")]
    total = sum(s["end"] - s["start"] for s in shuffles)
    exposed = sum(
        s["end"] - s["start"]
        if s.get("thread") == "main" or (s.get("rank"), s["step"]) not in waits
        else _overlap(s, waits[(s.get("rank"), s["step"])])
        for s in shuffles
    )
    return 1.0 - exposed / total if total > 0 else float("nan")


def phase_seconds(
    spans: Iterable[dict[str, Any]], iterations: Sequence[int], num_ranks: int | None = None
) -> dict[tuple[str, str], float]:
    """(thread, phase) -> seconds per iteration, over the spans that ran in
    `iterations` (the loop iteration, whichever batch they worked on; a span
    without one counts by its `step`), averaged over those iterations and
    `num_ranks` ranks (default: the ranks present)."""
    wanted = set(iterations)
    totals: dict[tuple[str, str], float] = defaultdict(float)
    ranks = set()
    for s in spans:
        if (s["iteration"] if "iteration" in s else s["step"]) in wanted and not s.get("warmup"):
            totals[(s.get("thread", "main"), s["phase"])] += s["end"] - s["start"]
            ranks.add(s.get("rank", 0))
    count = max(1, len(wanted)) * (num_ranks or max(1, len(ranks)))
    return {key: total / count for key, total in totals.items()}

"""The latency term of notebook 04's alpha-beta link model, measured: the
median time of an all-gather of one float64 per rank on `world_size` real
ranks of this machine's backend. So small a message is all latency; a
bandwidth-only model (torchrec's `BasicCommsBandwidths`) prices it at
nanoseconds, which is how a shuffle at W = 64 came out "free".

    latency = measure_latency_ms(2, device="cpu")   # ms per collective step
"""

from __future__ import annotations

import statistics

import torch

from embnb._checks import check_int
from embnb.collectives import all_gather_flat, collective_seconds
from embnb.dist import launch, rank_device

__all__ = ["measure_latency_ms"]


def _latency_s(rank: int, world_size: int, repeats: int) -> list[float]:
    one = torch.zeros(1, dtype=torch.float64, device=rank_device())
    all_gather_flat(one)  # warm: the first collective sets up the connections
    return collective_seconds(lambda: all_gather_flat(one), repeats)


def measure_latency_ms(world_size: int = 2, device: str = "auto", repeats: int = 20) -> float:
    """Median over repeats of the slowest rank's time for a one-float64
    all-gather, in ms (one launch of `world_size` ranks)."""
    check_int("world_size", world_size, low=2)
    check_int("repeats", repeats, low=1)
    per_rank = launch(_latency_s, world_size, repeats, device=device)
    return 1e3 * statistics.median(max(times) for times in zip(*per_rank))

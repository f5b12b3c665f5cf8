"""Where the hot-key floor binds: Zipf traffic over a sweep of alpha (appendix 01a).

The hottest key carries a share `p1` of all lookups and is one row on one rank, so no routing has
max/mean below `max(1, W * p1)`. `counted_placement` (greedy LPT over the keys' counts) shows what a
placement that knows every count could reach: a model, not a mode of any system here.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import torch

from embnb.data import make_keys
from embnb.lab.rowwise.aliasing import rank_counts
from embnb.metrics import max_over_mean

__all__ = ["COUNTED", "counted_placement", "alpha_sweep", "floor_findings"]

COUNTED = "counted placement (LPT)"  # the dist_type column of the count-aware model


def _key_counts(keys: torch.Tensor) -> torch.Tensor:
    """Lookups of each distinct key (order unspecified)."""
    if keys.numel() and int(keys.min()) >= 0 and int(keys.max()) < 4 * keys.numel():
        counts = torch.bincount(keys)  # small ids: counting beats sorting
        return counts[counts > 0]
    return torch.unique(keys, return_counts=True)[1]


def counted_placement(keys: torch.Tensor, world_size: int) -> list[int]:
    """Lookups per rank when keys go, by decreasing count, each to the rank
    with the fewest lookups so far (greedy LPT over the keys' counts)."""
    counts = _key_counts(keys).sort(descending=True).values.tolist()
    heap = [(0, rank) for rank in range(world_size)]
    loads = [0] * world_size
    for count in counts:
        load, rank = heapq.heappop(heap)
        loads[rank] = load + count
        heapq.heappush(heap, (loads[rank], rank))
    return loads


def alpha_sweep(
    alphas: Iterable[float], num_keys: int, world_size: int, dist_types: Sequence[str], seeds: Iterable[int]
) -> pd.DataFrame:
    """max/mean of all lookups of a Zipf(alpha) stream per alpha, seed and
    dist_type, with `COUNTED` (the count-aware model) on every seed too.
    Columns: alpha, seed, dist_type, max_over_mean, hottest_share (p1 as
    measured), w_times_p1, hot_key_floor (`max(1, W * p1)`)."""
    seeds = list(seeds)
    records = []
    for alpha in alphas:
        for seed in seeds:
            keys = make_keys("zipf", num_keys, seed, alpha=alpha)
            hottest = int(_key_counts(keys).max()) / keys.numel()
            loads = {d: rank_counts(keys, world_size, d) for d in dist_types}
            loads[COUNTED] = counted_placement(keys, world_size)
            for dist_type, per_rank in loads.items():
                w_p1 = world_size * hottest  # the floor is max(1, W * p1), as aliasing.hot_key_floor
                records.append(
                    (float(alpha), seed, dist_type, max_over_mean(per_rank), hottest, w_p1, max(1.0, w_p1))
                )
    columns = ["alpha", "seed", "dist_type", "max_over_mean", "hottest_share", "w_times_p1", "hot_key_floor"]
    return pd.DataFrame(records, columns=columns)


def floor_findings(sweep: pd.DataFrame) -> dict[str, Any]:
    """What the sweep shows, per alpha and dist_type (medians over seeds):
    max/mean, its min and max, and its excess over the floor (max/mean /
    floor); the smallest alpha whose median `W * p1` exceeds 1 (None if none
    does); per blind dist_type the alpha of the largest median excess; and
    whether the blind modes' seed ranges overlap at every alpha."""
    if sweep.empty:
        raise ValueError("sweep is empty: nothing to summarize")
    sweep = sweep.assign(excess=sweep["max_over_mean"] / sweep["hot_key_floor"])
    stats = sweep.groupby(["alpha", "dist_type"]).agg(
        median=("max_over_mean", "median"),
        low=("max_over_mean", "min"),
        high=("max_over_mean", "max"),
        excess=("excess", "median"),
    )
    floors = sweep.groupby("alpha")[["w_times_p1", "hot_key_floor"]].median()
    alphas = sorted(floors.index)
    blind = [d for d in dict.fromkeys(sweep["dist_type"]) if d != COUNTED]
    binding = [a for a in alphas if floors.loc[a, "w_times_p1"] > 1]

    def overlap(alpha: float) -> bool:
        ranges = [stats.loc[(alpha, d)] for d in blind]
        return max(r["low"] for r in ranges) <= min(r["high"] for r in ranges)

    return {
        "per_alpha": [
            {
                "alpha": a,
                "w_times_p1": float(floors.loc[a, "w_times_p1"]),
                "hot_key_floor": float(floors.loc[a, "hot_key_floor"]),
                **{d: {k: float(v) for k, v in stats.loc[(a, d)].items()} for d in [*blind, COUNTED]},
            }
            for a in alphas
        ],
        "binds_from_alpha": binding[0] if binding else None,
        "largest_excess_alpha": {d: max(alphas, key=lambda a: stats.loc[(a, d), "excess"]) for d in blind},
        "blind_ranges_overlap_at_every_alpha": all(overlap(a) for a in alphas),
    }

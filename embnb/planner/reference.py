"""The knapsack recurrence in plain Python, the core notebook 03 shows.

`embnb.planner.knapsack.Knapsack` runs the same recurrence vectorized over
a 2-D grid of HBM x DDR bins, keeps each state's exact memory and drops
states another beats on every axis. On whole-bin memories its least perf
at or below each bin equals this function's; the tests check that.
"""

from __future__ import annotations

import math

__all__ = ["least_perf_per_memory"]


def least_perf_per_memory(perfs: list[list[float]], memories: list[list[int]], capacity: int) -> list[float]:
    """best[m]: the least summed perf of one option per table using exactly
    m memory bins (inf where no choice does); table t's option o costs
    perfs[t][o] and takes memories[t][o] bins."""
    best = [0.0] + [math.inf] * capacity  # no table yet: 0 perf in 0 bins
    for table_perfs, table_memories in zip(perfs, memories):
        after = [math.inf] * (capacity + 1)
        for used, perf in enumerate(best):
            if perf == math.inf:
                continue
            for option_perf, option_memory in zip(table_perfs, table_memories):
                if used + option_memory <= capacity:  # best[t][m + w] = min(best[t-1][m] + p)
                    after[used + option_memory] = min(after[used + option_memory], perf + option_perf)
        best = after
    return best

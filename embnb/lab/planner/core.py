"""What notebook 03's page is checked against: its knapsack recurrence against brute force over every
combination and the proposer's `embnb.planner.knapsack.Knapsack` (the recurrence vectorized over HBM x
DDR bins, dropping states another beats on every axis: the least perf at or below each bin agrees);
notebook 03a's capped runs against the proposer's."""

from __future__ import annotations

import itertools
import math

import numpy as np

from embnb.lab.planner.comparison import LADDER, Planning
from embnb.planner.knapsack import Knapsack
from embnb.planner.proposer import DynamicProgrammingProposer

__all__ = ["least_perf_by_enumeration", "page_core_agrees", "capped_runs_agree"]


def least_perf_by_enumeration(
    perfs: list[list[float]], memories: list[list[int]], capacity: int
) -> list[list[float]]:
    """rows[t][m]: the least summed perf of one option for each of tables 0..t in exactly m bins
    (inf: none), by trying every combination of a few tables. Option o of table t costs
    perfs[t][o] and takes memories[t][o] bins."""
    rows = []
    for t in range(len(perfs)):
        row = [math.inf] * (capacity + 1)
        for combination in itertools.product(*(range(len(p)) for p in perfs[: t + 1])):
            used = sum(memories[i][o] for i, o in enumerate(combination))
            if used <= capacity:
                row[used] = min(row[used], sum(perfs[i][o] for i, o in enumerate(combination)))
        rows.append(row)
    return rows


def page_core_agrees(
    rows: list[list[float]],
    choices: list[list[int]],
    plan: list[int],
    perfs: list[list[float]],
    memories: list[list[int]],
) -> dict[str, bool]:
    """Whether a recurrence written on notebook 03's page holds over `perfs` and `memories`: its DP
    table `rows` equals brute force cell by cell (`table`); each cell's option in `choices` (-1:
    unreachable) rebuilds the cell from the row above (`choices`); its walked-back `plan` fits and
    has the least summed perf (`plan`); and the proposer's `Knapsack` has the same least perf at or
    below each bin (`proposer_knapsack`)."""
    capacity = len(rows[-1]) - 1
    want = np.array(least_perf_by_enumeration(perfs, memories, capacity))
    got = np.array(rows, dtype=float)
    above = np.vstack([[0.0] + [math.inf] * capacity, got[:-1]])  # no table yet: 0 perf in 0 bins
    rebuilt = [
        option >= 0
        and m >= memories[t][option]
        and math.isclose(above[t, m - memories[t][option]] + perfs[t][option], got[t, m])
        if math.isfinite(got[t, m])
        else option == -1
        for t, row in enumerate(choices)
        for m, option in enumerate(row)
    ]
    used = sum(memories[t][o] for t, o in enumerate(plan))
    knapsack = Knapsack(np.array([capacity + 1.0]), (capacity + 1,))  # bin m holds memory m exactly
    for t, (table_perfs, table_memories) in enumerate(zip(perfs, memories)):
        knapsack.add_table(
            t, np.array(table_memories, dtype=float)[:, None], np.array(table_perfs, dtype=float)
        )
    least, want_least = np.minimum.accumulate(got[-1]), np.minimum.accumulate(knapsack.least)
    return {
        "table": bool(np.allclose(got, want) and np.array_equal(np.isinf(got), np.isinf(want))),
        "choices": all(rebuilt),
        "plan": used <= capacity
        and math.isclose(sum(perfs[t][o] for t, o in enumerate(plan)), want[-1].min()),
        "proposer_knapsack": bool(
            np.allclose(least, want_least) and np.array_equal(np.isinf(least), np.isinf(want_least))
        ),
    }


def capped_runs_agree(page_best: dict[int, float], enumerated, topology, batch_size: int, reservation: float):
    """Whether the capped runs written on notebook 03a's page find the best rating the library's
    DynamicProgrammingProposer finds with its knapsack runs alone (`LADDER`'s plain knapsack with
    `max_caps`) in torchrec's planner, for each `max_caps` in `page_best`
    (max_caps -> the page's best rating)."""
    planning = Planning(batch_size, storage_reservation_percentage=reservation)

    def rating(caps: int) -> float:
        proposer = DynamicProgrammingProposer(**(LADDER["plain knapsack"] | {"max_caps": caps}))
        return planning.run(proposer, enumerated, topology).perf_rating

    return {
        f"max_caps={caps}": math.isclose(best, rating(caps), rel_tol=1e-9) for caps, best in page_best.items()
    }

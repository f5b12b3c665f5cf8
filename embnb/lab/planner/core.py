"""The knapsack recurrence in plain Python, the core notebook 03 shows: `knapsack_choices` fills the
DP table row by row and remembers which option each cell took; `backtrack` walks those choices up
from a bin of the last row. `embnb.planner.knapsack.Knapsack` runs the same recurrence vectorized
over HBM x DDR bins, keeps each state's exact memory and drops states another beats on every axis;
on whole-bin memories its least perf at or below each bin equals this module's (tested, and these
functions against brute force)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from embnb.lab.planner.planning import run_planner
from embnb.planner.knapsack import Knapsack
from embnb.planner.proposer import DynamicProgrammingProposer

__all__ = ["knapsack_choices", "backtrack", "least_perf_by_enumeration", "page_core_agrees", "CAPS_ONLY"]
__all__ += ["capped_runs_agree"]

# The proposer with its knapsack runs and nothing else: every frontier plan of each run proposed.
CAPS_ONLY = dict(bisect=False, slack=False, prune=False, max_refinements=0, replay=False)


def knapsack_choices(
    perfs: list[list[float]], memories: list[list[int]], capacity: int
) -> tuple[list[list[float]], list[list[int]]]:
    """rows[t][m]: the least summed perf of one option for each of tables 0..t in exactly m memory
    bins (inf: none); choices[t][m]: the option of table t that cell took (-1: none). Option o of
    table t costs perfs[t][o] and takes memories[t][o] bins; a tie keeps the first (lowest bin
    above, then lowest option)."""
    best = [0.0] + [math.inf] * capacity  # no table yet: 0 perf in 0 bins
    rows, choices = [], []
    for table_perfs, table_memories in zip(perfs, memories):
        after, chosen = [math.inf] * (capacity + 1), [-1] * (capacity + 1)
        for used, perf in enumerate(best):
            if perf == math.inf:
                continue
            for option, (option_perf, option_memory) in enumerate(zip(table_perfs, table_memories)):
                cell = used + option_memory  # dp[t][m + w] = min(dp[t-1][m] + p)
                if cell <= capacity and perf + option_perf < after[cell]:
                    after[cell], chosen[cell] = perf + option_perf, option
        rows.append(after)
        choices.append(chosen)
        best = after
    return rows, choices


def backtrack(choices: list[list[int]], memories: list[list[int]], end: int) -> list[int]:
    """The option of each table in the plan that ends in bin `end` of the last row: a cell's choice
    names its option, whose memory says in which bin of the row above the plan was."""
    plan = []
    for table in reversed(range(len(choices))):
        option = choices[table][end]
        if option < 0:
            raise ValueError(f"no plan ends in bin {end} of row {table}: that cell is unreachable")
        plan.append(option)
        end -= memories[table][option]
    return plan[::-1]


def least_perf_by_enumeration(
    perfs: list[list[float]], memories: list[list[int]], capacity: int
) -> list[list[float]]:
    """What `knapsack_choices`' rows must hold, by trying every combination of a few tables."""
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
    """Whether a recurrence written on notebook 03's page (its DP table, choices and backtracked
    plan over `perfs` and `memories`) agrees with `knapsack_choices` cell by cell, and with the
    proposer's `Knapsack` on the least perf at or below each bin (it drops dominated states)."""
    capacity = len(rows[-1]) - 1
    want_rows, want_choices = knapsack_choices(perfs, memories, capacity)
    end = min(range(capacity + 1), key=lambda m: want_rows[-1][m])
    knapsack = Knapsack(np.array([capacity + 1.0]), (capacity + 1,))  # bin m holds memory m exactly
    for t, (table_perfs, table_memories) in enumerate(zip(perfs, memories)):
        knapsack.add_table(
            t, np.array(table_memories, dtype=float)[:, None], np.array(table_perfs, dtype=float)
        )
    got, want = np.minimum.accumulate(np.array(rows[-1])), np.minimum.accumulate(knapsack.least)
    return {
        "table": rows == want_rows and choices == want_choices,
        "plan": plan == backtrack(want_choices, memories, end),
        "proposer_knapsack": bool(np.allclose(got, want) and np.array_equal(np.isinf(got), np.isinf(want))),
    }


def capped_runs_agree(page_best: dict[int, float], enumerated, topology, batch_size: int, reservation: float):
    """Whether the capped runs written on notebook 03's page find the best rating the library's
    DynamicProgrammingProposer finds with its knapsack runs alone (`CAPS_ONLY`) in torchrec's
    planner, for each `max_caps` in `page_best` (max_caps -> the page's best rating)."""

    def rating(caps: int) -> float:
        proposer = DynamicProgrammingProposer(max_caps=caps, **CAPS_ONLY)
        run = run_planner(
            proposer, enumerated, topology, batch_size, storage_reservation_percentage=reservation
        )
        return run.perf_rating

    return {
        f"max_caps={caps}": math.isclose(best, rating(caps), rel_tol=1e-9) for caps, best in page_best.items()
    }

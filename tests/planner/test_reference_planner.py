"""embnb.planner.reference (the recurrence shown in notebook 03) against the
vectorized Knapsack the proposer runs: on whole-bin memories the least perf
at or below each memory is the same."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from embnb.planner.knapsack import Knapsack
from embnb.planner.reference import least_perf_per_memory

TABLES = st.lists(  # per table: options (perf, memory in bins)
    st.lists(st.tuples(st.floats(0.5, 100), st.integers(0, 6)), min_size=1, max_size=4),
    min_size=1,
    max_size=5,
)


@settings(max_examples=150, deadline=None)
@given(tables=TABLES, capacity=st.integers(0, 15))
def test_the_readable_recurrence_and_the_knapsack_agree(tables, capacity):
    perfs = [[p for p, _ in table] for table in tables]
    memories = [[m for _, m in table] for table in tables]
    best = least_perf_per_memory(perfs, memories, capacity)

    # one axis of capacity + 1 bins of size 1: bin m holds memory m exactly
    knapsack = Knapsack(np.array([capacity + 1.0]), (capacity + 1,))
    for t in range(len(tables)):
        knapsack.add_table(t, np.array(memories[t], dtype=float)[:, None], np.array(perfs[t]))
    # the knapsack drops dominated states, so compare "at most m bins"
    want = np.minimum.accumulate(np.array(best))
    got = np.minimum.accumulate(knapsack.least)
    assert np.allclose(got, want) and np.array_equal(np.isinf(got), np.isinf(want))


def test_by_hand():
    # two tables: (perf 5, 2 bins) or (perf 1, 4 bins); (perf 2, 1 bin) or (perf 1, 3 bins)
    best = least_perf_per_memory([[5, 1], [2, 1]], [[2, 4], [1, 3]], 7)
    inf = math.inf
    # 2+1 bins: 5+2; 2+3: 5+1; 4+1: 1+2; 4+3: 1+1
    assert best == [inf, inf, inf, 7, inf, min(6, 3), inf, 2]

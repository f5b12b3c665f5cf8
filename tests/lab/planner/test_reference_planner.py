"""embnb.lab.planner.core (the recurrence shown in notebook 03) against the
vectorized Knapsack the proposer runs (on whole-bin memories the least perf
at or below each memory is the same), and its table, each cell's choice and
the backtracked plan against brute force over every combination."""

import itertools
import math

import nbformat
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embnb import harness
from embnb.lab.planner.core import (
    backtrack,
    capped_runs_agree,
    knapsack_choices,
    least_perf_by_enumeration,
    page_core_agrees,
)
from embnb.lab.planner.explain import SMALL_LIMITS, small_knapsack, tiny_instance
from embnb.planner.knapsack import Knapsack

INF = math.inf


def least_perf_per_memory(perfs, memories, capacity):
    """The last row of `knapsack_choices` (with no table: 0 perf in 0 bins)."""
    rows, _ = knapsack_choices(perfs, memories, capacity)
    return rows[-1] if rows else [0.0] + [math.inf] * capacity


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


def _every_plan(perfs, memories):
    """(summed perf, bins, options) of every combination: the oracle."""
    for combination in itertools.product(*(range(len(p)) for p in perfs)):
        yield (
            sum(perfs[t][o] for t, o in enumerate(combination)),
            sum(memories[t][o] for t, o in enumerate(combination)),
            combination,
        )


def _check_choices_against_brute_force(perfs, memories, capacity):
    rows, choices = knapsack_choices(perfs, memories, capacity)
    for t in range(len(perfs)):
        for m in range(capacity + 1):
            brute = min(
                (p for p, b, _ in _every_plan(perfs[: t + 1], memories[: t + 1]) if b == m), default=INF
            )
            assert rows[t][m] == pytest.approx(brute) if brute < INF else rows[t][m] == INF, (t, m)
            option = choices[t][m]
            if brute == INF:
                assert option == -1, (t, m)
                continue
            # the marked option is one that reaches the cell's least perf from the row above
            above = rows[t - 1] if t else [0.0] + [INF] * capacity
            assert above[m - memories[t][option]] + perfs[t][option] == pytest.approx(rows[t][m]), (t, m)
    finite = [b for b in range(capacity + 1) if rows[-1][b] < INF]
    if not finite:
        return
    end = min(finite, key=lambda b: rows[-1][b])
    plan = backtrack(choices, memories, end)
    best = min(p for p, b, _ in _every_plan(perfs, memories) if b <= capacity)
    assert sum(perfs[t][o] for t, o in enumerate(plan)) == pytest.approx(best)
    assert sum(memories[t][o] for t, o in enumerate(plan)) == end <= capacity


@settings(max_examples=100, deadline=None)
@given(tables=TABLES, capacity=st.integers(0, 15))
def test_each_cells_choice_and_the_backtracked_plan_agree_with_brute_force(tables, capacity):
    perfs = [[p for p, _ in table] for table in tables]
    memories = [[m for _, m in table] for table in tables]
    _check_choices_against_brute_force(perfs, memories, capacity)
    enumerated = np.array(least_perf_by_enumeration(perfs, memories, capacity))
    dp = np.array(knapsack_choices(perfs, memories, capacity)[0])
    assert np.allclose(enumerated, dp) and np.array_equal(np.isinf(enumerated), np.isinf(dp))


def test_backtrack_refuses_an_unreachable_bin():
    _, choices = knapsack_choices([[1.0]], [[2]], 3)
    with pytest.raises(ValueError, match="no plan ends in bin 1 of row 0"):
        backtrack(choices, [[2]], 1)


def test_the_small_knapsack_of_torchrecs_options_is_the_brute_force_one():
    """Notebook 03's worked example: torchrec's estimated options of six
    tables in whole bins (rounded up), memory binding."""
    spec = [
        ("a", 1_000_000, 64, 20.0),
        ("b", 500_000, 64, 10.0),
        ("c", 500_000, 64, 2.0),
        ("d", 250_000, 64, 5.0),
    ]
    enumerated, topology = tiny_instance(spec, 0.3, 2, 512, limits=SMALL_LIMITS)
    small = small_knapsack(enumerated, topology, 512, 16)
    assert small.tables == ["a", "b", "c", "d"]
    assert all(options == ["table_wise/fused", "table_wise/fused_uvm_caching"] for options in small.options)
    # whole bins, rounded up: what a plan takes in bins is at least what it takes in GiB
    for hbm, bins in zip(small.hbm_gb, small.memories):
        assert all(b - 1 < gb / small.bin_gb <= b + 1e-9 for gb, b in zip(hbm, bins))
    assert sum(max(m) for m in small.memories) > small.capacity  # memory binds: not every table fused
    _check_choices_against_brute_force(small.perfs, small.memories, small.capacity)
    best = min(p for p, b, _ in _every_plan(small.perfs, small.memories) if b <= small.capacity)
    assert small.rows[-1][small.end] == pytest.approx(best)
    assert sum(small.hbm_gb[t][o] for t, o in enumerate(small.plan)) <= small.capacity * small.bin_gb


def test_the_page_core_check_fails_for_a_recurrence_off_by_one_bin():
    perfs, memories, capacity = [[5, 1], [2, 1], [3, 2]], [[2, 4], [1, 3], [1, 2]], 9
    rows, choices = knapsack_choices(perfs, memories, capacity)
    end = min(range(capacity + 1), key=lambda m: rows[-1][m])
    plan = backtrack(choices, memories, end)
    assert page_core_agrees(rows, choices, plan, perfs, memories) == dict.fromkeys(
        ("table", "plan", "proposer_knapsack"), True
    )
    # a page that charges each option one bin less than it takes
    short = [[max(m - 1, 0) for m in table] for table in memories]
    bad_rows, bad_choices = knapsack_choices(perfs, short, capacity)
    bad_end = min(range(capacity + 1), key=lambda m: bad_rows[-1][m])
    bad = page_core_agrees(bad_rows, bad_choices, backtrack(bad_choices, short, bad_end), perfs, memories)
    assert bad["table"] is False and bad["proposer_knapsack"] is False


CAPPED_RUN = "plans = run(cap, math.inf) if balance else run(math.inf, cap)"


def _page_core(edit=lambda source: source) -> dict:
    """The knapsack, walk_back and capped_runs cell of notebook 03a (`edit`ed), run as the page runs it."""
    notebook = nbformat.read(str(harness.NOTEBOOKS_DIR / "03a_dp_planner_measured.ipynb"), as_version=4)
    namespace = {"math": math}
    for cell in notebook.cells:
        if cell.cell_type == "code" and cell.source.startswith(("def knapsack(", "def capped_runs(")):
            exec(edit(cell.source), namespace)
    return namespace


def test_the_page_capped_runs_find_the_proposers_ratings_and_a_cap_ignored_does_not():
    """Notebook 03's placement example: notebook 03a's capped runs against the proposer's knapsack runs
    alone, in torchrec's planner. The caps matter there, so a page whose cap is ignored fails."""
    spec = [("user_id", 2_000_000, 128, 5.0), ("item_id", 500_000, 64, 5.0), ("ad_id", 250_000, 128, 1.0)]
    enumerated, topology = tiny_instance(spec, 0.5, 2, 512)
    tiny = small_knapsack(enumerated, topology, 512, 20)

    def best(page, caps):
        args = (tiny.perfs, tiny.memories, tiny.capacity, tiny.shard_perfs, tiny.shard_hbm_gb, tiny.rate)
        return min(r for r in page["capped_runs"](*args, caps).values() if not math.isnan(r))

    page_best = {caps: best(_page_core(), caps) for caps in (0, 8)}
    assert page_best[8] < page_best[0]  # the caps find a better plan here
    assert capped_runs_agree(page_best, enumerated, topology, 512, 0.15) == {
        "max_caps=0": True,
        "max_caps=8": True,
    }

    def ignore_the_cap(source):
        assert CAPPED_RUN in source or "def capped_runs(" not in source
        return source.replace(CAPPED_RUN, "plans = run(math.inf, math.inf)")

    ignored = {caps: best(_page_core(ignore_the_cap), caps) for caps in (0, 8)}
    assert capped_runs_agree(ignored, enumerated, topology, 512, 0.15) == {
        "max_caps=0": True,
        "max_caps=8": False,
    }

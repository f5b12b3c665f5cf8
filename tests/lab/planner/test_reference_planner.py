"""Notebook 03's page (the knapsack recurrence and walk back it writes, run from the notebook)
against the vectorized Knapsack the proposer runs (on whole-bin memories the least perf at or below
each memory is the same) and against brute force over every combination, cell by cell; and
embnb.lab.planner.core's checks of a page, which must fail for a page that is wrong."""

import itertools
import math

import nbformat
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embnb import harness
from embnb.lab.planner.core import capped_runs_agree, least_perf_by_enumeration, page_core_agrees
from embnb.lab.planner.explain import SMALL_LIMITS, small_knapsack, tiny_instance
from embnb.planner.knapsack import Knapsack

INF = math.inf


def _page(notebook: str, edit=lambda source: source) -> dict:
    """The cells of `notebook` that define the page's knapsack (and walk_back, capped_runs), `edit`ed,
    run as the page runs them."""
    cells = nbformat.read(str(harness.NOTEBOOKS_DIR / f"{notebook}.ipynb"), as_version=4).cells
    namespace = {"math": math}
    for cell in cells:
        if cell.cell_type == "code" and cell.source.startswith(("def knapsack(", "def capped_runs(")):
            exec(edit(cell.source), namespace)
    return namespace


PAGE = _page("03_dp_planner")


def _solve(perfs, memories, capacity):
    """The page's DP table and choices, the end of its best plan and the plan walked back from it
    (None: no plan fits; the page assumes one does)."""
    rows, choices = PAGE["knapsack"](perfs, memories, capacity)
    end = min(range(capacity + 1), key=lambda m: rows[-1][m])
    plan = PAGE["walk_back"](choices, memories, end) if rows[-1][end] < INF else None
    return rows, choices, end, plan


TABLES = st.lists(  # per table: options (perf, memory in bins)
    st.lists(st.tuples(st.floats(0.5, 100), st.integers(0, 6)), min_size=1, max_size=4),
    min_size=1,
    max_size=5,
)


@settings(max_examples=150, deadline=None)
@given(tables=TABLES, capacity=st.integers(0, 15))
def test_the_pages_recurrence_and_the_knapsack_agree(tables, capacity):
    perfs = [[p for p, _ in table] for table in tables]
    memories = [[m for _, m in table] for table in tables]
    best = PAGE["knapsack"](perfs, memories, capacity)[0][-1]

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
    best = PAGE["knapsack"]([[5, 1], [2, 1]], [[2, 4], [1, 3]], 7)[0][-1]
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
    rows, choices, end, plan = _solve(perfs, memories, capacity)
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
    if rows[-1][end] == INF:
        return
    best = min(p for p, b, _ in _every_plan(perfs, memories) if b <= capacity)
    assert sum(perfs[t][o] for t, o in enumerate(plan)) == pytest.approx(best)
    assert sum(memories[t][o] for t, o in enumerate(plan)) == end <= capacity


@settings(max_examples=100, deadline=None)
@given(tables=TABLES, capacity=st.integers(0, 15))
def test_each_cells_choice_and_the_walked_back_plan_agree_with_brute_force(tables, capacity):
    perfs = [[p for p, _ in table] for table in tables]
    memories = [[m for _, m in table] for table in tables]
    _check_choices_against_brute_force(perfs, memories, capacity)
    enumerated = np.array(least_perf_by_enumeration(perfs, memories, capacity))
    dp = np.array(PAGE["knapsack"](perfs, memories, capacity)[0])
    assert np.allclose(enumerated, dp) and np.array_equal(np.isinf(enumerated), np.isinf(dp))


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
    rows, _, end, plan = _solve(small.perfs, small.memories, small.capacity)
    best = min(p for p, b, _ in _every_plan(small.perfs, small.memories) if b <= small.capacity)
    assert rows[-1][end] == pytest.approx(best)
    assert sum(small.hbm_gb[t][o] for t, o in enumerate(plan)) <= small.capacity * small.bin_gb
    with pytest.raises(ValueError, match="no plan fits 2 bins"):  # each table's least memory takes more
        small_knapsack(enumerated, topology, 512, 2)


def test_the_page_core_check_fails_for_a_recurrence_off_by_one_bin():
    perfs, memories, capacity = [[5, 1], [2, 1], [3, 2]], [[2, 4], [1, 3], [1, 2]], 9
    rows, choices, _, plan = _solve(perfs, memories, capacity)
    assert page_core_agrees(rows, choices, plan, perfs, memories) == dict.fromkeys(
        ("table", "choices", "plan", "proposer_knapsack"), True
    )
    # a page that charges each option one bin less than it takes
    short = [[max(m - 1, 0) for m in table] for table in memories]
    bad_rows, bad_choices, _, bad_plan = _solve(perfs, short, capacity)
    bad = page_core_agrees(bad_rows, bad_choices, bad_plan, perfs, memories)
    assert bad == {
        "table": False,
        "choices": False,
        "plan": True,
        "proposer_knapsack": False,
    }  # 9 bins fit it
    assert page_core_agrees(rows, choices, [0, 0, 0], perfs, memories)["plan"] is False  # summed 10, not 4
    # a page whose choices are off by one option, its table right
    shifted = [[(o + 1) % 2 if o >= 0 else o for o in row] for row in choices]
    assert page_core_agrees(rows, shifted, plan, perfs, memories)["choices"] is False


CAPPED_RUN = "plans = run(cap, math.inf) if balance else run(math.inf, cap)"


def test_the_page_capped_runs_find_the_proposers_ratings_and_a_cap_ignored_does_not():
    """Notebook 03's placement example: notebook 03a's capped runs against the proposer's knapsack runs
    alone, in torchrec's planner. The caps matter there, so a page whose cap is ignored fails."""
    spec = [("user_id", 2_000_000, 128, 5.0), ("item_id", 500_000, 64, 5.0), ("ad_id", 250_000, 128, 1.0)]
    enumerated, topology = tiny_instance(spec, 0.5, 2, 512)
    tiny = small_knapsack(enumerated, topology, 512, 20)

    def best(page, caps):
        args = (tiny.perfs, tiny.memories, tiny.capacity, tiny.shard_perfs, tiny.shard_hbm_gb, tiny.rate)
        return min(r for r in page["capped_runs"](*args, caps).values() if not math.isnan(r))

    page_best = {caps: best(_page("03a_dp_planner_measured"), caps) for caps in (0, 8)}
    assert page_best[8] < page_best[0]  # the caps find a better plan here
    assert capped_runs_agree(page_best, enumerated, topology, 512, 0.15) == {
        "max_caps=0": True,
        "max_caps=8": True,
    }

    def ignore_the_cap(source):
        assert CAPPED_RUN in source or "def capped_runs(" not in source
        return source.replace(CAPPED_RUN, "plans = run(math.inf, math.inf)")

    ignored = {caps: best(_page("03a_dp_planner_measured", ignore_the_cap), caps) for caps in (0, 8)}
    assert capped_runs_agree(ignored, enumerated, topology, 512, 0.15) == {
        "max_caps=0": True,
        "max_caps=8": False,
    }

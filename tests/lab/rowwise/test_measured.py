"""embnb.lab.rowwise.measured: what a case reports, on numbers written here;
a small real run's counts against plain-Python routing; the figure's points."""

from collections import Counter

import pandas as pd
import pytest

from embnb.data import make_keys
from embnb.lab.rowwise.measured import (
    MeasuredCase,
    MeasuredRouting,
    counted_vs_measured,
    describe,
    measure_cases,
)
from embnb.lab.rowwise.reference import fmix64, owner_of

CASE = MeasuredCase("roundrobin", 4, 1.5, [10, 30, 20, 20], [5, 6, 7, 8], [1.0, 2.0, 4.0, 1.0], [2, 3, 5, 2])
ROUTING = MeasuredRouting(
    [CASE, MeasuredCase("continuous", 4, 0.8, [20, 21, 19, 20], [9, 9, 9, 9], [1, 2, 1, 1], [1, 2, 1, 1])],
    keys_per_rank=20,
    bag_size=4,
    table_rows=100,
    embedding_dim=8,
    threads=1,
    warmup=1,
    repeats=2,
    machine="here",
)


def test_a_case_reports_its_ranks():
    assert CASE.counted_max_over_mean == 30 / 20 and CASE.measured_max_over_mean() == 4.0 / 2.0
    assert CASE.measured_max_over_mean("wall") == 5 / 3
    assert (CASE.busiest_rank, CASE.slowest_rank(), CASE.busiest_is_slowest()) == (1, 2, False)
    assert CASE.step_over_busiest() == 2.0 and CASE.slowest_rank("wall") == 2
    ranks = pd.Series(CASE.keys_per_rank).rank().corr(pd.Series(CASE.lookup_ms).rank())
    assert CASE.spearman() == pytest.approx(ranks)
    row = ROUTING.to_json()
    assert row["busiest_is_slowest"] == 1 and row["measured_below_counted"] == 0
    assert [a["alpha"] for a in row["by_alpha"]] == [0.8, 1.5]
    assert row["cases"][0]["step_over_busiest"] == 2.0 and row["clock"] == "cpu"
    findings = describe(ROUTING)
    assert findings[0].startswith(
        "The busiest owner by ids is the slowest rank by measured cpu time in 1 of 2"
    )
    assert "2.00x to 2.00x the busiest rank's" in findings[1]
    assert "0.8: 1.05 -> 1.60, 1.5: 1.50 -> 2.00" in findings[2]


def test_a_real_run_counts_what_plain_python_routing_counts():
    routing = measure_cases(
        [1.2], [3], ["continuous", "roundrobin", "hash_roundrobin"], keys_per_rank=300, bag_size=7,
        table_rows=1000, embedding_dim=8, repeats=1, seed=4,
    )  # fmt: skip
    raw = make_keys("zipf", 3 * 300, 4, alpha=1.2).tolist()
    rows = [fmix64(i) % 1000 for i in raw]  # the pipeline's hash into the table, as plain ints
    for case in routing.cases:
        owner = [owner_of(r, 3, case.dist_type, block_size=334) for r in rows]
        counts = Counter(owner)
        assert case.keys_per_rank == [counts[r] for r in range(3)], case.dist_type
        distinct = [len({row for row, o in zip(rows, owner) if o == r}) for r in range(3)]
        assert case.distinct_rows_per_rank == distinct, case.dist_type
        assert all(t > 0 for t in case.lookup_ms + case.lookup_wall_ms)
    assert (routing.threads, routing.repeats, routing.keys_per_rank) == (1, 1, 300)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="nothing to measure"):
        measure_cases([], [4], ["roundrobin"])
    with pytest.raises(ValueError, match="modulo"):
        measure_cases([1.0], [4], ["modulo"])
    with pytest.raises(ValueError, match="world_size"):
        measure_cases([1.0], [1], ["roundrobin"], keys_per_rank=8)


def test_figure_draws_each_case_and_each_rank():
    fig = counted_vs_measured(ROUTING)
    left, right = fig.axes[:2]
    assert [tuple(c.get_offsets()[0]) for c in left.collections] == [(1.5, 2.0), (21 / 20, 2 / 1.25)]
    right_points = [tuple(map(tuple, c.get_offsets())) for c in right.collections]
    assert right_points[0] == ((0.5, 0.5), (1.5, 1.0), (1.0, 2.0), (1.0, 0.5))  # ids, time over the mean
    assert len(right_points[1]) == 4
    with pytest.raises(ValueError, match="no cases"):
        counted_vs_measured(MeasuredRouting([], 1, 1, 1, 1, 1, 1, 1, ""))

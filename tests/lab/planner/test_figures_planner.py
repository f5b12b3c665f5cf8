"""embnb.lab.planner.figures: what the figures draw, checked against small tables
whose answer is worked out here."""

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.patches import Rectangle

from embnb.lab.planner import figures as plots
from embnb.lab.planner.explain import SmallKnapsack

INF = math.inf


SMALL = SmallKnapsack(
    tables=["a", "b"],
    options=[["t/fused", "t/fused_uvm_caching"]] * 2,
    perfs=[[1.0, 3.0], [2.0, 5.0]],
    hbm_gb=[[0.2, 0.1], [0.2, 0.1]],
    memories=[[2, 1], [2, 1]],
    bin_gb=0.1,
    capacity=3,
)


def test_small_knapsack_figure_marks_each_cells_choice_and_outlines_the_backtracked_path():
    # worked by hand: a takes F (1 ms, 2 bins) or C (3 ms, 1 bin); b likewise (2 ms, 2 bins) or (5 ms, 1 bin)
    # row a: bin 1 = C 3, bin 2 = F 1; row b: bin 2 = C+C 8, bin 3 = min(C+F 5, F+C 6) -> F (from bin 1)
    rows = [[INF, 3.0, 1.0, INF], [INF, INF, 8.0, 5.0]]
    fig = plots.knapsack_choices_figure(SMALL, rows, [[-1, 1, 0, -1], [-1, -1, 1, 0]], [1, 0])
    ax = fig.axes[0]
    cells = [t for t in ax.texts if not hasattr(t, "xyann")]  # not the arrows
    texts = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in cells}
    assert texts == {
        (0, 0): "0",
        (1, 1): "C\n3.000",
        (2, 1): "F\n1.000",
        (2, 2): "C\n8.000",
        (3, 2): "F\n5.000",
    }
    outlined = [
        (p.get_x() + 0.5, p.get_y() + 0.5)
        for p in ax.patches
        if isinstance(p, Rectangle) and not p.get_fill()
    ]
    assert outlined == [(0, 0), (1, 1), (3, 2)]  # start, a's C in bin 1, b's F in bin 3
    arrows = [(a.xyann, a.xy) for a in ax.texts if hasattr(a, "xyann")]
    assert [(round(s[0]), round(e[0])) for s, e in arrows] == [(0, 1), (1, 3)]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["start", "a: F 2, C 1", "b: F 2, C 1"]
    assert "0.1 GiB" in ax.get_xlabel() and "5.000 ms in 3 bins" in ax.get_title()


def test_option_codes_name_the_compute_kernel():
    assert [
        plots.option_code(x) for x in ("table_wise/fused", "row_wise/fused_uvm_caching", "x/fused_uvm")
    ] == [
        "F",
        "C",
        "U",
    ]
    assert plots.option_code("table_wise/dense") == "D"


def _comparison(**extra):
    rows = {
        "perf_rating": [2.0, 5.0, math.nan],
        "plan_s": [0.1, 1.0, 0.01],
        "timed_out": [False, True, False],
        "note": ["", "", "no plan: nothing fits"],
        **extra,
    }
    return pd.DataFrame(rows, index=pd.Index(["a", "b", "c"], name="proposer"))


def test_comparison_draws_dots_from_1x_not_bars_and_times_end_to_end():
    fig = plots.proposer_comparison(
        _comparison(plan_s_min=[0.09, 0.8, 0.01], plan_s_max=[0.2, 1.5, 0.01], end_to_end_s=[1.1, 2.0, 1.01])
    )
    left, right = fig.axes[:2]
    assert not [p for ax in (left, right) for p in ax.patches if isinstance(p, Rectangle)]
    (ratings,) = left.collections
    assert ratings.get_offsets()[:2].tolist() == [[1.0, 2], [2.5, 1]]  # a (top): the best; b: 5 / 2
    assert np.ma.is_masked(ratings.get_offsets()[2]) or np.isnan(ratings.get_offsets()[2][0])  # c: no plan
    ranges, median, end_to_end = right.collections
    assert [tuple(segment[:, 0]) for segment in ranges.get_segments()] == [
        (0.09, 0.2),
        (0.8, 1.5),
        (0.01, 0.01),
    ]
    assert median.get_offsets()[:, 0].tolist() == [0.1, 1.0, 0.01]
    assert end_to_end.get_offsets()[:, 0].tolist() == [1.1, 2.0, 1.01]
    assert [(t.get_text(), t.get_position()[1]) for t in left.get_yticklabels()] == [
        ("a", 2),
        ("b", 1),
        ("c", 0),
    ]


def test_empty_or_planless_input_is_refused():
    with pytest.raises(ValueError, match=r"no proposer found a plan, nothing to compare \(a: no plan"):
        plots.proposer_comparison(_comparison().assign(perf_rating=np.nan))

"""embnb.planner.plots: what the figures draw, checked against small tables
whose answer is worked out here."""

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.patches import Rectangle

from embnb.planner import plots

INF = math.inf


def test_heatmap_colours_each_row_by_its_least_and_dots_the_last_rows_frontier():
    table = pd.DataFrame(
        [[INF, 4.0, 2.0, INF], [9.0, 6.0, 7.0, 3.0]], index=["t0", "t1"], columns=[0.1, 0.2, 0.3, 0.4]
    )
    fig = plots.knapsack_heatmap(table)
    ax = fig.axes[0]
    shown = ax.images[0].get_array()
    assert shown.mask.tolist() == [[True, False, False, True], [False, False, False, False]]
    assert shown[0, 1:3].tolist() == [2.0, 1.0] and shown[1].tolist() == [3.0, 2.0, 7 / 3, 1.0]
    # by hand: bin 0 (9), bin 1 (6 < 9), bin 3 (3 < 6); bin 2 (7) is beaten by bin 1 with less memory
    (dots,) = ax.collections
    assert dots.get_offsets().tolist() == [[0, 1], [1, 1], [3, 1]]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1: t0", "2: t1"]


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
    dots = [line.get_xdata()[0] for line in left.lines if line.get_marker() == "o"]
    assert dots == [1.0, 2.5]  # a: the best; b: 5 / 2; c has no plan
    hollow = [line.get_xdata()[0] for line in right.lines if line.get_fillstyle() == "none"]
    assert hollow == [1.1, 2.0, 1.01]
    ranges = [tuple(line.get_xdata()) for line in right.lines if line.get_marker() in ("None", "", None)]
    assert ranges == [(0.09, 0.2), (0.8, 1.5), (0.01, 0.01)]
    texts = [t.get_text() for t in right.texts]
    assert "  1 s, 2 s end to end timed out" in texts
    assert any("no plan" in t.get_text() for t in left.texts)


def test_budget_figure_names_a_proposer_without_any_plan_instead_of_a_legend_entry():
    sweep = pd.DataFrame(
        {
            "proposer": ["a", "a", "u", "u"],
            "hbm_cap_gb": [1.0, 0.5, 1.0, 0.5],
            "perf_rating": [2.0, 3.0, math.nan, math.nan],
        }
    )
    fig = plots.rating_vs_budget(sweep)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["a"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["a"]
    assert ax.get_title().endswith("no plan at any budget: u)")


def test_rank_loads_draws_a_capacity_on_the_bars_scale_and_names_one_far_above():
    loads = pd.DataFrame({"perf": [1.0, 3.0], "hbm_gb": [0.9, 1.0], "ddr_gb": [1.0, 2.0]})
    fig = plots.rank_loads_figure(loads, {"hbm": 1.02, "ddr": 128.0})
    perf, hbm, ddr = fig.axes[:3]
    assert "slowest: rank 1" in perf.get_title() and perf.get_legend() is None
    assert [line.get_ydata()[0] for line in hbm.lines] == [1.02] and hbm.get_ylim()[1] > 1.02
    assert not ddr.lines and ddr.get_title() == "DDR per rank (capacity 128 GiB, off scale)"


def test_empty_or_planless_input_is_refused():
    with pytest.raises(ValueError, match="table is empty"):
        plots.knapsack_heatmap(pd.DataFrame())
    with pytest.raises(ValueError, match=r"no proposer found a plan, nothing to compare \(a: no plan"):
        plots.proposer_comparison(_comparison().assign(perf_rating=np.nan))

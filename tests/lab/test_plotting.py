"""embnb.lab.plotting: the shared palette, rank ticks and rank bars."""

import matplotlib
import pytest
import torch

from embnb.lab import plotting


def test_color_is_stable_per_name_and_cycles_for_unknown_names():
    assert plotting.color("hash_roundrobin", 5) == plotting.color("hash_roundrobin", 0)
    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    assert plotting.color("no such name", len(cycle) + 2) == cycle[2]


@pytest.mark.parametrize("num_ranks, most_labels", [(4, 4), (8, 8), (16, 8), (17, 6), (64, 8), (100, 8)])
def test_rank_ticks_never_label_more_than_eight_ranks(num_ranks, most_labels):
    fig = plotting.new_figure(4, 3)
    ax = fig.subplots()
    plotting.rank_ticks(ax, num_ranks)
    ticks = list(ax.get_xticks())
    assert ticks[0] == 0 and len(ticks) == most_labels
    assert all(0 <= t < num_ranks for t in ticks)
    assert ax.get_xlabel() == "rank"


def test_rank_bars_draws_one_panel_per_name_with_max_over_mean_titles():
    loads = {"roundrobin": [8, 0, 0, 0], "hash_roundrobin": torch.tensor([2, 2, 3, 1])}
    fig = plotting.rank_bars(loads, highlight={"roundrobin": [4, 0, 0, 0]}, title="t")
    axes = fig.get_axes()
    assert len(axes) == 2
    # max/mean computed here from the raw numbers, not by the plot code
    assert axes[0].get_title() == "roundrobin\nmax/mean 4.000"
    assert axes[1].get_title() == "hash_roundrobin\nmax/mean 1.500"
    heights = [p.get_height() for p in axes[0].patches]
    assert heights == [8, 0, 0, 0, 4, 0, 0, 0]  # bars, then the highlight
    assert fig.legends and fig._suptitle.get_text() == "t"
    assert axes[0].get_shared_y_axes().joined(axes[0], axes[1])
    mean_line = axes[1].lines[0]
    assert list(mean_line.get_ydata()) == [2.0, 2.0]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert sorted(legend) == ["all", "hottest key", "mean"]
    # each panel has its own colour, so the legend's "all" is neither
    patch = fig.legends[0].get_patches()[legend.index("all")]
    panel_colours = {tuple(ax.patches[0].get_facecolor()) for ax in axes}
    assert tuple(patch.get_facecolor()) not in panel_colours


def test_rank_bars_draws_the_floor_at_floor_times_the_mean():
    fig = plotting.rank_bars({"zipf": [6, 1, 1, 0]}, floor=2.5, title="t")
    (ax,) = fig.get_axes()
    heights = sorted({float(line.get_ydata()[0]) for line in ax.lines})
    assert heights == [2.0, 5.0]  # the mean 2 and the floor 2.5 * 2
    assert "hot-key floor" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_rank_bars_refuses_empty_input():
    with pytest.raises(ValueError, match="loads_by_name is empty"):
        plotting.rank_bars({})
    with pytest.raises(ValueError, match="loads of 'x' is empty"):
        plotting.rank_bars({"x": []})

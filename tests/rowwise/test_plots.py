"""embnb.rowwise.plots figures and the embnb.rowwise.widgets controls that redraw them."""

import io

import pytest
import torch
from matplotlib.figure import Figure

from embnb.rowwise import aliasing, plots, widgets

MODES = ["continuous", "roundrobin", "hash_roundrobin"]


@pytest.fixture(scope="module")
def table():
    return aliasing.load_table(
        ["uniform", "strided", "zipf"],
        MODES,
        [2, 4, 8],
        num_keys=4000,
        pattern_options={"zipf": {"alpha": 1.5}},
    )


def _png_bytes(fig):
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_load_heatmap_has_a_panel_per_world_size_and_one_colour_bar(table):
    fig = plots.load_heatmap(table)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 3 + 1  # three panels, one colour bar
    panels, colorbar = fig.axes[:3], fig.axes[3]
    assert [ax.get_title() for ax in panels] == [f"world_size = {w}" for w in (2, 4, 8)]
    assert colorbar.get_ylabel() == "max/mean"
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["uniform", "strided", "zipf"]
    assert [t.get_text() for t in panels[2].get_xticklabels()] == MODES
    # one annotation per cell; strided under roundrobin reads W
    assert len(_texts(panels[2])) == 3 * 3
    assert _texts(panels[2])[1 * 3 + 1] == "8.00"
    assert "1 = balanced" in fig._suptitle.get_text()
    assert _png_bytes(fig)[:8] == b"\x89PNG\r\n\x1a\n"


def test_load_heatmap_selects_and_orders(table):
    fig = plots.load_heatmap(
        table,
        world_sizes=[8],
        patterns=["zipf", "strided"],
        dist_types=["hash_roundrobin", "roundrobin"],
        value="spread_over_mean",
        title="custom",
    )
    assert len(fig.axes) == 2
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["zipf", "strided"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["hash_roundrobin", "roundrobin"]
    assert fig._suptitle.get_text() == "custom"
    assert fig.axes[1].get_ylabel() == "(max - min)/mean"


def test_load_heatmap_rejects_missing_data(table):
    with pytest.raises(ValueError, match="not in the data"):
        plots.load_heatmap(table, patterns=["snowflake"])
    with pytest.raises(ValueError, match="empty"):
        plots.load_heatmap(table.iloc[0:0])


def test_rank_load_bars_panel_per_dist_type_with_max_over_mean():
    counts = {"roundrobin": torch.tensor([800, 0, 0, 0]), "hash_roundrobin": [205, 190, 200, 205]}
    fig = plots.rank_load_bars(counts, title="strided")
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 2
    assert fig.axes[0].get_title() == "roundrobin\nmax/mean 4.00"
    assert fig.axes[1].get_title() == "hash_roundrobin\nmax/mean 1.02"
    assert [p.get_height() for p in fig.axes[0].patches] == [800, 0, 0, 0]
    mean_line = fig.axes[0].lines[0]
    assert list(mean_line.get_ydata()) == [200, 200]
    assert fig._suptitle.get_text() == "strided"
    assert fig.axes[0].get_shared_y_axes().joined(fig.axes[0], fig.axes[1])
    assert _png_bytes(fig)[:4] == b"\x89PNG"


def test_rank_load_bars_highlight_draws_over_the_bars():
    fig = plots.rank_load_bars(
        {"hash_roundrobin": [10, 50, 10]},
        highlight={"hash_roundrobin": [0, 40, 0]},
        highlight_label="hottest key",
    )
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [10, 50, 10, 0, 40, 0]
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "hottest key" in labels and "mean" in labels


def test_rank_load_bars_rejects_empty_input():
    with pytest.raises(ValueError, match="empty"):
        plots.rank_load_bars({})
    with pytest.raises(ValueError, match="empty"):
        plots.rank_load_bars({"roundrobin": []})


def test_max_over_mean_vs_world_size_panel_per_pattern(table):
    fig = plots.max_over_mean_vs_world_size(table, ["strided", "zipf"], title="t")
    assert len(fig.axes) == 2
    assert [ax.get_title() for ax in fig.axes] == ["strided", "zipf"]
    labels = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert labels == ["W (all on one rank)", "1 (balanced)", "hot-key floor", *MODES]
    roundrobin = next(line for line in fig.axes[0].lines if line.get_label() == "roundrobin")
    assert list(roundrobin.get_xdata()) == [2, 4, 8]
    assert list(roundrobin.get_ydata()) == [2.0, 4.0, 8.0]  # strided: all on one rank
    _png_bytes(fig)


def test_max_over_mean_vs_world_size_without_floor_column(table):
    fig = plots.max_over_mean_vs_world_size(table.drop(columns="hot_key_floor"), ["zipf"])
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert "hot-key floor" not in labels


def test_load_explorer_redraws_on_every_control():
    explorer = widgets.load_explorer(
        ["strided", "zipf"], MODES, world_size=8, num_keys=4000, pattern_options={"zipf": {"alpha": 1.5}}
    )
    assert explorer.dist_type.options == tuple(MODES)
    assert explorer.pattern.options == ("strided", "zipf")
    first = explorer.figure
    assert isinstance(first, Figure)
    assert first.axes[0].get_title().startswith("hash_roundrobin\nmax/mean")

    explorer.dist_type.value = "roundrobin"
    assert explorer.figure is not first
    assert explorer.figure.axes[0].get_title() == "roundrobin\nmax/mean 8.00"

    explorer.world_size.value = 4
    assert len(explorer.figure.axes[0].patches) == 4 * 2  # bars + hottest-key bars
    assert explorer.figure.axes[0].get_title() == "roundrobin\nmax/mean 4.00"

    explorer.pattern.value = "zipf"
    explorer.num_keys.value = 2000
    assert explorer.figure._suptitle.get_text() == "zipf, 2,000 keys, world_size=4"
    heights = [p.get_height() for p in explorer.figure.axes[0].patches]
    assert sum(heights[:4]) == 2000


def test_load_explorer_widget_is_displayable_without_a_kernel():
    explorer = widgets.load_explorer(["uniform"], ["hash_roundrobin"], num_keys=1000)
    bundle = explorer._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert explorer.widget.children[-1] is explorer.output
    with pytest.raises(ValueError, match="must not be empty"):
        widgets.load_explorer([], ["roundrobin"])

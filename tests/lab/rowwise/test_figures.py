"""embnb.lab.rowwise.figures and the embnb.lab.rowwise.explore controls that redraw."""

import io

import pandas as pd
import pytest
from matplotlib.figure import Figure

from embnb.lab.rowwise import aliasing, explore, figures

MODES = ["continuous", "roundrobin", "hash_roundrobin"]


@pytest.fixture(scope="module")
def table():
    options = {"zipf": {"alpha": 1.5}, "strided": {"stride": 8}}  # W | 8: all on one rank
    streams = aliasing.KeyStreams(["uniform", "strided", "zipf"], pattern_options=options)
    return aliasing.load_table(streams, MODES, [2, 4, 8], num_keys=4000)


def _png_bytes(fig):
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def test_load_heatmap_has_a_panel_per_world_size_and_one_colour_bar(table):
    fig = figures.load_heatmap(table)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 3 + 1  # three panels, one colour bar
    panels, colorbar = fig.axes[:3], fig.axes[3]
    assert [ax.get_title() for ax in panels] == [f"world_size = {w}" for w in (2, 4, 8)]
    assert colorbar.get_ylabel() == "max/mean"
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["uniform", "strided", "zipf"]
    assert [t.get_text() for t in panels[2].get_xticklabels()] == MODES
    texts = [t.get_text() for t in panels[2].texts]  # one annotation per cell; strided under roundrobin: W
    assert len(texts) == 3 * 3 and texts[1 * 3 + 1] == "8.00"
    assert "1 = balanced" in fig._suptitle.get_text()
    assert _png_bytes(fig)[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="empty"):
        figures.load_heatmap(table.iloc[0:0])


def test_zipf_seeds_figure_has_a_panel_per_traffic_and_a_dot_per_seed():
    zipf = aliasing.zipf_over_seeds(4000, 4, MODES, range(3), [1.5], keys_per_step=1000)
    fig = figures.zipf_seeds_figure(zipf)
    assert [ax.get_title() for ax in fig.axes] == ["all lookups", "deduplicated per step"]
    dots = sum(len(c.get_offsets()) for c in fig.axes[0].collections if len(c.get_offsets()) > 0)
    assert dots >= 3 * len(MODES)  # a dot per seed and dist_type (the median markers add their own)
    assert _png_bytes(fig)[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_replay_figure_has_a_panel_per_stream_at_one_world_size_and_names_its_device():
    rows = [
        {"case": c, "world_size": w, "routing": r, "rank": k, "ids": 1, "lookup_ms": 1.0}
        | {"lookup_ms_low": 0.5, "lookup_ms_high": 2.0}
        for c in ("hashed", "strided")
        for w in (2, 3)
        for r in ("continuous", "roundrobin")
        for k in range(w)
    ]
    fig = figures.routed_loads_figure(pd.DataFrame(rows), device="CPU (x)")
    assert [ax.get_title() for ax in fig.axes] == ["hashed ids", "strided ids"]
    assert fig._suptitle.get_text().startswith("W = 3,") and "CPU (x)" in fig._suptitle.get_text()


def test_load_explorer_redraws_on_every_control():
    explorer = explore.LoadExplorer(
        aliasing.KeyStreams(["strided", "zipf"], pattern_options={"zipf": {"alpha": 1.5}}),
        MODES,
        world_size=8,
        num_keys=4000,
    )
    controls = explorer.controls
    assert controls["dist_type"].options == tuple(MODES)
    assert controls["pattern"].options == ("strided", "zipf")
    first = explorer.figure
    assert isinstance(first, Figure)
    assert first.axes[0].get_title().startswith("hash_roundrobin\nmax/mean")

    controls["dist_type"].value = "roundrobin"
    assert explorer.figure is not first
    # strided keys k * 12 at W=8: ranks 0 and 4 only, so max/mean is gcd(12, 8) = 4
    assert explorer.figure.axes[0].get_title().startswith("roundrobin\nmax/mean 4.0")
    assert explorer.figure._suptitle.get_text().endswith("world_size=8, roundrobin")

    controls["world_size"].value = 4
    assert len(explorer.figure.axes[0].patches) == 4 * 2  # bars + hottest-key bars
    assert explorer.figure.axes[0].get_title() == "roundrobin\nmax/mean 4.000"  # 4 divides 12

    controls["pattern"].value = "zipf"
    controls["num_keys"].value = 2000
    assert explorer.figure._suptitle.get_text() == "zipf, 2,000 keys, world_size=4, roundrobin"
    heights = [p.get_height() for p in explorer.figure.axes[0].patches]
    assert sum(heights[:4]) == 2000
    assert explorer.error is None


def test_load_explorer_shows_a_bad_value_instead_of_raising():
    explorer = explore.LoadExplorer(aliasing.KeyStreams(["strided"]), MODES, world_size=8, num_keys=4000)
    before = explorer.figure
    # strided keys need offset < stride; an option the generator refuses
    explorer.streams.pattern_options["strided"] = {"stride": 5, "offset": 9}
    explorer.controls["num_keys"].value = 2000
    assert explorer.error.startswith("ValueError: offset must be an int in [0, 4], got 9")
    assert "offset must be an int in" in explorer.status.value
    assert explorer.figure is before  # the last good figure stays


def test_load_explorer_widget_is_displayable_without_a_kernel():
    explorer = explore.LoadExplorer(aliasing.KeyStreams(["uniform"]), ["hash_roundrobin"], num_keys=1000)
    assert "application/vnd.jupyter.widget-view+json" in explorer._repr_mimebundle_()
    assert explorer.widget.children[-1] is explorer.output
    with pytest.raises(ValueError, match="must not be empty"):
        explore.LoadExplorer(aliasing.KeyStreams([]), ["roundrobin"])

"""embnb.lab.balancing.plots.flops_vs_length: one row of panels per batch."""

import pytest

from embnb.lab.balancing import plots


def test_one_row_per_batch_each_with_its_points_and_bars():
    rows = {
        "zipf": ([1, 2, 40], [10.0, 20.0, 900.0], {"tokens": 1.5, "flops": 1.1}),
        "lognormal": ([100, 120], [1e3, 1.3e3], {"tokens": 1.2, "flops": 1.0}),
    }
    fig = plots.flops_vs_length(rows, title="counted")
    assert fig._suptitle.get_text() == "counted"
    assert [sub._suptitle.get_text() for sub in fig.subfigs] == ["zipf", "lognormal"]
    for sub, (lengths, flops, max_over_mean) in zip(fig.subfigs, rows.values()):
        points, bars = sub.axes
        assert list(points.lines[0].get_xdata()) == lengths and list(points.lines[0].get_ydata()) == flops
        assert [p.get_height() for p in bars.patches] == list(max_over_mean.values())
    with pytest.raises(ValueError, match="empty"):
        plots.flops_vs_length({})
    with pytest.raises(ValueError, match="2 lengths but 1 flops"):
        plots.flops_vs_length({"x": ([1, 2], [1.0], {})})


@pytest.mark.parametrize("clock, named", [("cpu", "thread CPU"), ("wall", "synchronized wall")])
def test_the_measured_speedups_legend_names_the_clock_the_steps_were_read_on(clock, named):
    import pandas as pd

    rows = [
        {"distribution": "zipf", "world_size": 2, "method": m, "measured": s, "flop_model": f, "bound": 2.0}
        for m, s, f in [("contiguous", 1.0, 1.0), ("kk_swap", 1.5, 1.8)]
    ]
    fig = plots.measured_speedups(pd.DataFrame([{**r, "clock": clock} for r in rows]), ["kk_swap"])
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"measured (slowest rank, {named})" in labels, labels

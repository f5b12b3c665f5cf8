"""embnb.lab.balancing.plots: the gap panels (at most 4, ties side by side) and time against work."""

import pandas as pd
import pytest

from embnb.balancing.lengths import LengthDistribution
from embnb.lab.balancing import comparison, plots

METHODS = ["contiguous", "greedy_lpt", "karmarkar_karp", "kk_swap"]


def test_gap_panels_one_per_workload_with_every_method_beside_the_others():
    distributions = {"zipf": LengthDistribution("zipf", alpha=1.5), "lognormal": LengthDistribution()}
    table = comparison.comparison_table(distributions, [256], [8], [0, 1], 1024, flops_dims=(16, 32))
    fig = plots.gap_panels(table, METHODS, title="t")
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 4
    for ax in visible:
        points = [line for line in ax.lines if line.get_marker() not in ("None", "", None)]
        assert len(points) == len(METHODS)
        xs = [line.get_xdata()[0] for line in points]
        assert len(set(xs)) == len(METHODS)  # a tie is two markers at one height, not one on top
        assert len({line.get_marker() for line in points}) == len(METHODS)
    with pytest.raises(ValueError, match="1 to 4"):
        plots.gap_panels(table.iloc[0:0], METHODS)


def test_time_vs_work_draws_each_source_with_its_fit():
    ranks = pd.DataFrame(
        [
            {"source": s, "ms": k * g + (1 - k) * 10, "gflops": g}
            for s, k in (("a", 1.0), ("b", 0.0))
            for g in (1, 2, 3)
        ]
    )
    fig = plots.time_vs_work(ranks)
    assert len(fig.axes) == 2
    assert "fixed 0% of the mean rank" in fig.axes[0].get_title()
    assert "fixed 100% of the mean rank" in fig.axes[1].get_title()

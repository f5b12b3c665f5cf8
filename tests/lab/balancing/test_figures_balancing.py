"""embnb.lab.balancing.figures: the gap panels (at most 4, ties side by side), the timeline, and
time against work."""

import pandas as pd
import pytest

from embnb.balancing.lengths import LengthDistribution
from embnb.lab.balancing import comparison, figures, measured

METHODS = ["contiguous", "greedy_lpt", "karmarkar_karp", "kk_swap"]


def _markers(ax):
    return [line for line in ax.lines if line.get_marker() not in ("None", "") and len(line.get_xdata())]


def test_gap_panels_one_per_workload_with_every_method_beside_the_others():
    distributions = {"zipf": LengthDistribution("zipf", alpha=1.5), "lognormal": LengthDistribution()}
    table = comparison.comparison_table(distributions, [256], [8], [0, 1], 1024, flops_dims=(16, 32))
    fig = figures.gap_figure(table, METHODS)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 4
    for ax in visible:
        points = _markers(ax)
        assert len(points) == len(METHODS)
        xs = [float(p.get_xdata()[0]) for p in points]
        assert len(set(xs)) == len(METHODS)  # a tie is two markers at one height, not one on top
        assert len({p.get_marker() for p in points}) == len(METHODS)
        # each method's worst gap over the seeds, floored at the "at the bound" line
        ys = sorted(float(p.get_ydata()[0]) for p in points)
        name, workload = ax.get_title().split(", ")
        rows = table[(table.distribution == name) & (table.workload == workload)]
        worst = rows.groupby("method")["gap_to_lower_bound"].max().clip(lower=figures.AT_THE_BOUND)
        assert ys == pytest.approx(sorted(worst))
    with pytest.raises(ValueError, match="1 to 4"):
        figures.gap_figure(table.iloc[0:0], METHODS)


def test_timeline_draws_a_bar_per_phase_span_and_names_an_empty_run():
    spans = [
        {
            "phase": "forward",
            "rank": r,
            "start": 0.001 * r,
            "end": 0.002 + 0.001 * r,
            "thread": t,
            "iteration": 1,
            "step": 1,
        }
        for r in (0, 1)
        for t in ("main", "worker")
    ]
    fig = figures.timeline({"sync": spans}, steps=[1])
    assert len(fig.axes[0].collections) == 4
    with pytest.raises(ValueError, match="run 'sync' has no spans"):
        figures.timeline({"sync": spans}, steps=[2])


def test_time_vs_work_draws_each_source_with_its_fit():
    ranks = pd.DataFrame(
        [
            {"source": s, "ms": k * g + (1 - k) * 10, "gflops": g}
            for s, k in (("a", 1.0), ("b", 0.0))
            for g in (1, 2, 3)
        ]
    )
    fits = measured.time_vs_work(ranks)
    assert fits.loc[["a", "b"], "fixed_share"].tolist() == pytest.approx([0, 1], abs=1e-9)
    fig = figures.time_vs_work_figure(ranks, fits)
    assert len(fig.axes) == 2
    for ax, source in zip(fig.axes, ["a", "b"]):  # the dashed line: the fitted fixed ms
        assert ax.lines[-1].get_ydata()[0] == pytest.approx(fits.loc[source, "fixed_ms"], abs=1e-9)
    # a fifth committed run wraps to a second row instead of failing the appendix
    many = pd.DataFrame([{"source": f"s{i}", "ms": 1.0 + g, "gflops": g} for i in range(5) for g in (1, 2)])
    assert len(figures.time_vs_work_figure(many, measured.time_vs_work(many)).axes) == 5

"""Figures of notebook 04 and appendix 04a: each takes data and returns a Figure (the shared style
is `embnb.lab.plotting`). The standard ones are seaborn's; the timeline is drawn by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from embnb.balancing.timeline import phase_seconds
from embnb.lab.plotting import MEAN_STYLE, color, new_figure

__all__ = ["gap_figure", "timeline", "time_vs_work_figure"]

# seaborn's "deep" palette, a phase each; loading grey, the loop's wait black
PHASES = ["forward", "all_reduce", "backward", "kk", "gather_workloads", "exchange", "optimizer"]
PHASE_COLORS = dict(zip(PHASES, sns.color_palette("deep").as_hex())) | {"load": "#c7c7c7", "wait": "#000000"}
AT_THE_BOUND = 1e-5  # a gap of 0 drawn here, on its own labelled line of the log axis
MARKERS = "osD^v"  # a method each: as many methods as markers at most


def gap_figure(table: pd.DataFrame, methods: Sequence[str]) -> Figure:
    """A panel per (distribution, workload), at most 4: each method's worst gap over seeds to the lower
    bound max(mean, largest item) per batch (samples into parts), on a log axis, a gap of 0 on the
    "at the bound" line; the methods side by side with their own markers, so a tie shows as two
    markers at one height. `table`: `comparison.comparison_table`'s. Raises ValueError past 4 panels."""
    keys = ["distribution", "workload", "num_samples", "num_parts", "method"]
    worst = table.groupby(keys, sort=False)["gap_to_lower_bound"].max().clip(lower=AT_THE_BOUND).reset_index()
    worst["batch"] = worst["num_samples"].astype(str) + "\ninto " + worst["num_parts"].astype(str)
    if not 0 < len(worst.groupby(["distribution", "workload"])) <= 4:
        raise ValueError(f"need 1 to 4 (distribution, workload) pairs, got {len(worst.groupby(keys[:2]))}")
    grid = sns.catplot(
        worst,
        x="batch",
        y="gap_to_lower_bound",
        hue="method",
        hue_order=methods,
        row="distribution",
        col="workload",
        kind="point",
        dodge=0.6,
        linestyle="none",
        errorbar=None,
        markers=list(MARKERS),
        palette=[color(m, i) for i, m in enumerate(methods)],
        log_scale=(False, True),
        height=3,
        aspect=1.45,
    )
    grid.refline(y=AT_THE_BOUND, color="0.6", linestyle="-", linewidth=0.8)
    grid.set_titles("{row_name}, {col_name}").set_axis_labels("", "worst gap over seeds to the bound")
    for ax in grid.axes.flat:
        ax.annotate("at the bound", (-0.45, AT_THE_BOUND), fontsize=7, va="bottom")
        ax.yaxis.set_major_formatter(
            FuncFormatter(lambda y, _: f"{100 * y:.3g}%" if y >= AT_THE_BOUND else "")
        )
    plt.close(grid.figure)  # drawn where it is displayed, not by pyplot at the end of the cell
    return grid.figure


def timeline(spans_by_run: Mapping[str, Sequence[Mapping[str, Any]]], steps: Sequence[int]) -> Figure:
    """One panel per run: per rank a row for its training loop and one below for its shuffle worker,
    a bar per phase, in ms from the run's first span; a bracket above each iteration. Spans need
    phase, rank, start, end (seconds), thread and iteration; only iterations in `steps` are drawn.
    The legend gives each (phase, thread)'s ms per drawn step (mean over steps and ranks). Raises ValueError
    on a run with no span to draw."""
    fig = new_figure(12, 0.9 + 2.3 * len(spans_by_run))
    axes = fig.subplots(len(spans_by_run), 1, squeeze=False)[:, 0]
    for ax, (name, all_spans) in zip(axes, spans_by_run.items()):
        spans = [s for s in all_spans if s["iteration"] in steps]
        if not spans:
            raise ValueError(f"run {name!r} has no spans to draw")
        t0, ranks = min(s["start"] for s in spans), sorted({s["rank"] for s in spans})
        for s in spans:
            x, width, row = (s["start"] - t0) * 1e3, (s["end"] - s["start"]) * 1e3, ranks.index(s["rank"])
            if s["phase"] == "step":  # the iteration's extent, as a bracket above the loop's row
                ax.annotate(f"step {s['iteration']}", (x, row - 0.45), fontsize=7, va="bottom")
                ax.plot([x, x + width], [row - 0.42] * 2, color="0.4", linewidth=0.8)
            else:
                y, h = (row + 0.3, 0.22) if s.get("thread") == "worker" else (row - 0.1, 0.5)
                shade = PHASE_COLORS.get(s["phase"], "0.5")
                ax.broken_barh([(x, max(width, 1e-3))], (y - h / 2, h), color=shade)
        rows = ((-0.1, "loop"), (0.3, "worker"))
        ticks = {r + dy: f"rank {rank} {what}" for r, rank in enumerate(ranks) for dy, what in rows}
        ax.set_yticks(list(ticks), list(ticks.values()), fontsize=8)
        ax.set(ylim=(len(ranks) - 0.4, -0.6), xlabel="ms")
        ax.set_title(name, loc="left", fontsize=10)
        phases = phase_seconds([dict(s, warmup=False) for s in spans], steps, len(ranks))
        handles = [  # a phase in each thread it ran in
            Patch(color=PHASE_COLORS.get(phase, "0.5"), label=f"{phase} ({thread}): {1e3 * seconds:.1f} ms")
            for (thread, phase), seconds in phases.items()
            if phase != "step"
        ]
        ax.legend(
            handles=handles,
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            title="ms per drawn step",
            title_fontsize=7,
        )
    return fig


def time_vs_work_figure(ranks: pd.DataFrame, fits: pd.DataFrame) -> Figure:
    """A panel per source, 4 to a row: each measured rank's ms against its GFLOPs with the least
    squares line, and the fitted fixed part dashed (where it is most of a rank's time, the step
    follows overhead, not work). `ranks`: rows of source, ms, gflops; `fits`: `measured.time_vs_work`
    of them."""
    grid = sns.lmplot(
        ranks,
        x="gflops",
        y="ms",
        col="source",
        hue="source",
        col_order=list(fits.index),
        col_wrap=4,
        ci=None,
        truncate=False,
        height=3.3,
        facet_kws={"sharex": False, "sharey": False},
        scatter_kws={"s": 8},
    )
    for ax, (source, fit) in zip(grid.axes.flat, fits.iterrows()):
        ax.axhline(fit["fixed_ms"], **MEAN_STYLE)
        ax.set(xlim=(0, None), ylim=(0, None), xlabel="GFLOPs of the rank", ylabel="ms of the rank")
        ax.set_title(f"{source}\nfixed {fit['fixed_share']:.0%}, r = {fit['r']:.2f}", fontsize=9)
    plt.close(grid.figure)
    return grid.figure

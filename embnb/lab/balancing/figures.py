"""Figures of notebook 04 and appendix 04a: each takes data and returns a Figure (the shared style
is `embnb.lab.plotting`). The standard ones are seaborn's; the timeline is drawn by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from embnb.balancing.timeline import phase_seconds
from embnb.lab.plotting import MEAN_STYLE, color, new_figure

__all__ = ["gap_figure", "timeline", "time_vs_work_figure"]

PHASE_COLORS = {
    "load": "#c7c7c7", "gather_workloads": "#8172b3", "kk": "#c44e52", "exchange": "#937860",
    "forward": "#4c72b0", "backward": "#55a868", "wait": "#000000", "all_reduce": "#dd8452",
    "optimizer": "#da8bc3",
}  # fmt: skip
AT_THE_BOUND = 1e-5  # a gap of 0 drawn here, on its own labelled line of the log axis
MARKERS = "osD^v"


def gap_figure(table: pd.DataFrame, methods: Sequence[str]) -> Figure:
    """One panel per (distribution, workload), at most 4: each method's worst gap to the lower bound
    max(mean, largest item) over seeds, per batch (samples into parts), on a log axis; the methods
    side by side, each with its own marker, so a tie shows as two markers at one height. Raises
    ValueError on more than 4 panels or none. `table` is `comparison.comparison_table`'s."""
    worst = table.groupby(["distribution", "workload", "num_samples", "num_parts", "method"], sort=False)
    worst = worst["gap_to_lower_bound"].max().clip(lower=AT_THE_BOUND).reset_index()
    worst["batch"] = worst["num_samples"].astype(str) + "\ninto " + worst["num_parts"].astype(str)
    cases = worst.groupby(["distribution", "workload"], sort=False)
    if not 0 < cases.ngroups <= 4:
        raise ValueError(f"need 1 to 4 (distribution, workload) pairs, got {cases.ngroups}")
    fig = new_figure(9, 6.4 if cases.ngroups > 2 else 3.4)
    axes = fig.subplots(-(-cases.ngroups // 2), min(2, cases.ngroups), squeeze=False, sharey=True).ravel()
    for i, (ax, ((name, workload), rows)) in enumerate(zip(axes, cases)):
        sns.pointplot(
            rows, x="batch", y="gap_to_lower_bound", hue="method", hue_order=methods, ax=ax, dodge=0.6,
            palette=[color(m, j) for j, m in enumerate(methods)], markers=list(MARKERS[: len(methods)]),
            linestyle="none", errorbar=None, log_scale=(False, True), legend=i == 0,
        )  # fmt: skip
        ax.axhline(AT_THE_BOUND, color="0.6", linewidth=0.8)
        ax.annotate("at the bound", (-0.45, AT_THE_BOUND), fontsize=7, va="bottom")
        ax.yaxis.set_major_formatter(
            FuncFormatter(lambda y, _: "" if y < AT_THE_BOUND else f"{100 * y:.3g}%")
        )
        ax.tick_params(axis="x", labelsize=8)
        ax.set(title=f"{name}, {workload}", xlabel=None, ylabel="worst gap over seeds to the bound")
    for ax in axes[cases.ngroups :]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].get_legend().remove()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(methods), fontsize=8)
    return fig


def timeline(
    spans_by_run: Mapping[str, Sequence[Mapping[str, Any]]], steps: Sequence[int] | None = None
) -> Figure:
    """One panel per run: per rank a row for its training loop and a row below for its shuffle
    worker, a bar per phase, time in ms from the run's first span, the step labels above each
    iteration. Spans need phase, rank, start, end (seconds), thread and iteration; `steps` keeps
    those iterations. The legend gives each phase's ms per drawn step (mean over steps and ranks).
    Raises ValueError on no run, or a run with no span to draw."""
    if not spans_by_run:
        raise ValueError("spans_by_run is empty: nothing to plot")
    fig = new_figure(12, 0.9 + 2.3 * len(spans_by_run))
    for ax, (name, all_spans) in zip(
        fig.subplots(len(spans_by_run), 1, squeeze=False)[:, 0], spans_by_run.items()
    ):
        spans = [s for s in all_spans if steps is None or s["iteration"] in steps]
        if not spans:
            raise ValueError(f"run {name!r} has no spans to draw")
        t0, ranks = min(s["start"] for s in spans), sorted({s["rank"] for s in spans})
        for s in spans:
            left, width, row = (
                (s["start"] - t0) * 1e3,
                max((s["end"] - s["start"]) * 1e3, 1e-3),
                ranks.index(s["rank"]),
            )
            if s["phase"] == "step":  # the iteration's extent, as a bracket above the loop's row
                ax.annotate(f"step {s['iteration']}", (left, row - 0.45), fontsize=7, va="bottom")
                ax.plot([left, left + width], [row - 0.42] * 2, color="0.4", linewidth=0.8)
            else:
                y, height = (row + 0.3, 0.22) if s.get("thread") == "worker" else (row - 0.1, 0.5)
                ax.broken_barh(
                    [(left, width)], (y - height / 2, height), color=PHASE_COLORS.get(s["phase"], "0.5")
                )
        ticks = [
            (r + dy, f"rank {rank} {what}")
            for r, rank in enumerate(ranks)
            for dy, what in ((-0.1, "loop"), (0.3, "worker"))
        ]
        ax.set_yticks(*zip(*ticks), fontsize=8)
        ax.set(ylim=(len(ranks) - 0.4, -0.6), xlabel="ms")
        ax.set_title(name, loc="left", fontsize=10)
        drawn = sorted({s["iteration"] for s in spans})
        ms = phase_seconds([dict(s, warmup=False) for s in spans], drawn, len(ranks))
        labels = {}
        for (thread, phase), seconds in ms.items():
            labels.setdefault(phase, []).append(
                f"{1e3 * seconds:.1f}" + (" (worker)" if thread == "worker" else "")
            )
        handles = [
            Patch(color=PHASE_COLORS.get(p, "0.5"), label=f"{p}: {', '.join(labels.get(p, []))} ms")
            for p in dict.fromkeys(s["phase"] for s in spans if s["phase"] != "step")
        ]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  title="ms per drawn step", title_fontsize=7)  # fmt: skip
    return fig


def time_vs_work_figure(ranks: pd.DataFrame, fits: pd.DataFrame) -> Figure:
    """One panel per source (at most 4): each measured rank's ms against its GFLOPs, the least
    squares line, and the fitted fixed part dashed (where it is most of a rank's time, the step
    follows overhead, not work). `ranks`: rows of source, ms, gflops; `fits`: `cost_fit.time_vs_work`
    of them. Raises ValueError on more than 4 sources or none."""
    if not 0 < len(fits) <= 4:
        raise ValueError(f"need 1 to 4 sources, got {len(fits)}")
    fig = new_figure(3.3 * len(fits), 3.4)
    for i, (ax, (source, fit)) in enumerate(
        zip(fig.subplots(1, len(fits), squeeze=False)[0], fits.iterrows())
    ):
        rows = ranks[ranks["source"] == source]
        sns.regplot(rows, x="gflops", y="ms", ax=ax, ci=None, truncate=False, color=color(source, i),
                    scatter_kws={"s": 8, "alpha": 0.5}, line_kws={"color": "black", "lw": 1})  # fmt: skip
        ax.axhline(fit["fixed_ms"], **MEAN_STYLE)
        ax.set(xlabel="GFLOPs of the rank", ylabel="ms of the rank", xlim=(0, None), ylim=(0, None))
        ax.set_title(f"{source}\nfixed {fit['fixed_share']:.0%}, r = {fit['r']:.2f}", fontsize=9)
    return fig

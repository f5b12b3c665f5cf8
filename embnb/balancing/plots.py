"""Figures of notebook 04 (batch balancing): each takes data, returns a Figure.

The shared style is `embnb.plotting`; per-rank loads are its `rank_bars`.

    fig = length_histogram(lengths)                      # the heavy tail
    fig = gap_by_method(table)                            # KK vs LPT vs ...
    fig = flops_vs_length(lengths, flops, {...})          # what to balance
    fig = gantt({"sync": spans, "overlap": spans})        # timelines
    fig = collective_calls({"per key": 7, "fused": 2})
    fig = step_speedups(runs.speedups("no balancing"), "no balancing")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, PercentFormatter

from embnb.plotting import color, new_figure, values_of

if TYPE_CHECKING:
    from embnb.balancing.training import RunSummary
    from embnb.timing import Ratio

__all__ = [
    "PHASE_COLORS",
    "length_histogram",
    "gap_by_method",
    "flops_vs_length",
    "gantt",
    "collective_calls",
    "step_speedups",
]

PHASE_COLORS = {  # Gantt chart phases
    "load": "#c7c7c7",
    "gather_workloads": "#8172b3",
    "kk": "#c44e52",
    "wait_kk": "#000000",
    "exchange": "#937860",
    "forward": "#4c72b0",
    "backward": "#55a868",
}


def length_histogram(lengths: Sequence[int] | torch.Tensor, title: str | None = None) -> Figure:
    """Counts of each sequence length on log-log axes (a power law is a line),
    and the share of all tokens held by the longest samples."""
    values = sorted(values_of(lengths, "lengths"))
    fig = new_figure(9, 3.2)
    ax, share_ax = fig.subplots(1, 2)
    counts = pd.Series(values).value_counts().sort_index()
    ax.loglog(counts.index, counts.values, ".", color="#4c72b0")
    ax.set_xlabel("sequence length")
    ax.set_ylabel("samples")
    ax.set_title("length distribution")
    total = sum(values)
    longest_first = values[::-1]
    cumulative = pd.Series(longest_first).cumsum() / total
    fractions = [(i + 1) / len(values) for i in range(len(values))]
    share_ax.plot(fractions, cumulative.values, color="#c44e52")
    share_ax.set_xscale("log")
    share_ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    share_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    share_ax.set_xlabel("longest samples (share of the batch)")
    share_ax.set_ylabel("share of all tokens")
    share_ax.set_title("the tail holds the tokens")
    if title:
        fig.suptitle(title)
    return fig


def gap_by_method(
    table: pd.DataFrame,
    value: str = "gap_to_lower_bound",
    methods: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Mean gap to the lower bound (log scale) of each method for each
    (num_samples, num_parts), with the 1% target. Needs columns
    num_samples, num_parts, method and `value` (e.g. from
    `embnb.balancing.partition.compare_methods`)."""
    if table.empty:
        raise ValueError("table is empty: nothing to plot")
    methods = list(methods or dict.fromkeys(table["method"]))
    grid = table.groupby(["num_samples", "num_parts", "method"])[value].mean().unstack("method")
    missing = [m for m in methods if m not in grid.columns]
    if missing:
        raise ValueError(f"methods {missing} not in the table; it has {list(grid.columns)}")
    grid = grid[methods]
    fig = new_figure(3.0 + 1.3 * len(grid), 3.8)
    ax = fig.subplots()
    width = 0.8 / len(methods)
    floor = 1e-5  # a perfect split (gap 0) still gets a visible stub on the log axis
    for i, method in enumerate(methods):
        xs = [x + (i - (len(methods) - 1) / 2) * width for x in range(len(grid))]
        ax.bar(xs, grid[method].clip(lower=floor), width, color=color(method, i), label=method)
    ax.axhline(0.01, color="black", linestyle="--", linewidth=1, label="1% target")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{100 * y:.3g}%"))
    ax.set_xticks(range(len(grid)), [f"{n} into {k}" for n, k in grid.index])
    ax.set_xlabel("samples into parts")
    ax.set_ylabel(value.replace("_", " "))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title or "largest part above max(mean, largest item)")
    return fig


def flops_vs_length(
    lengths: Sequence[int] | torch.Tensor,
    flops: Sequence[float] | torch.Tensor,
    flops_max_over_mean: Mapping[str, float] | None = None,
    title: str | None = None,
) -> Figure:
    """Left: FLOPs of each sample against its length (the quadratic bend).
    Right: max/mean FLOPs per rank when balancing by each estimate."""
    xs, ys = values_of(lengths, "lengths"), values_of(flops, "flops")
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} lengths but {len(ys)} flops")
    panels = 2 if flops_max_over_mean else 1
    fig = new_figure(4.2 * panels, 3.4)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    axes[0].loglog(xs, ys, ".", color="#4c72b0", alpha=0.5)
    axes[0].set_xlabel("sequence length")
    axes[0].set_ylabel("attention block FLOPs")
    axes[0].set_title("FLOPs per sample")
    if flops_max_over_mean:
        names = list(flops_max_over_mean)
        axes[1].bar(
            names, [flops_max_over_mean[n] for n in names], color=[color(n, i) for i, n in enumerate(names)]
        )
        axes[1].axhline(1.0, color="0.3", linestyle="--", linewidth=1)
        axes[1].set_ylabel("max/mean FLOPs per rank")
        axes[1].set_title("balanced by ...")
        for i, n in enumerate(names):
            axes[1].annotate(
                f"{flops_max_over_mean[n]:.3f}",
                (i, flops_max_over_mean[n]),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    if title:
        fig.suptitle(title)
    return fig


def gantt(
    spans_by_run: Mapping[str, Sequence[Mapping[str, Any]]],
    steps: Sequence[int] | None = None,
    title: str | None = None,
) -> Figure:
    """One panel per run: a row per rank (main thread) plus a thin row for
    its KK thread, bars per phase, time in ms from the run's first span.
    Spans need phase, rank, start, end (seconds); `steps` keeps the spans of
    those loop iterations (the "iteration" field, else "step")."""
    if not spans_by_run:
        raise ValueError("spans_by_run is empty: nothing to plot")
    names = list(spans_by_run)
    fig = new_figure(11, 0.8 + 1.9 * len(names))
    axes = fig.subplots(len(names), 1, squeeze=False)[:, 0]
    for ax, name in zip(axes, names):
        spans = [s for s in spans_by_run[name] if steps is None or s.get("iteration", s["step"]) in steps]
        if not spans:
            raise ValueError(f"run {name!r} has no spans to draw")
        t0 = min(s["start"] for s in spans)
        ranks = sorted({s["rank"] for s in spans})
        for s in spans:
            in_thread = s["phase"] == "kk" and s.get("thread") == "kk"
            y = ranks.index(s["rank"]) + (0.42 if in_thread else 0.0)
            height = 0.22 if in_thread else 0.55
            ax.broken_barh(
                [((s["start"] - t0) * 1e3, max((s["end"] - s["start"]) * 1e3, 1e-3))],
                (y - height / 2, height),
                color=PHASE_COLORS.get(s["phase"], "0.5"),
            )
        ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
        ax.invert_yaxis()
        ax.set_title(name, loc="left", fontsize=10)
        ax.set_xlabel("ms")
    present = dict.fromkeys(s["phase"] for run in spans_by_run.values() for s in run)
    axes[0].legend(
        handles=[Patch(color=PHASE_COLORS.get(p, "0.5"), label=p) for p in present],
        ncols=len(present),
        fontsize=8,
        loc="lower left",
        bbox_to_anchor=(0, 1.15),
    )
    if title:
        fig.suptitle(title)
    return fig


def collective_calls(calls: Mapping[str, float], title: str | None = None) -> Figure:
    """Bars of collective calls per way of gathering."""
    if not calls:
        raise ValueError("calls is empty: nothing to plot")
    names = list(calls)
    fig = new_figure(1.5 + 1.4 * len(names), 3.0)
    ax = fig.subplots()
    bars = ax.bar(names, [calls[n] for n in names], color=["#c44e52", "#55a868", "#4c72b0"][: len(names)])
    ax.bar_label(bars, fmt="%g")
    ax.set_ylabel("collective calls")
    ax.set_title(title or "all-gather of a batch's KJTs")
    return fig


def step_speedups(
    speedups: Mapping[str, Ratio],
    reference: str,
    summaries: Mapping[str, RunSummary] | None = None,
    title: str | None = None,
) -> Figure:
    """How much faster each run trained than `reference` (label ->
    `embnb.timing.Ratio`): the median over repeats, the range as an error
    bar; with `summaries`, each bar also notes the hidden share of KK time."""
    if not speedups:
        raise ValueError("speedups is empty: nothing to plot")
    labels = list(speedups)
    ratios = list(speedups.values())
    medians = [r.median for r in ratios]
    errors = [[r.median - r.low for r in ratios], [r.high - r.median for r in ratios]]
    fig = new_figure(1.5 + 1.7 * len(labels), 3.4)
    ax = fig.subplots()
    bars = ax.bar(labels, medians, yerr=errors, capsize=4, color=color(0), ecolor="#333333")
    ax.axhline(1.0, color="#555555", linestyle="--", linewidth=1)
    notes = []
    for label, r in speedups.items():
        hidden = summaries[label].hidden_fraction if summaries and label in summaries else None
        shown = hidden is not None and hidden == hidden  # None or NaN: this run has no KK
        notes.append(f"{r.median:.2f}x" + (f"\n{hidden:.0%} KK hidden" if shown else ""))
    ax.bar_label(bars, notes, fontsize=8, label_type="center", color="white")
    ax.set_ylabel(f"step speed-up vs {reference}")
    ax.tick_params(axis="x", labelrotation=15)
    repeats = ratios[0].repeats
    ax.set_title(title or f"speed-up over {repeats} repeats (bar: median, whisker: range)")
    return fig

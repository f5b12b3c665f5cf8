"""Figures of notebook 04's rank-by-rank measurements (`measured`): the
speed-ups at each W beside the FLOP model and the bound, and the
token cap beside the activation-bytes cap, with each rank's measured peak memory."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from embnb.lab.balancing.memory_cap import MIB, CapComparison
from embnb.lab.plotting import MEAN_STYLE, color, new_figure, rank_ticks

__all__ = ["measured_speedups", "cap_comparison"]


def measured_speedups(table: pd.DataFrame, methods: Sequence[str], title: str | None = None) -> Figure:
    """One panel per distribution: at each W, each method's measured
    speed-up over the loader's cut (filled dot) and the FLOP model's (open
    dot, same colour, beside it), and the bound's (black dash): no method
    beats it in FLOPs; a measured dot above it is ringed in red (time is
    not FLOPs: `cost_fit`); where `table` has `cost_fit`'s `fitted_model`
    column, a black cross on each measured dot's x marks what the fitted
    per-rank cost predicts, so a ringed dot is read against its cross.
    `table` is `BalancedSteps.speedups()` (or `cost_fit.with_explanations`')."""
    names = list(dict.fromkeys(table["distribution"]))
    fig = new_figure(5.2 * len(names), 3.8)
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    width = 0.8 / len(methods)
    for ax, name in zip(axes, names):
        rows = table[table["distribution"] == name]
        sizes = sorted(set(rows["world_size"]))
        for x, w in enumerate(sizes):
            at = rows[rows["world_size"] == w].set_index("method")
            ax.hlines(at["bound"].iloc[0], x - 0.45, x + 0.45, color="black", linewidth=2, zorder=3)
            for m, method in enumerate(methods):
                pos = x - 0.4 + width * (m + 0.5)
                measured = at.loc[method, "measured"]
                ax.plot(pos - width / 5, measured, "o", color=color(method, m), zorder=4)
                if measured > at.loc[method, "bound"]:  # the section's fit explains these
                    ax.plot(pos - width / 5, measured, "o", ms=11, mfc="none", color="red", zorder=5)
                if "fitted_model" in at:  # what the per-rank cost fit predicts, on the measured dot's x
                    ax.plot(pos - width / 5, at.loc[method, "fitted_model"], "x", color="black", zorder=6)
                ax.plot(
                    pos + width / 5,
                    at.loc[method, "flop_model"],
                    "o",
                    mfc="white",
                    color=color(method, m),
                    zorder=4,
                )
        ax.axhline(1.0, **MEAN_STYLE)
        ax.set_xticks(range(len(sizes)), [f"W={w}" for w in sizes])
        ax.set_xlim(-0.5, len(sizes) - 0.5)
        ax.set_ylabel("speed-up over the loader's cut")
        ax.set_title(name)
    handles = [
        Line2D([], [], marker="o", linestyle="", color=color(m, i), label=m) for i, m in enumerate(methods)
    ]
    handles += [
        Line2D([], [], marker="o", linestyle="", color="0.3", label="measured (slowest rank, thread CPU)"),
        Line2D(
            [], [], marker="o", linestyle="", mfc="white", color="0.3", label="FLOP model (max FLOPs ratio)"
        ),
        Line2D([], [], color="black", linewidth=2, label="bound (cut's max FLOPs / lower bound)"),
        Line2D(
            [],
            [],
            marker="o",
            ms=11,
            linestyle="",
            mfc="none",
            color="red",
            label="measured above the FLOP bound",
        ),
    ]
    if "fitted_model" in table:
        handles.append(
            Line2D(
                [],
                [],
                marker="x",
                linestyle="",
                color="black",
                label="fitted cost (FLOPs + lengths + tokens)",
            )
        )
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8)  # off the data
    if title:
        fig.suptitle(title)
    return fig


def cap_comparison(comparisons: Sequence[CapComparison], title: str) -> Figure:
    """One row per batch, one bar per run (uncapped KK + swaps, token cap,
    bytes cap) over the ranks: tokens with the token cap drawn, modelled
    activation MiB with the bytes cap drawn, and each rank's measured peak
    MiB with the uncapped run's largest peak drawn (what a cap should lower)."""
    if not comparisons:
        raise ValueError("comparisons is empty: nothing to plot")
    labels = ["uncapped", "token cap", "bytes cap"]
    fig = new_figure(12, 0.8 + 3.0 * len(comparisons))
    rows = fig.subplots(len(comparisons), 3, squeeze=False)
    width = 0.8 / len(labels)
    for (tokens_ax, model_ax, peak_ax), c in zip(rows, comparisons):
        for i, label in enumerate(labels):
            offsets = [r - 0.4 + width * (i + 0.5) for r in range(c.world_size)]
            shade = color(label, i)
            tokens_ax.bar(offsets, c.steps[label].tokens, width, color=shade, label=label)
            model_ax.bar(offsets, [b / MIB for b in c.modelled_bytes[label]], width, color=shade)
            peak_ax.bar(offsets, [b / MIB for b in c.peak_bytes[label]], width, color=shade)
        tokens_ax.axhline(c.token_cap, color="black", linewidth=1.5)
        model_ax.axhline(c.bytes_cap / MIB, color="black", linewidth=1.5)
        peak_ax.axhline(c.largest_peak_mib("uncapped"), **MEAN_STYLE)
        tokens_ax.set_ylabel(f"{c.distribution}\ntokens per rank\n(line: the token cap)")
        model_ax.set_ylabel("modelled activation MiB\n(line: the bytes cap)")
        peak_ax.set_ylabel("peak MiB, measured\n(dashed: uncapped largest)")
        for ax in (tokens_ax, model_ax, peak_ax):
            rank_ticks(ax, c.world_size)
            ax.set_ylim(bottom=0)
    fig.legend(*rows[0][0].get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle(title)
    return fig

"""Figures of notebook 04's rank-by-rank measurements (`measured`): the
speed-ups at each W beside the FLOP model and the bound, and the
memory-capped balance with each rank's measured peak memory."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from embnb.lab.balancing.measured import CappedRun
from embnb.lab.plotting import MEAN_STYLE, color, new_figure, rank_ticks

__all__ = ["measured_speedups", "capped_memory"]


def measured_speedups(table: pd.DataFrame, methods: Sequence[str], title: str | None = None) -> Figure:
    """One panel per distribution: at each W, each method's measured
    speed-up over the loader's cut (filled dot) and the FLOP model's (open
    dot, same colour, beside it), and the bound's (black dash): no method
    beats it in FLOPs; a measured dot above it is ringed in red (time is
    not FLOPs: `cost_fit`). `table` is `BalancedSteps.speedups()`."""
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
            label="measured above the FLOP bound (per-length cost, see the fit)",
        ),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=8)  # off the data
    if title:
        fig.suptitle(title)
    return fig


def capped_memory(run: CappedRun, title: str | None = None) -> Figure:
    """Two panels over the ranks of one batch, one bar per run (uncapped KK
    + swaps, then each capped method): tokens per rank with the cap drawn,
    and each rank's measured peak activation memory (MiB)."""
    labels = list(run.steps)
    fig = new_figure(11, 3.6)
    tokens_ax, memory_ax = fig.subplots(1, 2)
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        offsets = [r - 0.4 + width * (i + 0.5) for r in range(run.world_size)]
        shade = color(label if label != "uncapped" else "contiguous", i)
        tokens_ax.bar(offsets, run.steps[label].tokens, width, color=shade, label=label)
        memory_ax.bar(offsets, [b / 2**20 for b in run.peak_bytes[label]], width, color=shade)
    tokens_ax.axhline(run.cap, color="black", linestyle="-", linewidth=1.5, label=f"cap {run.cap:.0f} tokens")
    tokens_ax.axhline(run.mean_tokens, **MEAN_STYLE, label="mean tokens per rank")
    tokens_ax.set_ylabel("tokens per rank")
    memory_ax.set_ylabel("peak activation MiB (measured)")
    for ax in (tokens_ax, memory_ax):
        rank_ticks(ax, run.world_size)
        ax.set_ylim(bottom=0)
    fig.legend(loc="outside lower center", ncols=6, fontsize=8)  # below the panels, off the data
    fig.suptitle(
        title or f"{run.distribution}, W={run.world_size}: balanced by FLOPs, with and without a token cap"
    )
    return fig

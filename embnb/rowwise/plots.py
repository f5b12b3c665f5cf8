"""Figures of notebook 01 (row-wise routing): each takes data, returns a Figure.

Figures share the style of `embnb.plotting` (palette, rank bars).

    fig = load_heatmap(table)                        # notebook 01
    fig = embnb.plotting.rank_bars({"roundrobin": [8, 0, 0, 0], ...})  # per-rank load
    fig = max_over_mean_vs_world_size(table, ["strided", "zipf"])
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import seaborn as sns
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, StrMethodFormatter

from embnb.plotting import color, new_figure

__all__ = ["load_heatmap", "max_over_mean_vs_world_size"]

HEATMAP_CMAP = "rocket_r"  # light = balanced, dark = one rank does it all
VALUE_LABELS = {"max_over_mean": "max/mean", "spread_over_mean": "(max - min)/mean"}


def _ordered(values: Sequence, wanted: Sequence | None, what: str) -> list:
    present = list(dict.fromkeys(values))  # first-seen order
    if wanted is None:
        return present
    missing = [v for v in wanted if v not in present]
    if missing:
        raise ValueError(f"{what} {missing} not in the data; it has {present}")
    return list(wanted)


def _label(value: str) -> str:
    return VALUE_LABELS.get(value, value.replace("_", " "))


def load_heatmap(
    table: pd.DataFrame,
    value: str = "max_over_mean",
    world_sizes: Sequence[int] | None = None,
    patterns: Sequence[str] | None = None,
    dist_types: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Heatmap of `value` for pattern (rows) x dist_type (columns), one
    panel per world size, sharing one logarithmic colour bar from 1 to the
    largest world size (max/mean ranges from 1, balanced, to W, all keys on
    one rank). Needs columns pattern, dist_type, world_size and `value`.
    """
    if table.empty:
        raise ValueError("table is empty: nothing to plot")
    world_sizes = _ordered(sorted(table["world_size"].unique()), world_sizes, "world_sizes")
    patterns = _ordered(table["pattern"], patterns, "patterns")
    dist_types = _ordered(table["dist_type"], dist_types, "dist_types")
    vmax = max(float(max(world_sizes)), float(table[value].max()), 2.0)
    norm = LogNorm(vmin=1.0, vmax=vmax)

    num_panels = len(world_sizes)
    fig = new_figure(0.9 + 2.9 * num_panels, 0.9 + 0.45 * len(patterns))
    axes = fig.subplots(
        1,
        num_panels + 1,
        gridspec_kw={"width_ratios": [1.0] * num_panels + [0.06]},
    )
    panels, colorbar_ax = axes[:-1], axes[-1]
    for i, (ax, world_size) in enumerate(zip(panels, world_sizes)):
        rows = table[table["world_size"] == world_size]
        grid = rows.pivot_table(index="pattern", columns="dist_type", values=value, aggfunc="mean")
        grid = grid.reindex(index=patterns, columns=dist_types)
        sns.heatmap(
            grid,
            ax=ax,
            cmap=HEATMAP_CMAP,
            norm=norm,
            annot=True,
            fmt=".2f",
            annot_kws={"fontsize": 8},
            linewidths=0.5,
            linecolor="white",
            cbar=i == num_panels - 1,
            cbar_ax=colorbar_ax,
            cbar_kws={"label": _label(value)},
        )
        ax.set_title(f"world_size = {world_size}")
        ax.set_xlabel("dist_type")
        ax.set_ylabel("pattern" if i == 0 else "")
        ax.tick_params(axis="x", labelrotation=30)
        ax.tick_params(axis="y", labelrotation=0)
        if i:
            ax.set_yticklabels([])
    ticks = [t for t in (1, 1.5, 2, 4, 8, 16, 32, 64, 128) if t <= vmax]
    colorbar_ax.yaxis.set_major_locator(FixedLocator(ticks))
    colorbar_ax.yaxis.set_minor_locator(NullLocator())
    colorbar_ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    fig.suptitle(title or f"{_label(value)} of keys per rank (1 = balanced, W = all on one rank)")
    return fig


def max_over_mean_vs_world_size(
    table: pd.DataFrame,
    patterns: Sequence[str] | None = None,
    dist_types: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """max/mean against world size, one panel per pattern, a line per
    dist_type, with the bounds: 1 (balanced), W (all on one rank) and, when
    the table has it, the hot-key floor no routing can beat.
    """
    if table.empty:
        raise ValueError("table is empty: nothing to plot")
    patterns = _ordered(table["pattern"], patterns, "patterns")
    dist_types = _ordered(table["dist_type"], dist_types, "dist_types")
    world_sizes = sorted(table["world_size"].unique().tolist())
    fig = new_figure(0.6 + 3.4 * len(patterns), 3.4)
    axes = fig.subplots(1, len(patterns), sharey=True, squeeze=False)[0]
    for ax, pattern in zip(axes, patterns):
        rows = table[table["pattern"] == pattern].sort_values("world_size")
        ax.plot(world_sizes, world_sizes, color="0.6", linestyle=":", label="W (all on one rank)")
        ax.axhline(1.0, color="0.6", linestyle="--", linewidth=1, label="1 (balanced)")
        if "hot_key_floor" in rows:
            floor = rows.groupby("world_size")["hot_key_floor"].first()
            ax.plot(
                floor.index, floor.values, color="black", linewidth=2.5, alpha=0.35, label="hot-key floor"
            )
        for i, dist_type in enumerate(dist_types):
            line = rows[rows["dist_type"] == dist_type]
            ax.plot(
                line["world_size"],
                line["max_over_mean"],
                marker="o",
                color=color(dist_type, i),
                label=dist_type,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(world_sizes, [str(w) for w in world_sizes])
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(pattern)
        ax.set_xlabel("world_size")
    axes[0].set_ylabel("max/mean keys per rank")
    axes[-1].legend(loc="upper left", fontsize=8)
    if title:
        fig.suptitle(title)
    return fig

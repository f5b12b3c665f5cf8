"""Figures of the notebooks: each function takes data, returns a Figure.

Figures are made with `matplotlib.figure.Figure`, not pyplot, so nothing is
kept in pyplot's global list: a notebook shows one with `display(fig)`, a
widget redraws into its Output, a test just counts axes.

    fig = load_heatmap(table)                        # notebook 01
    fig = rank_load_bars({"roundrobin": [8, 0, 0, 0], "hash_roundrobin": ...})
    fig = max_over_mean_vs_world_size(table, ["strided", "zipf"])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import pandas as pd
import seaborn as sns
import torch
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, StrMethodFormatter

__all__ = ["load_heatmap", "rank_load_bars", "max_over_mean_vs_world_size"]

HEATMAP_CMAP = "rocket_r"  # light = balanced, dark = one rank does it all
VALUE_LABELS = {"max_over_mean": "max/mean", "spread_over_mean": "(max - min)/mean"}
DIST_COLORS = {  # one colour per routing mode, the same in every figure
    "continuous": "#4c72b0",
    "roundrobin": "#dd8452",
    "hash_roundrobin": "#55a868",
}


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


def _color(dist_type: str, index: int) -> str:
    palette = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    return DIST_COLORS.get(str(dist_type), palette[index % len(palette)])


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
    fig = Figure(figsize=(0.9 + 2.9 * num_panels, 0.9 + 0.45 * len(patterns)), layout="constrained")
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


def _as_list(counts: Sequence[float] | torch.Tensor) -> list[float]:
    if isinstance(counts, torch.Tensor):
        return counts.reshape(-1).tolist()
    return [float(c) for c in counts]


def rank_load_bars(
    counts_by_dist_type: Mapping[str, Sequence[float] | torch.Tensor],
    highlight: Mapping[str, Sequence[float] | torch.Tensor] | None = None,
    highlight_label: str = "hottest key",
    ylabel: str = "keys per rank",
    title: str | None = None,
) -> Figure:
    """Bars of per-rank counts, one panel per dist_type, sharing the y axis.

    Each panel marks the mean (dashed) and says max/mean in its title.
    `highlight[dist_type]` (per-rank counts, a part of the totals, e.g. the
    hottest key's lookups) is drawn over the bars in black.
    """
    if not counts_by_dist_type:
        raise ValueError("counts_by_dist_type is empty: nothing to plot")
    names = list(counts_by_dist_type)
    num_panels = len(names)
    fig = Figure(figsize=(0.6 + 3.2 * num_panels, 3.2), layout="constrained")
    axes = fig.subplots(1, num_panels, sharey=True, squeeze=False)[0]
    for i, (ax, name) in enumerate(zip(axes, names)):
        counts = _as_list(counts_by_dist_type[name])
        if not counts:
            raise ValueError(f"counts for {name!r} are empty")
        ranks = list(range(len(counts)))
        mean = sum(counts) / len(counts)
        ax.bar(ranks, counts, color=_color(name, i), label="all keys")
        if highlight is not None and name in highlight:
            ax.bar(ranks, _as_list(highlight[name]), color="black", width=0.4, label=highlight_label)
        ax.axhline(mean, color="0.3", linestyle="--", linewidth=1, label="mean")
        ratio = f"{max(counts) / mean:.2f}" if mean else "n/a"
        ax.set_title(f"{name}\nmax/mean {ratio}")
        ax.set_xlabel("rank")
        ax.set_xticks(ranks if len(ranks) <= 16 else ranks[:: len(ranks) // 8])
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        if i == 0:
            ax.set_ylabel(ylabel)
    axes[0].legend(loc="upper right", fontsize=8)
    if title:
        fig.suptitle(title)
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
    fig = Figure(figsize=(0.6 + 3.4 * len(patterns), 3.4), layout="constrained")
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
                color=_color(dist_type, i),
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

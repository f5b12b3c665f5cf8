"""Figures of notebooks 01 and 01a (row-wise routing): each takes data and returns a Figure, in the style of
`embnb.lab.plotting` (palette, rank bars)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, NullLocator, StrMethodFormatter

from embnb.lab.plotting import color, new_figure, rank_bars

__all__ = [
    "load_heatmap",
    "zipf_seeds_figure",
    "dist_type_bars",
    "routed_loads_figure",
]

HEATMAP_CMAP = "magma_r"  # light = balanced, dark = one rank does it all
VALUE_LABELS = {"max_over_mean": "max/mean", "spread_over_mean": "(max - min)/mean"}


def _ordered(values: Sequence, wanted: Sequence | None, what: str) -> list:
    present = list(dict.fromkeys(values))  # first-seen order
    if wanted is None:
        return present
    missing = [v for v in wanted if v not in present]
    if missing:
        raise ValueError(f"{what} {missing} not in the data; it has {present}")
    return list(wanted)


def _legend_below(fig: Figure, handles: list, labels: list[str], ncols: int | None = None, **options) -> None:
    """One legend below the panels, never over the data."""
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols or len(labels), fontsize=8, **options)


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
    axes = fig.subplots(1, num_panels + 1, gridspec_kw={"width_ratios": [1.0] * num_panels + [0.06]})
    panels, colorbar_ax = axes[:-1], axes[-1]
    for i, (ax, world_size) in enumerate(zip(panels, world_sizes)):
        rows = table[table["world_size"] == world_size]
        grid = rows.pivot_table(index="pattern", columns="dist_type", values=value, aggfunc="mean")
        grid = grid.reindex(index=patterns, columns=dist_types)
        values = grid.to_numpy(dtype=float)
        image = ax.imshow(values, cmap=HEATMAP_CMAP, norm=norm, aspect="auto")
        for (r, c), v in np.ndenumerate(values):  # the value in each cell, legible on its colour
            if not np.isnan(v):
                dark = norm(v) > 0.55
                ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=8, color="w" if dark else "k")
        ax.set_xticks(range(len(dist_types)), dist_types)
        ax.set_yticks(range(len(patterns)), patterns)
        ax.set_xticks(np.arange(len(dist_types) + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(len(patterns) + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="white", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
        ax.spines[:].set_visible(False)
        ax.set_title(f"world_size = {world_size}")
        ax.set_xlabel("dist_type")
        ax.set_ylabel("pattern" if i == 0 else "")
        ax.tick_params(axis="x", labelrotation=30)
        ax.tick_params(axis="y", labelrotation=0)
        if i:
            ax.set_yticklabels([])
    fig.colorbar(image, cax=colorbar_ax, label=_label(value))
    ticks = [t for t in (1, 1.5, 2, 4, 8, 16, 32, 64, 128) if t <= vmax]
    colorbar_ax.yaxis.set_major_locator(FixedLocator(ticks))
    colorbar_ax.yaxis.set_minor_locator(NullLocator())
    colorbar_ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    fig.suptitle(title or f"{_label(value)} of keys per rank (1 = balanced, W = all on one rank)")
    return fig


def zipf_seeds_figure(zipf: pd.DataFrame, title: str | None = None) -> Figure:
    """max/mean of Zipf traffic per dist_type over seeds (a dot per seed, a
    bar at the median), one panel per traffic kind; the hot-key floor of
    all lookups shaded over its range across seeds."""
    if zipf.empty:
        raise ValueError("zipf is empty: nothing to plot")
    kinds = list(dict.fromkeys(zipf["traffic"]))
    dist_types = list(dict.fromkeys(zipf["dist_type"]))
    fig = new_figure(0.8 + 3.4 * len(kinds), 3.6)
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    for ax, kind in zip(axes, kinds):
        rows = zipf[zipf["traffic"] == kind]
        if kind == "all lookups":
            floors = rows["hot_key_floor"]
            ax.axhspan(
                floors.min(), floors.max(), color="#c44e52", alpha=0.2, label="hot-key floor (over seeds)"
            )
        for i, dist_type in enumerate(dist_types):
            values = rows[rows["dist_type"] == dist_type]["max_over_mean"]
            jitter = [(j % 7 - 3) * 0.04 for j in range(len(values))]  # dots side by side, not stacked
            ax.plot([i + d for d in jitter], values, "o", color=color(dist_type, i), alpha=0.6, markersize=4)
            ax.hlines(values.median(), i - 0.3, i + 0.3, color="black", linewidth=2)
        ax.set_xticks(range(len(dist_types)), dist_types, rotation=15)
        ax.set_ylim(bottom=1.0)
        ax.axhline(1.0, color="0.6", linestyle="--", linewidth=1)
        ax.set_title(kind)
    axes[0].set_ylabel("max/mean keys per rank")
    handles, labels = axes[0].get_legend_handles_labels()
    _legend_below(
        fig, [Line2D([], [], color="black", linewidth=2), *handles], ["median over seeds", *labels], 2
    )
    fig.suptitle(title or "zipf over seeds: max/mean per dist_type")
    return fig


def dist_type_bars(
    loads_by_dist_type: Mapping[str, Sequence[float]],
    *,
    highlight: Mapping[str, Sequence[float]] | None = None,
    floor: float | None = None,
    ylabel: str = "keys per rank",
    title: str | None = None,
) -> Figure:
    """`embnb.lab.plotting.rank_bars`, a panel per dist_type, with the legend's
    bar entry showing every panel's own colour (not one grey patch)."""
    fig = rank_bars(loads_by_dist_type, highlight=highlight, floor=floor, ylabel=ylabel, title=title)
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    handles = list(legend.legend_handles)
    colours = tuple(Patch(facecolor=color(name, i)) for i, name in enumerate(loads_by_dist_type))
    handles[labels.index("all")] = colours
    labels[labels.index("all")] = "all keys (each panel's colour)"
    legend.remove()
    _legend_below(fig, handles, labels, handler_map={tuple: HandlerTuple(ndivide=None, pad=0)}, frameon=False)
    return fig


ROUTING_MARKERS = {"continuous": "s", "roundrobin": "o", "feistel_roundrobin": "^"}


def routed_loads_figure(loads, device: str, world_size: int | None = None) -> Figure:
    """The replay at one W (default: the largest), one panel per id stream (at most 4 streams): each
    rank a point, its ids on x, its lookup's median thread CPU time on y with a bar over its repeats'
    range; colour and marker: the routing."""
    config = loads.config
    w = world_size or max(config.world_sizes)
    cases = list(config.cases)[:4]
    fig = new_figure(0.6 + 3.4 * len(cases), 3.4)
    axes = fig.subplots(1, len(cases), squeeze=False)[0]
    for ax, case in zip(axes, cases):
        for i, routing in enumerate(config.routings):
            c = loads.case(case, w, routing)
            low = [t - r[0] for t, r in zip(c.lookup_ms, c.lookup_ms_range)]
            high = [r[1] - t for t, r in zip(c.lookup_ms, c.lookup_ms_range)]
            ax.errorbar(
                c.ids_per_rank,
                c.lookup_ms,
                yerr=[low, high],
                fmt=ROUTING_MARKERS.get(routing, "o"),
                color=color(routing, i + 2),  # feistel_roundrobin: a colour of its own
                markersize=4,
                alpha=0.7,
                elinewidth=0.7,
                label=routing,
            )
        ax.set_title(f"{case} ids", fontsize=9)
        ax.set(xlabel="ids the rank owns", ylim=(0, None))
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("lookup ms (fwd + bwd, cpu)")
    _legend_below(fig, *axes[0].get_legend_handles_labels())
    fig.suptitle(f"W = {w}, each rank replayed one by one on {device}", fontsize=10)
    return fig

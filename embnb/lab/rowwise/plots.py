"""Figures of notebook 01 (row-wise routing): each takes data and returns a Figure, in the style of
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
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, StrMethodFormatter

from embnb.lab.plotting import color, new_figure, rank_bars

__all__ = [
    "load_heatmap",
    "max_over_mean_vs_world_size",
    "hash_noise_figure",
    "zipf_seeds_figure",
    "hot_key_floor_figure",
    "dist_type_bars",
    "routed_loads_figure",
]

HEATMAP_CMAP = "magma_r"  # light = balanced, dark = one rank does it all
# Lines that coincide (e.g. roundrobin and continuous past the last block)
# stay visible: each mode has its own marker size and dash.
LINE_STYLES = [
    {"marker": "o", "markersize": 9, "linestyle": "-", "linewidth": 3.0, "alpha": 0.55},
    {"marker": "s", "markersize": 6, "linestyle": "--", "linewidth": 2.0, "alpha": 0.85},
    {"marker": "^", "markersize": 4, "linestyle": ":", "linewidth": 1.5, "alpha": 1.0},
]
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


def max_over_mean_vs_world_size(
    table: pd.DataFrame,
    patterns: Sequence[str] | None = None,
    dist_types: Sequence[str] | None = None,
    title: str | None = None,
    rules: dict[str, dict[int, float]] | None = None,
) -> Figure:
    """max/mean against world size, one panel per pattern, a line per
    dist_type (each with its own marker and dash, so coinciding lines stay
    visible), with the bounds: 1 (balanced), W (all on one rank) and, when
    the table has it, the hot-key floor no routing can beat.
    `rules[pattern]` (`{world_size: value}`, e.g. gcd(stride, W)) is drawn as
    black crosses labelled "rule".
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
        floor = rows.groupby("world_size")["hot_key_floor"].first() if "hot_key_floor" in rows else None
        if floor is not None and floor.max() > 1.0:  # a floor of 1 is the balanced line
            ax.plot(
                floor.index, floor.values, color="black", linewidth=2.5, alpha=0.35, label="hot-key floor"
            )
        for i, dist_type in enumerate(dist_types):
            line = rows[rows["dist_type"] == dist_type]
            ax.plot(
                line["world_size"],
                line["max_over_mean"],
                color=color(dist_type, i),
                label=dist_type,
                **LINE_STYLES[i % len(LINE_STYLES)],
            )
        if rules and pattern in rules:
            sizes = sorted(rules[pattern])
            ax.plot(sizes, [rules[pattern][w] for w in sizes], "x", color="black", markersize=8, label="rule")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(world_sizes, [str(w) for w in world_sizes])
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(pattern)
        ax.set_xlabel("world_size")
    axes[0].set_ylabel("max/mean keys per rank")
    handles = {label: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels())}
    _legend_below(fig, list(handles.values()), list(handles))
    if title:
        fig.suptitle(title)
    return fig


def hash_noise_figure(
    noise: pd.DataFrame, bands: dict[int, dict[float, float]], world_size: int, title: str | None = None
) -> Figure:
    """`hash_roundrobin`'s excess max/mean - 1 against distinct keys per rank
    (log-log, a marker per seed), over the balls-into-bins band of a truly
    random owner (`bands[keys_per_rank]`: {quantile: max/mean}, its lowest
    and highest quantile shaded, the middle one a line)."""
    if noise.empty or not bands:
        raise ValueError("noise and bands must not be empty")
    sizes = sorted(bands)
    quantiles = sorted(bands[sizes[0]])
    fig = new_figure(6.0, 3.8)
    ax = fig.subplots()
    low, mid, high = quantiles[0], quantiles[len(quantiles) // 2], quantiles[-1]
    ax.fill_between(
        sizes,
        [bands[n][low] - 1 for n in sizes],
        [bands[n][high] - 1 for n in sizes],
        color="0.85",
        label=f"random owner, {low:.0%} to {high:.0%} quantile",
    )
    ax.plot(
        sizes, [bands[n][mid] - 1 for n in sizes], color="0.5", linestyle="--", label="random owner, median"
    )
    ax.plot(
        noise["keys_per_rank"],
        noise["max_over_mean"] - 1,
        "o",
        color=color("hash_roundrobin"),
        alpha=0.8,
        label="hash_roundrobin (one marker per seed)",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("distinct keys per rank per step")
    ax.set_ylabel("max/mean - 1")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title or f"hashing's own imbalance, world_size={world_size}")
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


def hot_key_floor_figure(sweep: pd.DataFrame, title: str | None = None) -> Figure:
    """max/mean of all lookups against Zipf alpha (a `hot_keys.alpha_sweep`
    table): a dot per seed and a line through the medians per dist_type,
    side by side at each alpha; the floor `max(1, W * p1)` as a black line
    and `W * p1` dotted where it is below 1 (there the floor is 1)."""
    if sweep.empty:
        raise ValueError("sweep is empty: nothing to plot")
    alphas = sorted(sweep["alpha"].unique())
    dist_types = list(dict.fromkeys(sweep["dist_type"]))
    fig = new_figure(6.4, 4.0)
    ax = fig.subplots()
    positions = range(len(alphas))
    floors = sweep.groupby("alpha")[["w_times_p1", "hot_key_floor"]].median().loc[alphas]
    ax.plot(
        positions, floors["hot_key_floor"], color="#c44e52", linewidth=2, label="hot-key floor max(1, W·p1)"
    )
    ax.plot(positions, floors["w_times_p1"], color="#c44e52", linestyle=":", marker="x", label="W·p1")
    ax.axhline(1.0, color="0.6", linestyle="--", linewidth=1, label="1 (balanced)")
    width = 0.5 / max(len(dist_types), 1)
    for i, dist_type in enumerate(dist_types):
        offset = (i - (len(dist_types) - 1) / 2) * width  # side by side: no dot hides another mode's
        rows = sweep[sweep["dist_type"] == dist_type]
        medians = rows.groupby("alpha")["max_over_mean"].median().loc[alphas]
        x_of = {a: p + offset for a, p in zip(alphas, positions)}
        ax.plot(
            rows["alpha"].map(x_of),
            rows["max_over_mean"],
            "o",
            color=color(dist_type, i + 3),
            alpha=0.35,
            ms=4,
        )
        ax.plot(
            [x_of[a] for a in alphas],
            medians.values,
            marker="D",
            color=color(dist_type, i + 3),
            linestyle=LINE_STYLES[i % len(LINE_STYLES)]["linestyle"],
            label=f"{dist_type} (median; dots: seeds)",
        )
    ax.set_xticks(list(positions), [f"{a:g}" for a in alphas])
    ax.set_xlabel("Zipf alpha")
    ax.set_ylabel("max/mean lookups per rank")
    ax.set_ylim(bottom=0)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8)
    ax.set_title(title or "where the hot-key floor binds")
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


def routed_loads_figure(loads, device: str) -> Figure:
    """Section 8: one panel per (id stream, W); each rank is a point, its ids on x, its lookup's
    median thread CPU time on y with a bar over its repeats' range; colour and marker: the routing."""
    config = loads.config
    fig = new_figure(4.2 * len(config.world_sizes), 3.1 * len(config.cases))
    axes = fig.subplots(len(config.cases), len(config.world_sizes), squeeze=False)
    for row, case in enumerate(config.cases):
        for col, w in enumerate(config.world_sizes):
            ax = axes[row][col]
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
            ax.set_title(f"{case} ids, W = {w}", fontsize=9)
            ax.set(xlabel="ids the rank owns", ylabel="lookup ms (fwd + bwd, cpu)")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
    _legend_below(fig, *axes[0][0].get_legend_handles_labels())
    fig.suptitle(f"each rank replayed one by one on {device}: ids owned and lookup time", fontsize=10)
    return fig

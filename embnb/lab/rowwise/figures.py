"""Figures of notebook 01 and appendix 01a: seaborn over the DataFrames the sections record, in the
palette of `embnb.lab.plotting`; each takes data and returns a Figure."""

from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from embnb.lab.plotting import color, new_figure


def _panels(fig: Figure, count: int, **options) -> list:
    return list(fig.subplots(1, count, squeeze=False, **options)[0])


def load_heatmap(table: pd.DataFrame) -> Figure:
    """max/mean per pattern (rows) and dist_type (columns) of a `load_table`, one panel per world size,
    on one logarithmic colour scale from 1 (balanced) to the largest W (all keys on one rank)."""
    if table.empty:
        raise ValueError("table is empty: nothing to plot")
    world_sizes = sorted(table["world_size"].unique())
    norm = LogNorm(1.0, max(float(max(world_sizes)), float(table["max_over_mean"].max()), 2.0))
    fig = new_figure(1.4 + 2.9 * len(world_sizes), 1.8 + 0.4 * table["pattern"].nunique())
    axes = _panels(fig, len(world_sizes), sharey=True)
    for ax, world_size in zip(axes, world_sizes):
        rows = table[table["world_size"] == world_size]
        grid = rows.pivot_table(index="pattern", columns="dist_type", values="max_over_mean", sort=False)
        last = ax is axes[-1]
        sns.heatmap(grid, ax=ax, norm=norm, cmap="magma_r", annot=True, fmt=".2f", linewidths=0.5, cbar=last)
        ax.set(title=f"world_size = {world_size}", ylabel="pattern" if ax is axes[0] else "")
        ax.tick_params(axis="x", labelrotation=30)
    colorbar = axes[-1].collections[0].colorbar
    ticks = [t for t in (1, 1.5, 2, 4, 8, 16, 32, 64, 128) if t <= norm.vmax]
    colorbar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])
    colorbar.minorticks_off()
    colorbar.set_label("max/mean")
    fig.suptitle("max/mean of keys per rank (1 = balanced, W = all on one rank)")
    return fig


def zipf_seeds_figure(zipf: pd.DataFrame) -> Figure:
    """max/mean of a `zipf_over_seeds` per dist_type (a dot per seed, a bar at the median), one panel
    per traffic kind; the hot-key floor of all lookups shaded over its range across seeds."""
    if zipf.empty:
        raise ValueError("zipf is empty: nothing to plot")
    kinds = list(dict.fromkeys(zipf["traffic"]))
    palette = {d: color(d, i) for i, d in enumerate(dict.fromkeys(zipf["dist_type"]))}
    fig = new_figure(0.8 + 3.4 * len(kinds), 3.6)
    for ax, kind in zip(_panels(fig, len(kinds)), kinds):
        rows = zipf[zipf["traffic"] == kind]
        if kind == "all lookups":
            floors = rows["hot_key_floor"]
            ax.axhspan(
                floors.min(), floors.max(), color="#c44e52", alpha=0.2, label="hot-key floor (over seeds)"
            )
        sns.stripplot(
            rows, x="dist_type", y="max_over_mean", hue="dist_type", palette=palette, ax=ax, alpha=0.6
        )
        sns.pointplot(
            rows,
            x="dist_type",
            y="max_over_mean",
            estimator="median",
            errorbar=None,
            color="black",
            marker="_",
            markersize=24,
            linestyle="none",
            ax=ax,
            label="median over seeds",
        )
        ax.set(title=kind, xlabel="", ylabel="max/mean keys per rank", ylim=(1.0, None))
        ax.legend(fontsize=8)
    fig.suptitle("zipf over seeds: max/mean per dist_type")
    return fig


def routed_loads_figure(loads: pd.DataFrame, device: str) -> Figure:
    """The replay of `routed_loads.measure_loads` at its largest W, one panel per id
    stream (at most 4): each rank a point, its ids on x, its lookup's median CPU ms on y with a line
    over its repeats' range; colour and marker: the routing."""
    w = int(loads["world_size"].max())
    at = loads[loads["world_size"] == w]
    cases = list(dict.fromkeys(at["case"]))[:4]
    palette = {r: color(r, i + 2) for i, r in enumerate(dict.fromkeys(at["routing"]))}  # feistel: its own
    fig = new_figure(0.6 + 3.4 * len(cases), 3.6)
    axes = _panels(fig, len(cases), sharey=True)
    for ax, case in zip(axes, cases):
        rows = at[at["case"] == case]
        ax.vlines(
            rows["ids"], rows["lookup_ms_low"], rows["lookup_ms_high"], colors=rows["routing"].map(palette)
        )
        sns.scatterplot(
            rows,
            x="ids",
            y="lookup_ms",
            hue="routing",
            style="routing",
            palette=palette,
            ax=ax,
            legend=ax is axes[0],
        )
        ax.set(
            title=f"{case} ids",
            xlabel="ids the rank owns",
            ylabel="lookup ms (fwd + bwd, cpu)",
            ylim=(0, None),
        )
    fig.suptitle(f"W = {w}, each rank replayed one by one on {device}", fontsize=10)
    return fig

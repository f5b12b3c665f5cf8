"""Figures of notebook 03 (DP sharding planner): each takes data, returns a Figure.

Figures use the shared style of `embnb.plotting` (one colour per proposer,
rank ticks); a notebook shows one with `display(fig)`.

    fig = knapsack_heatmap(knapsack_table(...))        # the DP table
    fig = proposer_comparison(compare_proposers(...))  # rating and time
    fig = rating_vs_budget(sweep)                      # as HBM shrinks
    fig = quality_ratios(quality_study(...))           # against brute force
    fig = rank_loads_figure(rank_loads(plan, W), hbm_cap_gb)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from embnb.plotting import MEAN_STYLE, color, new_figure, rank_ticks

__all__ = [
    "knapsack_heatmap",
    "proposer_comparison",
    "rating_vs_budget",
    "quality_ratios",
    "rank_loads_figure",
    "planned_title",
]


def _need(table: pd.DataFrame, columns: list[str], what: str) -> None:
    if table.empty:
        raise ValueError(f"{what} is empty: nothing to plot")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{what} lacks columns {missing}; it has {list(table.columns)}")


def _plain_log_ticks(ax) -> None:
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax.yaxis.set_minor_formatter(StrMethodFormatter("{x:g}"))
    ax.tick_params(axis="y", which="minor", labelsize=7)


def knapsack_heatmap(table: pd.DataFrame, title: str | None = None) -> Figure:
    """The DP table: least summed perf (colour, log) per memory bin (x) once
    the tables up to each row are chosen (y); grey cells are unreachable."""
    if table.empty:
        raise ValueError("table is empty: nothing to plot")
    values = table.to_numpy(dtype=float)
    finite = values[np.isfinite(values) & (values > 0)]
    masked = np.ma.masked_invalid(np.where(values > 0, values, np.nan))
    fig = new_figure(9, 0.8 + 0.22 * len(table))
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad("0.88")
    norm = LogNorm(vmin=finite.min(), vmax=finite.max()) if len(finite) else None
    image = ax.imshow(masked, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
    edges = np.asarray(table.columns, dtype=float)
    ticks = np.unique(np.linspace(0, len(edges) - 1, min(8, len(edges))).astype(int))
    ax.set_xticks(ticks, [f"{edges[i]:.3g}" for i in ticks])
    rows = np.unique(np.linspace(0, len(table) - 1, min(25, len(table))).astype(int))
    ax.set_yticks(rows, [str(table.index[i]) for i in rows], fontsize=7)
    axis = table.attrs.get("axis", "memory").upper()
    ax.set_xlabel(f"total {axis} used, GiB (upper edge of each bin)")
    ax.set_ylabel("tables chosen so far")
    fig.colorbar(image, ax=ax, label="least summed perf (ms)")
    ax.set_title(title or "Knapsack DP table: least summed perf per memory bin")
    return fig


def proposer_comparison(table: pd.DataFrame, title: str | None = None) -> Figure:
    """Two panels per proposer: the best plan's perf rating (slowest rank)
    over the best of all, and planning seconds (log). Proposers without a
    plan say why (from the `note` column); cut by the time limit, "timed out"."""
    _need(table.reset_index(), ["proposer", "perf_rating", "plan_s", "timed_out"], "table")
    rows = table.reset_index()
    if not np.isfinite(rows["perf_rating"].to_numpy(dtype=float)).any():
        notes = "; ".join(f"{r.proposer}: {getattr(r, 'note', '') or 'no plan'}" for r in rows.itertuples())
        raise ValueError(f"no proposer found a plan, nothing to compare ({notes})")
    best = rows["perf_rating"].min()
    fig = new_figure(10, 0.9 + 0.45 * len(rows))
    left, right = fig.subplots(1, 2, sharey=True)
    positions = np.arange(len(rows))[::-1]
    for i, (y, row) in enumerate(zip(positions, rows.itertuples())):
        shade = color(row.proposer, i)
        rating = row.perf_rating
        if math.isfinite(rating):
            ratio = rating / best
            left.barh(y, ratio, color=shade)
            left.text(ratio, y, f" {ratio:.3g}x ({rating:.3g} ms)", va="center", fontsize=8)
        else:
            left.text(
                1, y, " " + _why_no_plan(getattr(row, "note", "")), va="center", fontsize=8, color="0.4"
            )
        right.barh(y, row.plan_s, color=shade)
        note = " timed out" if row.timed_out else ""
        right.text(row.plan_s, y, f" {row.plan_s:.3g} s{note}", va="center", fontsize=8)
    left.set_yticks(positions, rows["proposer"])
    left.set_xscale("log")
    left.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    left.xaxis.set_minor_formatter(StrMethodFormatter("{x:g}"))
    left.tick_params(axis="x", which="minor", labelsize=7)
    left.set_xlabel("perf rating / best (slowest rank, log)")
    left.axvline(1.0, color="0.3", linewidth=1)
    left.set_xlim(0.9, max(2.0, (rows["perf_rating"] / best).replace(np.inf, np.nan).max() * 3))
    right.set_xscale("log")
    right.set_xlabel("planning time, s (log)")
    right.set_xlim(right.get_xlim()[0], right.get_xlim()[1] * 8)
    fig.suptitle(title or "torchrec's planner with each proposer")
    return fig


def _why_no_plan(note: str) -> str:
    if note.startswith("skipped"):
        return note
    if note.startswith("failed: "):
        return "failed: " + note[len("failed: ") :].split(":")[0]
    return "no plan"


def rating_vs_budget(sweep: pd.DataFrame, title: str | None = None) -> Figure:
    """Perf rating against the HBM budget per device, one line per proposer;
    the x axis runs from the largest budget down. Needs columns proposer,
    hbm_cap_gb, perf_rating (NaN: no plan)."""
    _need(sweep, ["proposer", "hbm_cap_gb", "perf_rating"], "sweep")
    fig = new_figure(6.5, 3.8)
    ax = fig.subplots()
    for i, (name, rows) in enumerate(sweep.groupby("proposer", sort=False)):
        rows = rows.sort_values("hbm_cap_gb")
        ax.plot(rows["hbm_cap_gb"], rows["perf_rating"], marker="o", color=color(name, i), label=name)
    ax.invert_xaxis()
    ax.set_yscale("log")
    _plain_log_ticks(ax)
    ax.set_xlabel("HBM per device, GiB (shrinking to the right)")
    ax.set_ylabel("perf rating, ms (slowest rank, log)")
    ax.legend(fontsize=8)
    ax.set_title(title or "Plan quality as the memory budget shrinks (gaps: no plan)")
    return fig


def quality_ratios(study: pd.DataFrame, tolerance: float = 1.02, title: str | None = None) -> Figure:
    """Each proposer's rating over the brute-force best, one dot per
    instance (log); no plan where brute force found one is drawn at the top."""
    _need(study, ["proposer", "ratio"], "study")
    names = list(dict.fromkeys(study["proposer"]))
    finite = study["ratio"].replace(np.inf, np.nan)
    top = max(2.0, float(finite.max()) * 1.5) if finite.notna().any() else 2.0
    fig = new_figure(1.2 + 1.3 * len(names), 3.8)
    ax = fig.subplots()
    rng = np.random.default_rng(0)
    for i, name in enumerate(names):
        ratios = study.loc[study["proposer"] == name, "ratio"].to_numpy(dtype=float)
        shown = np.where(np.isfinite(ratios), ratios, top)
        ax.scatter(i + rng.uniform(-0.18, 0.18, len(shown)), shown, s=14, alpha=0.7, color=color(name, i))
        worst = ratios.max() if len(ratios) else math.nan
        ax.text(
            i,
            top * 1.15,
            "worst\n" + ("no plan" if worst == math.inf else f"{worst:.3g}x"),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.axhline(tolerance, color="0.3", linestyle="--", linewidth=1)
    ax.text(len(names) - 0.5, tolerance, f"{tolerance:g}x ", ha="right", va="bottom", fontsize=8)
    ax.axhline(top, color="0.8", linewidth=6, zorder=0)
    ax.text(-0.5, top, " no plan", va="center", fontsize=7, color="0.4")
    ax.set_yscale("log")
    ax.set_ylim(0.95, top * 2.2)
    _plain_log_ticks(ax)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("perf rating / brute-force best (log)")
    instances = study["instance"].nunique() if "instance" in study else len(study) // max(1, len(names))
    ax.set_title(title or f"Against brute force on {instances} small instances")
    return fig


def rank_loads_figure(
    loads: pd.DataFrame, capacity_gb: Mapping[str, float] | None = None, title: str | None = None
) -> Figure:
    """Per rank: summed perf (the slowest rank is the plan's rating) and HBM
    and DDR used, with each device's capacity dashed when given."""
    _need(loads, ["perf", "hbm_gb", "ddr_gb"], "loads")
    ranks = np.arange(len(loads))
    fig = new_figure(min(14, 3 + 0.35 * len(loads)) * 1.6, 3.4)
    axes = fig.subplots(1, 3)
    slowest = int(loads["perf"].to_numpy().argmax())
    colors = ["#c44e52" if r == slowest else "#55a868" for r in ranks]
    axes[0].bar(ranks, loads["perf"], color=colors)
    axes[0].axhline(loads["perf"].mean(), **MEAN_STYLE, label="mean")
    axes[0].set_ylabel("summed perf, ms")
    axes[0].set_title(f"perf per rank (slowest: rank {slowest})")
    axes[0].legend(fontsize=8)
    for ax, column, name in ((axes[1], "hbm_gb", "HBM"), (axes[2], "ddr_gb", "DDR")):
        ax.bar(ranks, loads[column], color="#4c72b0")
        if capacity_gb and capacity_gb.get(column.split("_")[0]):
            ax.axhline(
                capacity_gb[column.split("_")[0]], color="0.3", linestyle="--", linewidth=1, label="capacity"
            )
            ax.legend(fontsize=8)
        ax.set_ylabel(f"{name}, GiB")
        ax.set_title(f"{name} per rank")
    for ax in axes:
        rank_ticks(ax, len(ranks))
    if title:
        fig.suptitle(title)
    return fig


def planned_title(num_tables: int, world_size: int, hbm_cap_gb: float) -> str:
    """What a comparison was planned for (the notebook's and its explorer's titles)."""
    return f"{num_tables} tables, {world_size} devices, {hbm_cap_gb:.3g} GiB HBM each"

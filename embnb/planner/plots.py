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
    """The DP table: per row (the tables chosen so far, y) and memory bin (x),
    the least summed perf over the row's least (colour, log): how much perf
    each row gives up to save memory. Grey cells are unreachable; dots mark
    the last row's frontier (bins with less perf than every bin left of them)."""
    if table.empty:
        raise ValueError("table is empty: nothing to plot")
    values = table.to_numpy(dtype=float)
    values = np.where(values > 0, values, np.nan)
    with np.errstate(invalid="ignore"):
        relative = values / np.nanmin(np.where(np.isfinite(values), values, np.nan), axis=1, keepdims=True)
    finite = relative[np.isfinite(relative)]
    fig = new_figure(9, 1.0 + 0.2 * len(table))
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis_r"].copy()
    cmap.set_bad("0.88")
    norm = LogNorm(vmin=1.0, vmax=max(1.01, float(finite.max()))) if len(finite) else None
    image = ax.imshow(
        np.ma.masked_invalid(relative), aspect="auto", cmap=cmap, norm=norm, interpolation="nearest"
    )
    last = values[-1]
    best_so_far = np.minimum.accumulate(np.where(np.isfinite(last), last, np.inf))
    frontier = [
        b for b in range(len(last)) if np.isfinite(last[b]) and (b == 0 or last[b] < best_so_far[b - 1])
    ]
    ax.scatter(frontier, [len(table) - 1] * len(frontier), s=10, color="black", label="frontier (last row)")
    edges = np.asarray(table.columns, dtype=float)
    ticks = np.unique(np.linspace(0, len(edges) - 1, min(8, len(edges))).astype(int))
    ax.set_xticks(ticks, [f"{edges[i]:.3g}" for i in ticks])
    step = max(1, math.ceil(len(table) / 25))  # every row, or every step-th row from the last one up
    rows = list(range(len(table) - 1, -1, -step))[::-1]
    ax.set_yticks(rows, [f"{i + 1}: {table.index[i]}" for i in rows], fontsize=7)
    axis = table.attrs.get("axis", "memory").upper()
    ax.set_xlabel(f"total {axis} used, GiB (upper edge of each bin)")
    ax.set_ylabel("tables chosen so far")
    fig.colorbar(image, ax=ax, label="least summed perf / the row's least (log)")
    fig.legend(loc="outside lower right", fontsize=8)
    ax.set_title(title or "Knapsack DP table: the perf each row gives up for memory")
    return fig


def proposer_comparison(table: pd.DataFrame, title: str | None = None) -> Figure:
    """Two panels per proposer: the best plan's perf rating (slowest rank)
    over the best of all, and seconds (log): planning alone (filled dot,
    with its range over repeats when the table has `plan_s_min`/`plan_s_max`)
    and end to end with the enumeration (hollow, column `end_to_end_s`).
    Proposers without a plan say why (the `note` column); "timed out" marks
    those the time limit cut short."""
    _need(table.reset_index(), ["proposer", "perf_rating", "plan_s", "timed_out"], "table")
    rows = table.reset_index()
    if not np.isfinite(rows["perf_rating"].to_numpy(dtype=float)).any():
        notes = "; ".join(f"{r.proposer}: {getattr(r, 'note', '') or 'no plan'}" for r in rows.itertuples())
        raise ValueError(f"no proposer found a plan, nothing to compare ({notes})")
    best = rows["perf_rating"].min()
    fig = new_figure(10, 1.1 + 0.45 * len(rows))
    left, right = fig.subplots(1, 2, sharey=True)
    positions = np.arange(len(rows))[::-1]
    for i, (y, row) in enumerate(zip(positions, rows.itertuples())):
        shade = color(row.proposer, i)
        rating = row.perf_rating
        if math.isfinite(rating):
            ratio = rating / best
            left.plot([1, ratio], [y, y], color=shade, linewidth=1)  # from the best plan's 1x
            left.plot(ratio, y, "o", color=shade)
            left.text(ratio, y, f"  {ratio:.3g}x ({rating:.3g} ms)", va="center", fontsize=8)
        else:
            left.text(
                1, y, " " + _why_no_plan(getattr(row, "note", "")), va="center", fontsize=8, color="0.4"
            )
        low, high = getattr(row, "plan_s_min", row.plan_s), getattr(row, "plan_s_max", row.plan_s)
        right.plot([low, high], [y, y], color=shade, linewidth=3, alpha=0.5)
        right.plot(row.plan_s, y, "o", color=shade, label="planning" if i == 0 else None)
        end_to_end = getattr(row, "end_to_end_s", math.nan)
        if math.isfinite(end_to_end):
            right.plot(
                end_to_end,
                y,
                "o",
                color=shade,
                fillstyle="none",
                markersize=9,
                label="with enumeration" if i == 0 else None,
            )
        note = " timed out" if row.timed_out else ""
        total = f", {end_to_end:.3g} s end to end" if math.isfinite(end_to_end) else ""
        right.text(
            max(row.plan_s, high, end_to_end if math.isfinite(end_to_end) else 0),
            y,
            f"  {row.plan_s:.3g} s{total}{note}",
            va="center",
            fontsize=8,
        )
    left.set_yticks(positions, rows["proposer"])
    left.set_xscale("log")
    left.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    left.xaxis.set_minor_formatter(StrMethodFormatter("{x:g}"))
    left.tick_params(axis="x", which="minor", labelsize=7)
    left.set_xlabel("perf rating / best (slowest rank, log)")
    left.axvline(1.0, color="0.3", linewidth=1)
    left.set_xlim(0.95, max(2.0, (rows["perf_rating"] / best).replace(np.inf, np.nan).max() * 3))
    left.set_ylim(-0.7, len(rows) - 0.3)
    right.set_xscale("log")
    right.set_xlabel("seconds (log)")
    right.set_xlim(right.get_xlim()[0], right.get_xlim()[1] * 40)  # room for the labels
    fig.legend(*right.get_legend_handles_labels(), loc="outside lower right", fontsize=8, ncols=2)
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
    hbm_cap_gb, perf_rating (NaN: no plan). A proposer with no plan at any
    budget gets no line and no legend entry: the title names it."""
    _need(sweep, ["proposer", "hbm_cap_gb", "perf_rating"], "sweep")
    fig = new_figure(6.5, 4.2)
    ax = fig.subplots()
    without = []
    for i, (name, rows) in enumerate(sweep.groupby("proposer", sort=False)):
        rows = rows.sort_values("hbm_cap_gb")
        if not np.isfinite(rows["perf_rating"].to_numpy(dtype=float)).any():
            without.append(name)
            continue
        ax.plot(rows["hbm_cap_gb"], rows["perf_rating"], marker="o", color=color(name, i), label=name)
    ax.invert_xaxis()
    ax.set_yscale("log")
    _plain_log_ticks(ax)
    ax.set_xlabel("HBM per device, GiB (shrinking to the right)")
    ax.set_ylabel("perf rating, ms (slowest rank, log)")
    fig.legend(loc="outside lower center", fontsize=8, ncols=4)
    note = f"; no plan at any budget: {', '.join(without)}" if without else ""
    ax.set_title(title or f"Plan quality as the memory budget shrinks (gaps: no plan{note})", fontsize=9)
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
    mean = loads["perf"].mean()
    axes[0].axhline(mean, **MEAN_STYLE)
    axes[0].text(len(ranks) - 0.5, mean * 1.01, "mean", ha="right", va="bottom", fontsize=7)
    axes[0].set_ylim(0, loads["perf"].max() * 1.12)
    axes[0].set_ylabel("summed perf, ms")
    axes[0].set_title(f"perf per rank (slowest: rank {slowest})")
    for ax, column, name in ((axes[1], "hbm_gb", "HBM"), (axes[2], "ddr_gb", "DDR")):
        ax.bar(ranks, loads[column], color="#4c72b0")
        cap = (capacity_gb or {}).get(column.split("_")[0])
        ax.set_ylabel(f"{name}, GiB")
        ax.set_title(f"{name} per rank")
        if not cap:
            continue
        if cap <= 3 * max(loads[column].max(), 1e-12):  # on the bars' scale: drawn, labelled on the line
            ax.axhline(cap, color="0.3", linestyle="--", linewidth=1)
            ax.text(len(ranks) - 0.5, cap, f"capacity {cap:.3g} GiB", ha="right", va="bottom", fontsize=7)
            ax.set_ylim(0, cap * 1.12)
        else:  # a line far above would flatten the bars: say it instead
            ax.set_title(f"{name} per rank (capacity {cap:.3g} GiB, off scale)")
    for ax in axes:
        rank_ticks(ax, len(ranks))
    if title:
        fig.suptitle(title)
    return fig


def planned_title(num_tables: int, world_size: int, hbm_cap_gb: float) -> str:
    """What a comparison was planned for (the notebook's and its explorer's titles)."""
    return f"{num_tables} tables, {world_size} devices, {hbm_cap_gb:.3g} GiB HBM each"

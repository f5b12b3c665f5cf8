"""Figures of notebook 03 (DP sharding planner): each takes data, returns a Figure.

Figures use the shared style of `embnb.lab.plotting` (one colour per proposer,
rank ticks); a notebook shows one with `display(fig)`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import StrMethodFormatter

from embnb.lab.planner.explain import SmallKnapsack
from embnb.lab.plotting import MEAN_STYLE, color, new_figure, rank_ticks

__all__ = [
    "option_code",
    "knapsack_choices_figure",
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


def _plain_log_ticks(ax, axis: str = "y") -> None:
    """Log ticks as plain numbers (0.5, 2), the minor ones smaller."""
    scale = ax.xaxis if axis == "x" else ax.yaxis
    scale.set_major_formatter(StrMethodFormatter("{x:g}"))
    scale.set_minor_formatter(StrMethodFormatter("{x:g}"))
    ax.tick_params(axis=axis, which="minor", labelsize=7)


_KERNEL_CODES = {"fused": "F", "fused_uvm_caching": "C", "fused_uvm": "U"}  # compute kernel -> cell mark
_KERNEL_COLORS = {"F": "#4c72b0", "C": "#dd8452", "U": "#8172b3"}


def option_code(label: str) -> str:
    """A one-letter mark of an option label ("table_wise/fused" -> "F"):
    its compute kernel's, else the label's first letter, upper case."""
    kernel = label.split("/")[-1]
    return _KERNEL_CODES.get(kernel, kernel[:1].upper())


def knapsack_choices_figure(small: SmallKnapsack, title: str | None = None) -> Figure:
    """The DP table of a `SmallKnapsack`, one row per table added (under a
    start row: 0 ms in bin 0) and one column per memory bin. Each reachable
    cell shows its least summed perf (ms) and is coloured by the option its
    row's table took there; outlined cells and arrows: the best plan,
    backtracked from its bin in the last row up to the start."""
    codes = [[option_code(label) for label in options] for options in small.options]
    legend = list(
        dict.fromkeys(zip((c for row in codes for c in row), (x for row in small.options for x in row)))
    )
    shade = {code: _KERNEL_COLORS.get(code, color(label, i)) for i, (code, label) in enumerate(legend)}
    rows = [[0.0] + [math.inf] * small.capacity, *small.rows]
    fig = new_figure(1.6 + 0.5 * (small.capacity + 1), 1.4 + 0.48 * len(rows))
    ax = fig.subplots()
    for r, row in enumerate(rows):
        for m, perf in enumerate(row):
            if not math.isfinite(perf):
                ax.add_patch(Rectangle((m - 0.5, r - 0.5), 1, 1, color="0.93"))  # unreachable
                continue
            code = codes[r - 1][small.choices[r - 1][m]] if r else ""
            ax.add_patch(Rectangle((m - 0.5, r - 0.5), 1, 1, color=shade.get(code, "white"), alpha=0.55))
            ax.text(
                m, r, f"{code}\n{perf:.3f}" if code else f"{perf:.0f}", ha="center", va="center", fontsize=6.5
            )
    path = [small.end]
    for t in reversed(range(len(small.plan))):  # the bin each row's plan ends in, bottom up
        path.append(path[-1] - small.memories[t][small.plan[t]])
    path = path[::-1]  # path[r]: bin of row r (row 0: the start)
    for r, m in enumerate(path):
        ax.add_patch(Rectangle((m - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
        if r:
            ax.annotate("", (m, r - 0.32), (path[r - 1], r - 0.68), arrowprops=dict(arrowstyle="->", lw=1))
    labels = ["start"] + [
        f"{name}: " + ", ".join(f"{c} {w}" for c, w in zip(codes[t], small.memories[t]))
        for t, name in enumerate(small.tables)
    ]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xticks(range(small.capacity + 1))
    ax.set_xlim(-0.5, small.capacity + 0.5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel(
        f"HBM bins used, exactly (1 bin = {small.bin_gb:.4g} GiB; {small.capacity} bins: all devices)"
    )
    ax.set_ylabel("table added (its options: bins)")
    handles = [Patch(color=shade[c], alpha=0.55, label=f"{c}: {label}") for c, label in legend]
    handles.append(Patch(facecolor="0.93", label="unreachable"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    best = f"best plan: {small.rows[-1][small.end]:.3f} ms in {small.end} bins"
    ax.set_title(title or f"Knapsack DP: each cell's least estimated summed perf, ms ({best})", fontsize=10)
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
        label = "with enumeration" if i == 0 else None
        if math.isfinite(end_to_end):
            right.plot(end_to_end, y, "o", color=shade, fillstyle="none", markersize=9, label=label)
        note = " timed out" if row.timed_out else ""
        total = f", {end_to_end:.3g} s end to end" if math.isfinite(end_to_end) else ""
        at = max(row.plan_s, high, end_to_end if math.isfinite(end_to_end) else 0)
        right.text(at, y, f"  {row.plan_s:.3g} s{total}{note}", va="center", fontsize=8)
    left.set_yticks(positions, rows["proposer"])
    left.set_xscale("log")
    _plain_log_ticks(left, "x")
    left.set_xlabel("estimated perf rating / best (slowest rank, log)")
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


_MARKERS = "osD^vP"  # one per proposer, so lines that meet stay told apart


def rating_vs_budget(sweep: pd.DataFrame, reference: str = "embnb DP", title: str | None = None) -> Figure:
    """Left: each proposer's estimated perf rating against the HBM budget per
    device (log); right: its rating over `reference`'s at the same budget.
    The x axes run from the largest budget down; dashed where `memory_ratio`
    (a column, optional) is 1: left of it the least summed perf plan fits all
    devices together, right of it memory binds. Needs columns proposer,
    hbm_cap_gb, perf_rating (NaN: no plan). A proposer with no plan at any
    budget gets no line and no legend entry: the title names it."""
    _need(sweep, ["proposer", "hbm_cap_gb", "perf_rating"], "sweep")
    fig = new_figure(11, 4.2)
    left, right = fig.subplots(1, 2, sharex=True)
    base = sweep[sweep.proposer == reference].set_index("hbm_cap_gb").perf_rating
    without = []
    for i, (name, rows) in enumerate(sweep.groupby("proposer", sort=False)):
        rows = rows.sort_values("hbm_cap_gb")
        if not np.isfinite(rows["perf_rating"].to_numpy(dtype=float)).any():
            without.append(name)
            continue
        style = dict(marker=_MARKERS[i % len(_MARKERS)], fillstyle="none", color=color(name, i), label=name)
        left.plot(rows["hbm_cap_gb"], rows["perf_rating"], **style)
        if len(base):
            right.plot(
                rows["hbm_cap_gb"], rows["perf_rating"].to_numpy() / base.reindex(rows.hbm_cap_gb), **style
            )
    left.invert_xaxis()
    for ax in (left, right):
        ax.set_yscale("log")
        _plain_log_ticks(ax)
        ax.set_xlabel("HBM per device, GiB (shrinking to the right)")
        if "memory_ratio" in sweep:  # the ratio grows with the budget, linearly
            row = sweep.iloc[0]
            binds_below = row.hbm_cap_gb / row.memory_ratio
            ax.axvline(binds_below, **MEAN_STYLE)
            ax.text(
                binds_below,
                1,
                " memory binds in total ->",
                transform=ax.get_xaxis_transform(),
                fontsize=7,
                va="top",
            )
    left.set_ylabel("estimated perf rating, ms (slowest rank, log)")
    right.set_ylabel(f"estimated rating / {reference}'s (log)")
    right.axhline(1.0, color="0.3", linewidth=1)
    fig.legend(*left.get_legend_handles_labels(), loc="outside lower center", fontsize=8, ncols=4)
    note = f"; no plan at any budget: {', '.join(without)}" if without else ""
    fig.suptitle(title or f"Plan quality as the memory budget shrinks (gaps: no plan{note})", fontsize=10)
    return fig


def quality_ratios(study: pd.DataFrame, tolerance: float = 1.02, title: str | None = None) -> Figure:
    """Each proposer's estimated rating over the brute-force best, one dot
    per instance (log); no plan where brute force found one is drawn at the
    top. Dashed: `tolerance`, the bound `quality_summary` counts as "within"."""
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
        worst_text = "worst\n" + ("no plan" if worst == math.inf else f"{worst:.3g}x")
        ax.text(i, top * 1.15, worst_text, ha="center", va="bottom", fontsize=8)
    ax.axhline(tolerance, color="0.3", linestyle="--", linewidth=1)
    within = f"within {round((tolerance - 1) * 100):g}%"  # quality_summary's column of the same name
    right = ax.get_yaxis_transform()  # right of the axes, off the dots that sit on the line
    ax.text(1.01, tolerance, f"{tolerance:g}x:\n{within}", transform=right, va="center", fontsize=8)
    ax.axhline(top, color="0.8", linewidth=6, zorder=0)
    ax.text(-0.5, top, " no plan", va="center", fontsize=7, color="0.4")
    ax.set_yscale("log")
    ax.set_ylim(0.95, top * 2.2)
    _plain_log_ticks(ax)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("estimated perf rating / brute-force best (log)")
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
    axes[0].set_ylabel("estimated summed perf, ms")
    axes[0].set_title(f"estimated perf per rank (slowest: rank {slowest})")
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

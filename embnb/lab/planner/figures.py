"""Figures of notebooks 03 and 03a that pandas does not draw: each takes data, returns a Figure
(`embnb.lab.plotting`'s style; one colour per proposer)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import StrMethodFormatter

from embnb.lab.planner.calibrated import ESTIMATES, GOAL, CalibrationBench, heldout_errors
from embnb.lab.planner.explain import SmallKnapsack
from embnb.lab.planner.measured import MeasuredWorld
from embnb.lab.plotting import color, new_figure

__all__ = [
    "option_code",
    "knapsack_choices_figure",
    "proposer_comparison",
    "planned_title",
    "measured_figure",
    "calibration_scatter",
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


def planned_title(num_tables: int, world_size: int, hbm_cap_gb: float) -> str:
    """What a comparison was planned for (the notebook's and its explorer's titles)."""
    return f"{num_tables} tables, {world_size} devices, {hbm_cap_gb:.3g} GiB HBM each"


_MARKERS = "osD^vP<>"  # one per plan


def measured_figure(world: MeasuredWorld) -> Figure:
    """Left, the planners' plans on axes of their own: each interleaved round's step (dots; a grey
    line joins one round's plans) and the median (a bar across). Right, every measured plan, the
    poor ones too: the measured step against torchrec's rating (log axes)."""
    planners = world.measured(planners_only=True)
    if not planners:
        raise ValueError("no planner's plan was measured: nothing to plot")
    clock = "thread CPU time" if world.clock == "cpu" else "wall time, synchronized"
    fig = new_figure(11, 4.2)
    left, right = fig.subplots(1, 2)
    rounds = np.array([p.step_ms_repeats for p in planners])  # plans x rounds
    for steps in rounds.T:
        left.plot(range(len(planners)), steps, color="0.8", linewidth=0.8, zorder=1)
    for i, plan in enumerate(planners):
        style = dict(color=f"C{i}", marker=_MARKERS[i % len(_MARKERS)])
        left.scatter([i] * len(plan.step_ms_repeats), plan.step_ms_repeats, s=30, zorder=2, **style)
        left.plot([i - 0.25, i + 0.25], [plan.step_ms] * 2, color=style["color"], linewidth=2)
    left.set_xticks(range(len(planners)), [p.name for p in planners])
    left.set_xlim(-0.6, len(planners) - 0.4)
    left.set_ylabel(f"slowest rank's step, ms ({clock})")
    left.set_title(f"the planners' plans, {rounds.shape[1]} interleaved rounds (bar: median)", fontsize=9)
    for i, plan in enumerate(world.measured()):
        poor = plan.note == "poor on purpose"
        right.scatter(plan.rating_ms, plan.step_ms, s=40, color="0.5" if poor else f"C{i}",
                      marker=_MARKERS[i % len(_MARKERS)], zorder=2)  # fmt: skip
        if poor:  # the planners' plans: coloured as on the left
            right.annotate(f" {plan.name}", (plan.rating_ms, plan.step_ms), fontsize=7, va="center")
    right.set(xscale="log", yscale="log", xlabel="torchrec's estimated rating, ms (log)")
    right.set_ylabel(f"measured step, ms (log; {clock})")
    right.set_title("every plan (grey, named: poor on purpose)", fontsize=9)
    right.grid(True, which="major", alpha=0.3)
    fig.suptitle(
        f"W = {world.world_size} measured rank by rank on {world.device.upper()} ({world.device_name})"
    )
    return fig


def calibration_scatter(ranks: pd.DataFrame, bench: CalibrationBench) -> Figure:
    """Held-out ranks, estimated against measured lookups (log axes): left torchrec's default
    estimate, right the calibrated one. Solid: estimate = measured; dotted: the goal's band."""
    errors = heldout_errors(ranks)
    fig = new_figure(10, 4.6)
    axes = fig.subplots(1, 2, sharey=True)
    columns = ["measured_ms", *ESTIMATES]
    low, high = ranks[columns].min().min() / 1.5, ranks[columns].max().max() * 1.5
    line = np.geomspace(low, high, 50)
    for ax, name in zip(axes, ESTIMATES):
        for i, (world_size, rows) in enumerate(ranks.groupby("world_size")):
            ax.scatter(
                rows[name], rows.measured_ms, s=10, alpha=0.6, color=f"C{i}", label=f"W = {world_size}"
            )
        ax.plot(line, line, color="0.2", linewidth=1)
        for factor in (1 - GOAL, 1 + GOAL):
            ax.plot(line * factor, line, color="0.4", linewidth=0.8, linestyle=":")
        ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
        label = "torchrec's default estimate" if name == "torchrec_default" else "calibrated estimate"
        e = errors[name]
        ax.set_xlabel(f"{label} of the rank's lookups, ms")
        ax.set_title(f"{label}: |error| median {e['median']:.1%}, worst {e['worst']:.0%}", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    clock = "thread CPU time" if bench.data["clock"] == "cpu" else "wall time"
    axes[0].set_ylabel(f"measured lookups of the rank, ms ({clock})")
    fig.legend(
        *axes[0].get_legend_handles_labels(), loc="outside right center", fontsize=8, title="world size"
    )
    fig.suptitle(f"{len(ranks)} held-out ranks measured on {bench.device.upper()} ({bench.device_name}); "
                 f"dotted: the {GOAL:.0%} goal", fontsize=10)  # fmt: skip
    return fig

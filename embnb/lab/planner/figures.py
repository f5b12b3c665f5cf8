"""Figures of notebooks 03 and 03a: the knapsack grid (a teaching drawing) and the proposers side by
side in matplotlib, the measured plans and the calibration in seaborn; each takes data and returns a
Figure."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import StrMethodFormatter

from embnb.lab.planner.calibrated import ESTIMATES, GOAL, heldout_errors
from embnb.lab.planner.candidates import MeasuredCandidates
from embnb.lab.planner.explain import SmallKnapsack
from embnb.lab.plotting import color, new_figure
from embnb.results import Run

__all__ = ["option_code", "knapsack_choices_figure", "proposer_comparison", "planned_title"]
__all__ += ["measured_figure", "calibration_scatter"]

_KERNEL_CODES = {"fused": "F", "fused_uvm_caching": "C", "fused_uvm": "U"}  # compute kernel -> cell mark
_KERNEL_COLORS = {"F": "#4c72b0", "C": "#dd8452", "U": "#8172b3"}


def option_code(label: str) -> str:
    """A one-letter mark of an option label ("table_wise/fused" -> "F"): its compute kernel's,
    else the label's first letter, upper case."""
    kernel = label.split("/")[-1]
    return _KERNEL_CODES.get(kernel, kernel[:1].upper())


def knapsack_choices_figure(
    small: SmallKnapsack,
    dp: list[list[float]],
    choices: list[list[int]],
    plan: list[int],
) -> Figure:
    """The DP table `dp` filled over a `SmallKnapsack` (`dp[t][m]`: least summed perf of tables 0..t
    in exactly m bins; `choices[t][m]`: the option that cell took, -1 none), one row per table added
    (under a start row: 0 ms in bin 0) and one column per memory bin; each reachable cell shows its
    least summed perf (ms), coloured by the option its row's table took there; outlined cells and
    arrows: the walked-back `plan` (one option per table)."""
    codes = [[option_code(label) for label in options] for options in small.options]
    legend = list(dict.fromkeys(zip(sum(codes, []), sum(small.options, []))))
    shade = {code: _KERNEL_COLORS.get(code, color(label, i)) for i, (code, label) in enumerate(legend)}
    rows = [[0.0] + [math.inf] * small.capacity, *dp]
    fig = new_figure(1.6 + 0.5 * (small.capacity + 1), 1.4 + 0.48 * len(rows))
    ax = fig.subplots()
    for r, row in enumerate(rows):
        for m, perf in enumerate(row):
            if not math.isfinite(perf):
                ax.add_patch(Rectangle((m - 0.5, r - 0.5), 1, 1, color="0.93"))  # unreachable
                continue
            code = codes[r - 1][choices[r - 1][m]] if r else ""
            ax.add_patch(Rectangle((m - 0.5, r - 0.5), 1, 1, color=shade.get(code, "white"), alpha=0.55))
            text = f"{code}\n{perf:.3f}" if code else f"{perf:.0f}"
            ax.text(m, r, text, ha="center", va="center", fontsize=6.5)
    # path[r]: the bin the best plan is in after row r (row 0: the start, bin 0)
    path = [0, *itertools.accumulate(small.memories[t][o] for t, o in enumerate(plan))]
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
    best = f"best plan: {dp[-1][path[-1]]:.3f} ms in {path[-1]} bins"
    ax.set_title(f"Knapsack DP: each cell's least estimated summed perf, ms ({best})", fontsize=10)
    return fig


def proposer_comparison(table: pd.DataFrame, title: str | None = None) -> Figure:
    """Per proposer (a `compare_proposers` table, one row each): left, its best plan's perf rating
    over the best of all (log; no dot: no plan, its note is in the table); right, planning seconds
    (log): the median run's (filled), the range over the repeats (a bar) and end to end with the
    enumeration (hollow)."""
    rows = table.reset_index()
    if rows.perf_rating.isna().all():
        notes = "; ".join(f"{r.proposer}: {getattr(r, 'note', '') or 'no plan'}" for r in rows.itertuples())
        raise ValueError(f"no proposer found a plan, nothing to compare ({notes})")
    y = np.arange(len(rows))[::-1]  # top down
    colors = [color(name, i) for i, name in enumerate(rows.proposer)]
    fig = new_figure(10, 1.2 + 0.4 * len(rows))
    left, right = fig.subplots(1, 2, sharey=True)
    left.scatter(rows.perf_rating / rows.perf_rating.min(), y, c=colors, s=50)
    left.axvline(1.0, color="0.3", linewidth=1)
    left.set(xscale="log", xlabel="estimated perf rating / best (slowest rank, log)")
    left.set_yticks(y, rows.proposer)
    right.hlines(y, rows.plan_s_min, rows.plan_s_max, colors=colors, linewidth=3, alpha=0.5)
    right.scatter(rows.plan_s, y, c=colors, s=50, label="planning")
    right.scatter(rows.end_to_end_s, y, s=80, facecolors="none", edgecolors=colors, label="with enumeration")
    right.set(xscale="log", xlabel="seconds (log)")
    right.legend(fontsize=8)
    fig.suptitle(title or "torchrec's planner with each proposer")
    return fig


def planned_title(num_tables: int, world_size: int, hbm_cap_gb: float) -> str:
    """What a comparison was planned for (the notebook's and its explorer's titles)."""
    return f"{num_tables} tables, {world_size} devices, {hbm_cap_gb:.3g} GiB HBM each"


def measured_figure(measured: MeasuredCandidates) -> Figure:
    """Left, the planners' plans on axes of their own: each interleaved round's step (dots; a grey
    line joins one round's plans). Right, every measured plan, the poor ones too: the median step
    against torchrec's rating (log axes)."""
    rows = pd.DataFrame(measured.rows())
    ran = rows[rows.get("step_ms", pd.Series(dtype=float)).notna()]
    planners = ran[~ran.poor]
    if planners.empty:
        raise ValueError("no planner's plan was measured: nothing to plot")
    world = measured.world
    clock = "thread CPU time" if world.clock == "cpu" else "wall time, synchronized"
    rounds = planners.explode("step_ms_rounds").astype({"step_ms_rounds": float})
    rounds["round"] = rounds.groupby("plan").cumcount()
    fig = new_figure(11, 4.2)
    left, right = fig.subplots(1, 2)
    by_round = rounds.pivot(index="plan", columns="round", values="step_ms_rounds").loc[planners.plan]
    left.plot(range(len(by_round)), by_round.to_numpy(), color="0.8", linewidth=0.8, zorder=1)
    colors = dict(zip(planners.plan, sns.color_palette(n_colors=len(planners))))
    colors |= dict.fromkeys(ran.plan[ran.poor], "0.5")
    sns.stripplot(rounds, x="plan", y="step_ms_rounds", hue="plan", palette=colors, jitter=False, ax=left)
    left.set(xlabel="", ylabel=f"slowest rank's step, ms ({clock})")
    left.set_title(f"the planners' plans, {world.rounds} interleaved rounds", fontsize=9)
    style = dict(hue="plan", palette=colors, style="poor", s=50, legend=False)
    sns.scatterplot(ran, x="rating_ms", y="step_ms", ax=right, **style)
    for row in ran[ran.poor].itertuples():
        right.annotate(f" {row.plan}", (row.rating_ms, row.step_ms), fontsize=7, va="center")
    right.set(xscale="log", yscale="log", xlabel="torchrec's estimated rating, ms (log)")
    right.set_xlim(right=ran.rating_ms.max() * 4)  # room for the names
    right.set_ylabel(f"measured step, median, ms (log; {clock})")
    right.set_title("every measured plan (coloured as on the left; grey, named: poor on purpose)", fontsize=9)
    for axis in (right.xaxis, right.yaxis):
        axis.set_major_formatter(StrMethodFormatter("{x:g}"))
        axis.set_minor_formatter(StrMethodFormatter("{x:g}"))
    right.tick_params(which="minor", labelsize=7)
    right.grid(True, which="major", alpha=0.3)
    name = f"{world.device.upper()} ({world.machine})"
    fig.suptitle(f"W = {measured.topology.world_size} measured rank by rank on {name}")
    return fig


def calibration_scatter(ranks: pd.DataFrame, bench: Run) -> Figure:
    """Held-out ranks, estimated against measured lookups (log axes): left torchrec's default
    estimate, right the calibrated one. Solid: estimate = measured; dotted: the goal's band."""
    errors = heldout_errors(ranks)
    fig = new_figure(10, 4.6)
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    dots = dict(y="measured_ms", hue="world_size", palette="deep", s=12, alpha=0.6)  # both panels alike
    for ax, name in zip(axes, ESTIMATES):
        sns.scatterplot(ranks, x=name, ax=ax, legend=name == "calibrated", **dots)
        for factor, style in ((1, "-"), (1 - GOAL, ":"), (1 + GOAL, ":")):
            ax.axline((1, factor), (10, 10 * factor), color="0.3", linewidth=0.8, linestyle=style)
        label = "torchrec's default estimate" if name == "torchrec_default" else "calibrated estimate"
        e = errors[name]
        ax.set(xscale="log", yscale="log", xlabel=f"{label} of the rank's lookups, ms")
        ax.set_title(f"{label}: |error| median {e['median']:.1%}, worst {e['worst']:.0%}", fontsize=9)
    clock = "thread CPU time" if bench.data["clock"] == "cpu" else "wall time"
    axes[0].set_ylabel(f"measured lookups of the rank, ms ({clock})")
    fig.suptitle(
        f"{len(ranks)} held-out ranks measured on {bench.data['device'].upper()} ({bench.machine}); "
        f"dotted: the {GOAL:.0%} goal",
        fontsize=10,
    )
    return fig

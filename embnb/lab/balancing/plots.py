"""Figures of notebook 04 (batch balancing): each takes data, returns a Figure;
the shared style is `embnb.lab.plotting` (per-rank loads are its `rank_bars`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import (
    FixedLocator,
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
    PercentFormatter,
)

from embnb.balancing.timeline import phase_seconds
from embnb.lab.balancing.memory_cap import MIB, CapComparison
from embnb.lab.plotting import MEAN_STYLE, color, new_figure, rank_ticks, values_of
from embnb.timing import paired_difference

PHASE_COLORS = {  # Gantt chart phases
    "load": "#c7c7c7",
    "gather_workloads": "#8172b3",
    "kk": "#c44e52",
    "exchange": "#937860",
    "forward": "#4c72b0",
    "backward": "#55a868",
    "wait": "#000000",
    "all_reduce": "#dd8452",
    "optimizer": "#da8bc3",
}


def length_histogram(samples: Mapping[str, Sequence[int] | torch.Tensor], title: str | None = None) -> Figure:
    """Every distribution of `samples` (name -> lengths) in the same two
    panels, one colour and marker each: counts of each sequence length on
    log-log axes (a power law is a line), and the share of all tokens held
    by the longest samples."""
    if not samples:
        raise ValueError("samples is empty: nothing to plot")
    fig = new_figure(9, 3.4)
    ax, share_ax = fig.subplots(1, 2)
    for i, (name, lengths) in enumerate(samples.items()):
        values = sorted(values_of(lengths, f"lengths of {name!r}"))
        shade, marker = color(name, i), "o^sD"[i % 4]
        counts = pd.Series(values).value_counts().sort_index()
        ax.loglog(counts.index, counts.values, marker, ms=3, color=shade, alpha=0.7, label=name)
        cumulative = pd.Series(values[::-1]).cumsum() / sum(values)
        fractions = [(k + 1) / len(values) for k in range(len(values))]
        share_ax.plot(fractions, cumulative.values, color=shade, label=name)
    ax.set(xlabel="sequence length", ylabel="samples", title="length distribution")
    share_ax.set_xscale("log")
    share_ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    share_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    share_ax.set(
        xlabel="longest samples (share of the batch)",
        ylabel="share of all tokens",
        title="the tail holds the tokens",
    )
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=len(samples), fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def gap_by_method(table: pd.DataFrame, methods: Sequence[str], title: str | None = None) -> Figure:
    """Per (distribution, workload), a row of panels: each method's max/mean over the lower
    bound's (the floor no split goes below), and its gap to that bound (log axis; a split at
    the bound marked at the floor as "= bound"). Means over seeds per (num_samples, num_parts);
    `table` is `comparison.comparison_table`'s."""
    if table.empty:
        raise ValueError("table is empty: nothing to plot")
    table = table.assign(
        bound_over_mean=table["lower_bound"] / table["mean_load"],
        workload=table["distribution"] + ", " + table["workload"],
    )
    workloads = list(dict.fromkeys(table["workload"]))
    fig = new_figure(10, 0.6 + 3.2 * len(workloads))
    axes = fig.subplots(len(workloads), 2, squeeze=False)
    floor = 1e-5
    for (ratio_ax, gap_ax), workload in zip(axes, workloads):
        grid = (
            table[table["workload"] == workload]
            .groupby(["num_samples", "num_parts", "method"])
            .mean(numeric_only=True)
        )
        cases = list(dict.fromkeys((n, k) for n, k, _ in grid.index))
        xs = range(len(cases))
        bounds = [grid.loc[(n, k)]["bound_over_mean"].iloc[0] for n, k in cases]
        ratio_ax.plot(xs, bounds, "_", color="black", markersize=28, mew=2, label="lower bound")
        for i, method in enumerate(methods):
            offset = (i - (len(methods) - 1) / 2) * 0.12
            shifted = [x + offset for x in xs]
            ratios = [grid.loc[(n, k, method), "max_over_mean"] for n, k in cases]
            gaps = [grid.loc[(n, k, method), "gap_to_lower_bound"] for n, k in cases]
            ratio_ax.plot(shifted, ratios, "o", color=color(method, i), label=method)
            gap_ax.plot(shifted, [max(g, floor) for g in gaps], "o", color=color(method, i), label=method)
        ratio_ax.set_yscale("log")
        low, high = ratio_ax.get_ylim()
        # within a decade (the log-normal tokens: 1 to 1.2) 1-2-5 ticks would leave one label
        if high / low < 10:  # even steps, and 1 (a perfect split) always labelled
            ticks = {1.0, *MaxNLocator(nbins=4).tick_values(low, high)}
            ratio_ax.yaxis.set_major_locator(FixedLocator(sorted(t for t in ticks if low <= t <= high)))
        else:
            ratio_ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ratio_ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ratio_ax.yaxis.set_minor_formatter(NullFormatter())
        ratio_ax.set_ylabel(f"max/mean ({workload})")
        gap_ax.axhline(0.01, **{**MEAN_STYLE, "color": "#c44e52"})
        gap_ax.annotate("1%", (-0.45, 0.01), fontsize=8, va="bottom")
        gap_ax.axhline(floor, color="0.6", linewidth=0.8)
        gap_ax.annotate("= bound", (-0.45, floor), fontsize=8, va="bottom")
        gap_ax.set_yscale("log")
        gap_ax.set_ylim(bottom=floor / 2)
        gap_ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: "" if y < floor else f"{100 * y:.3g}%"))
        gap_ax.set_ylabel(f"gap to the bound ({workload})")
        for ax in (ratio_ax, gap_ax):
            ax.set_xticks(list(xs), [f"{n}\ninto {k}" for n, k in cases], fontsize=8)
            ax.set_xlim(-0.6, len(cases) - 0.4)
    axes[0][0].set_title("max/mean: the bound is the floor")
    axes[0][1].set_title("largest part above max(mean, largest item)")
    handles, names = axes[0][0].get_legend_handles_labels()
    axes[0][1].legend(handles, names, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if title:
        fig.suptitle(title)
    return fig


def flops_vs_length(
    rows: Mapping[str, tuple[Any, Any, Mapping[str, float]]], title: str | None = None
) -> Figure:
    """A row per batch, titled by its name (rows[name] = (lengths, flops,
    flops_max_over_mean)): each sample's FLOPs against its length (the
    quadratic bend), and max/mean FLOPs per rank balanced by each estimate."""
    if not rows:
        raise ValueError("rows is empty: nothing to plot")
    fig = new_figure(8.4, 0.4 + 3.4 * len(rows))
    for sub, (name, (lengths, flops, ratios)) in zip(
        fig.subfigures(len(rows), 1, squeeze=False)[:, 0], rows.items()
    ):
        xs, ys = values_of(lengths, "lengths"), values_of(flops, "flops")
        if len(xs) != len(ys):
            raise ValueError(f"{len(xs)} lengths but {len(ys)} flops")
        axes = sub.subplots(1, 2 if ratios else 1, squeeze=False)[0]
        axes[0].loglog(xs, ys, ".", color="#4c72b0", alpha=0.5)
        axes[0].set(xlabel="sequence length", ylabel="attention block FLOPs", title="FLOPs per sample")
        sub.suptitle(name, fontsize=10)
        if ratios:
            names = list(ratios)
            axes[1].bar(names, [ratios[n] for n in names], color=[color(n, i) for i, n in enumerate(names)])
            axes[1].axhline(1.0, color="0.3", linestyle="--", linewidth=1)
            axes[1].set(ylabel="max/mean FLOPs per rank", title="balanced by ...")
            for i, n in enumerate(names):
                axes[1].annotate(f"{ratios[n]:.3f}", (i, ratios[n]), ha="center", va="bottom", fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def gantt(
    spans_by_run: Mapping[str, Sequence[Mapping[str, Any]]],
    steps: Sequence[int] | None = None,
    title: str | None = None,
) -> Figure:
    """One panel per run: per rank a row for its training loop ("main") and
    a row below for its shuffle worker, bars per phase, time in ms from the
    run's first span; the step labels sit above each iteration. Spans need
    phase, rank, start, end (seconds) and thread; `steps` keeps the spans of
    those loop iterations (the "iteration" field). The legend gives each
    phase's ms per drawn step (mean over the drawn steps and ranks), so it
    says what the bars show."""
    if not spans_by_run:
        raise ValueError("spans_by_run is empty: nothing to plot")
    names = list(spans_by_run)
    fig = new_figure(12, 0.9 + 2.3 * len(names))
    axes = fig.subplots(len(names), 1, squeeze=False)[:, 0]
    for ax, name in zip(axes, names):
        spans = [s for s in spans_by_run[name] if steps is None or s.get("iteration", s["step"]) in steps]
        if not spans:
            raise ValueError(f"run {name!r} has no spans to draw")
        t0 = min(s["start"] for s in spans)
        ranks = sorted({s["rank"] for s in spans})
        for s in spans:
            left, width = (s["start"] - t0) * 1e3, max((s["end"] - s["start"]) * 1e3, 1e-3)
            row = ranks.index(s["rank"])
            if s["phase"] == "step":  # the iteration's extent, as a bracket above the main row
                ax.annotate(f"step {s['iteration']}", (left, row - 0.45), fontsize=7, va="bottom")
                ax.plot([left, left + width], [row - 0.42] * 2, color="0.4", linewidth=0.8)
                continue
            worker = s.get("thread") == "worker"
            y, height = (row + 0.3, 0.22) if worker else (row - 0.1, 0.5)
            ax.broken_barh(
                [(left, width)], (y - height / 2, height), color=PHASE_COLORS.get(s["phase"], "0.5")
            )
        ax.set_yticks(
            [r + dy for r in range(len(ranks)) for dy in (-0.1, 0.3)],
            [f"rank {r} {what}" for r in ranks for what in ("loop", "worker")],
            fontsize=8,
        )
        ax.set(ylim=(len(ranks) - 0.4, -0.6), xlabel="ms")
        ax.set_title(name, loc="left", fontsize=10)
        present = dict.fromkeys(s["phase"] for s in spans if s["phase"] != "step")
        drawn = sorted({s.get("iteration", s["step"]) for s in spans})
        seconds = phase_seconds([dict(s, warmup=False) for s in spans], drawn, len(ranks))
        ms = {key: 1e3 * v for key, v in seconds.items()}
        handles = [Patch(color=PHASE_COLORS.get(p, "0.5"), label=_phase_label(p, ms)) for p in present]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  title="ms per drawn step", title_fontsize=7)  # fmt: skip
    if title:
        fig.suptitle(title)
    return fig


def _phase_label(phase: str, ms: Mapping[tuple[str, str], float]) -> str:
    """ "kk: 0.2 (worker) ms": the phase's ms per step in each thread it ran in."""
    times = [f"{v:.1f}" + (" (worker)" if t == "worker" else "") for (t, p), v in ms.items() if p == phase]
    return f"{phase}: {', '.join(times)} ms" if times else phase


def exchange_scaling(
    bytes_by_world_size: Mapping[int, Mapping[str, float]],
    ms_by_world_size: Mapping[int, Mapping[str, Mapping[str, float]]],
    title: str | None = None,
) -> Figure:
    """Left: the most bytes a rank receives per exchange as W grows, all-gather against
    all-to-all (computed). Right: measured ms per exchange (W -> exchange -> median, low,
    high; whisker: the range)."""
    if not bytes_by_world_size:
        raise ValueError("bytes_by_world_size is empty: nothing to plot")
    fig = new_figure(9.2, 3.4)
    axes = fig.subplots(1, 2)
    sizes, run = sorted(bytes_by_world_size), sorted(ms_by_world_size)
    for i, exchange in enumerate(("allgather", "alltoall")):
        style = {"color": color(exchange, i + 2), "marker": "os"[i], "label": exchange}
        axes[0].loglog(sizes, [bytes_by_world_size[w][exchange] for w in sizes], **style)
        ms = [ms_by_world_size[w][exchange] for w in run]
        axes[1].errorbar(
            [w * (0.97 if i == 0 else 1.03) for w in run], [r["median"] for r in ms], capsize=3,
            linestyle="-", **style,
            yerr=[[r["median"] - r["low"] for r in ms], [r["high"] - r["median"] for r in ms]],
        )  # fmt: skip
    axes[0].set(xlabel="ranks", ylabel="bytes received per rank", title="bytes (from the batch's sizes)")
    axes[0].legend(fontsize=8)
    axes[1].set_xscale("log")
    axes[1].set_ylim(bottom=0)
    axes[1].set(xlabel="ranks", ylabel="ms per exchange", title="measured here")
    for ax, ticks in zip(axes, [sizes, run]):
        ax.set_xticks(ticks, [str(w) for w in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    if title:
        fig.suptitle(title)
    return fig


def step_times(
    step_ms: Mapping[str, Sequence[float]],
    reference: str,
    flops_ideal: Mapping[str, float],
    compared: tuple[str, str],
    title: str | None = None,
) -> Figure:
    """Three panels over repeats of every run (label -> ms per step, one
    value per repeat, each repeat timed back to back in every run):
    the step times (a line joins one repeat across runs); the speed-up over
    `reference` (mean step times' ratio, whisker: the range of the repeats'
    ratios, dots: each repeat) next to what the
    slowest rank's FLOPs predict; and `compared` = (a, b): a minus b per
    repeat with the mean and its 95% interval."""
    if reference not in step_ms or any(c not in step_ms for c in compared):
        raise ValueError(f"runs {[reference, *compared]} must all be in step_ms; it has {list(step_ms)}")
    labels = list(step_ms)
    fig = new_figure(12, 3.8)
    times_ax, speed_ax, diff_ax = fig.subplots(1, 3, width_ratios=[1.4, 1.4, 0.8])
    for repeat in zip(*(step_ms[label] for label in labels)):
        times_ax.plot(range(len(labels)), repeat, "-", color="0.8", linewidth=0.8, zorder=1)
    for x, label in enumerate(labels):
        times_ax.plot([x] * len(step_ms[label]), step_ms[label], "o", color=color(label, x), zorder=2)
        speeds = [ref / mine for ref, mine in zip(step_ms[reference], step_ms[label])]
        ratio = statistics.fmean(step_ms[reference]) / statistics.fmean(step_ms[label])
        speed_ax.errorbar(
            x, ratio, yerr=[[max(0.0, ratio - min(speeds))], [max(0.0, max(speeds) - ratio)]], fmt="o",
            color=color(label, x), capsize=4, label="measured" if x == 0 else None,
        )  # fmt: skip
        speed_ax.plot([x + 0.15] * len(speeds), speeds, ".", color=color(label, x), alpha=0.5)
        speed_ax.plot(
            x - 0.15, flops_ideal[label], "x", color="black", label="FLOPs predict" if x == 0 else None
        )
    for ax in (times_ax, speed_ax):
        ax.set_xticks(range(len(labels)), labels, rotation=15, ha="right", fontsize=8)
        ax.set_xlim(-0.5, len(labels) - 0.5)
    times_ax.set_ylim(bottom=0)
    times_ax.set(ylabel="ms per step (slowest rank)", title="step time per repeat")
    speed_ax.axhline(1.0, **MEAN_STYLE)
    speed_ax.set(ylabel=f"speed-up over {reference}", title="measured (mean, range) vs FLOPs")
    speed_ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncols=2)  # off the data
    a, b = compared
    diffs = [x - y for x, y in zip(step_ms[a], step_ms[b])]
    difference = paired_difference(step_ms[a], step_ms[b])
    diff_ax.plot([0.15] * len(diffs), diffs, ".", color="0.5")
    if difference.repeats > 1:
        yerr = [[difference.mean - difference.ci_low], [difference.ci_high - difference.mean]]
        diff_ax.errorbar(0, difference.mean, yerr=yerr, fmt="o", color="black", capsize=4)
    diff_ax.axhline(0.0, **MEAN_STYLE)
    diff_ax.set_xticks([0], [f"{a}\nminus {b}"], fontsize=8)
    diff_ax.set_xlim(-0.5, 0.5)
    diff_ax.set(ylabel="ms per step", title="paired difference, 95% CI")
    if title:
        fig.suptitle(title)
    return fig


CLOCK_NAMES = {"cpu": "thread CPU", "wall": "synchronized wall"}


def measured_speedups(table: pd.DataFrame, methods: Sequence[str], title: str | None = None) -> Figure:
    """One panel per distribution: at each W, each method's measured
    speed-up over the loader's cut (filled dot) and the FLOP model's (open
    dot, same colour, beside it), and the bound's (black dash): no method
    beats it in FLOPs; a measured dot above it is ringed in red (time is
    not FLOPs: `cost_fit`); where `table` has `cost_fit`'s `fitted_model`
    column, a black cross on each measured dot's x marks what the fitted
    per-rank cost predicts, so a ringed dot is read against its cross.
    `table` is `BalancedSteps.speedups()` (or `cost_fit.with_explanations`')."""
    names = list(dict.fromkeys(table["distribution"]))
    (clock,) = set(table["clock"]) if "clock" in table else {"cpu"}  # one clock per table
    fig = new_figure(5.2 * len(names), 3.8)
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    width = 0.8 / len(methods)
    for ax, name in zip(axes, names):
        rows = table[table["distribution"] == name]
        sizes = sorted(set(rows["world_size"]))
        for x, w in enumerate(sizes):
            at = rows[rows["world_size"] == w].set_index("method")
            ax.hlines(at["bound"].iloc[0], x - 0.45, x + 0.45, color="black", linewidth=2, zorder=3)
            for m, method in enumerate(methods):
                pos = x - 0.4 + width * (m + 0.5)
                measured = at.loc[method, "measured"]
                ax.plot(pos - width / 5, measured, "o", color=color(method, m), zorder=4)
                if measured > at.loc[method, "bound"]:  # the section's fit explains these
                    ax.plot(pos - width / 5, measured, "o", ms=11, mfc="none", color="red", zorder=5)
                if "fitted_model" in at:  # what the per-rank cost fit predicts, on the measured dot's x
                    ax.plot(pos - width / 5, at.loc[method, "fitted_model"], "x", color="black", zorder=6)
                flops = at.loc[method, "flop_model"]
                ax.plot(pos + width / 5, flops, "o", mfc="white", color=color(method, m), zorder=4)
        ax.axhline(1.0, **MEAN_STYLE)
        ax.set_xticks(range(len(sizes)), [f"W={w}" for w in sizes])
        ax.set(xlim=(-0.5, len(sizes) - 0.5), ylabel="speed-up over the loader's cut", title=name)
    handles = [_key(m, marker="o", color=color(m, i)) for i, m in enumerate(methods)] + [
        _key(f"measured (slowest rank, {CLOCK_NAMES[clock]})", marker="o", color="0.3"),
        _key("FLOP model (max FLOPs ratio)", marker="o", mfc="white", color="0.3"),
        _key("bound (cut's max FLOPs / lower bound)", color="black", linewidth=2, linestyle="-"),
        _key("measured above the FLOP bound", marker="o", ms=11, mfc="none", color="red"),
    ]
    if "fitted_model" in table:
        handles.append(_key("fitted cost (FLOPs + lengths + tokens)", marker="x", color="black"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8)  # off the data
    if title:
        fig.suptitle(title)
    return fig


def _key(label: str, **style: Any) -> Line2D:
    """A legend entry drawn as `style` (markers alone unless it sets a linestyle)."""
    return Line2D([], [], **{"linestyle": "", **style}, label=label)


def cap_comparison(comparisons: Sequence[CapComparison], title: str) -> Figure:
    """One row per batch, one bar per run (uncapped KK + swaps, token cap,
    bytes cap) over the ranks: tokens with the token cap drawn, modelled
    activation MiB with the bytes cap drawn, and each rank's measured peak
    MiB with the uncapped run's largest peak drawn (what a cap should lower)."""
    if not comparisons:
        raise ValueError("comparisons is empty: nothing to plot")
    labels = ["uncapped", "token cap", "bytes cap"]
    fig = new_figure(12, 0.8 + 3.0 * len(comparisons))
    rows = fig.subplots(len(comparisons), 3, squeeze=False)
    width = 0.8 / len(labels)
    for (tokens_ax, model_ax, peak_ax), c in zip(rows, comparisons):
        for i, label in enumerate(labels):
            offsets = [r - 0.4 + width * (i + 0.5) for r in range(c.world_size)]
            shade = color(label, i)
            tokens_ax.bar(offsets, c.steps[label].tokens, width, color=shade, label=label)
            model_ax.bar(offsets, [b / MIB for b in c.modelled_bytes[label]], width, color=shade)
            peak_ax.bar(offsets, [b / MIB for b in c.peak_bytes[label]], width, color=shade)
        tokens_ax.axhline(c.token_cap, color="black", linewidth=1.5)
        model_ax.axhline(c.bytes_cap / MIB, color="black", linewidth=1.5)
        peak_ax.axhline(c.largest_peak_mib("uncapped"), **MEAN_STYLE)
        tokens_ax.set_ylabel(f"{c.distribution}\ntokens per rank\n(line: the token cap)")
        model_ax.set_ylabel("modelled activation MiB\n(line: the bytes cap)")
        peak_ax.set_ylabel("peak MiB, measured\n(dashed: uncapped largest)")
        for ax in (tokens_ax, model_ax, peak_ax):
            rank_ticks(ax, c.world_size)
            ax.set_ylim(bottom=0)
    fig.legend(*rows[0][0].get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle(title)
    return fig

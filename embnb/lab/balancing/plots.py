"""Figures of notebook 04 (batch balancing): each takes data, returns a Figure;
the shared style is `embnb.lab.plotting` (per-rank loads are its `rank_bars`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from embnb.balancing.timeline import phase_seconds
from embnb.lab.balancing.cost_fit import WORK, fit_rank_time
from embnb.lab.plotting import MEAN_STYLE, color, new_figure

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


def gap_panels(table: pd.DataFrame, methods: Sequence[str], title: str | None = None) -> Figure:
    """One panel per (distribution, workload), at most 4: each method's worst gap to the lower
    bound max(mean, largest item) over seeds, per (samples, parts), on a log axis; methods side
    by side with their own marker, so a tie shows as equal heights, not as one hidden marker; a
    split at the bound sits on the floor line. `table` is `comparison.comparison_table`'s."""
    cases = table.groupby(["distribution", "workload"], sort=False)
    if not 0 < cases.ngroups <= 4:
        raise ValueError(f"need 1 to 4 (distribution, workload) pairs, got {cases.ngroups}")
    floor = 1e-5
    fig = new_figure(9, 6.4 if cases.ngroups > 2 else 3.4)
    axes = fig.subplots(-(-cases.ngroups // 2), min(2, cases.ngroups), squeeze=False, sharey=True).ravel()
    for ax, ((name, workload), rows) in zip(axes, cases):
        worst = rows.groupby(["num_samples", "num_parts", "method"])["gap_to_lower_bound"].max()
        sizes = list(dict.fromkeys((n, k) for n, k, _ in worst.index))
        for i, method in enumerate(methods):
            offset = (i - (len(methods) - 1) / 2) * 0.15
            gaps = [max(worst[(n, k, method)], floor) for n, k in sizes]
            ax.plot([x + offset for x in range(len(sizes))], gaps, "osD^v"[i % 5], color=color(method, i),
                    label=method)  # fmt: skip
        ax.axhline(floor, color="0.6", linewidth=0.8)
        ax.annotate("at the bound", (-0.45, floor), fontsize=7, va="bottom")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: "" if y < floor else f"{100 * y:.3g}%"))
        ax.set_xticks(range(len(sizes)), [f"{n}\ninto {k}" for n, k in sizes], fontsize=8)
        ax.set_xlim(-0.5, len(sizes) - 0.5)
        ax.set_title(f"{name}, {workload}", fontsize=10)
        ax.set_ylabel("worst gap to the bound")
    for ax in axes[cases.ngroups :]:
        ax.set_visible(False)
    fig.legend(
        *axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(methods), fontsize=8
    )
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


def time_vs_work(ranks: pd.DataFrame, title: str | None = None) -> Figure:
    """One panel per source (at most 4): each measured rank's ms against its GFLOPs, the least
    squares line ms = fixed + per-GFLOP x GFLOPs, and the fixed part dashed: where the dashed line
    is most of a rank's time, the step follows overhead, not work. `ranks` has source, ms, gflops."""
    sources = list(dict.fromkeys(ranks["source"]))
    if not 0 < len(sources) <= 4:
        raise ValueError(f"need 1 to 4 sources, got {len(sources)}")
    fig = new_figure(3.3 * len(sources), 3.3)
    for i, (ax, source) in enumerate(zip(fig.subplots(1, len(sources), squeeze=False)[0], sources)):
        rows = ranks[ranks["source"] == source]
        fit = fit_rank_time(rows.to_dict("records"), WORK)
        ax.plot(rows["gflops"], rows["ms"], ".", color=color(source, i), alpha=0.5)
        xs = [0.0, float(rows["gflops"].max())]
        ax.plot(xs, [fit.predict({"gflops": x, "per_rank": 1.0}) for x in xs], color="black", linewidth=1)
        ax.axhline(fit.coefficients["per_rank"], **MEAN_STYLE)
        ax.set(xlabel="GFLOPs of the rank", ylabel="ms of the rank", xlim=(0, None), ylim=(0, None))
        share = round(fit.fixed_share, 2) + 0.0  # no "-0%"
        ax.set_title(f"{source}\nfixed {share:.0%} of the mean rank, r = {fit.r:.2f}", fontsize=9)
    if title:
        fig.suptitle(title)
    return fig

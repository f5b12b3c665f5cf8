"""The key numbers of notebook 03, as its results JSON: the notebook gathers each section's
results into the dataclasses below, and `notebook_results` turns one `PlannerNotebook` into the dict
(`plain`: NaN and inf as None). Ratings are torchrec's estimates (NoopPerfModel), ms."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
import torchrec

from embnb.lab.planner import gpu_runs
from embnb.lab.planner.calibrated import VERDICTS, CalibrationBench, calibration_record
from embnb.lab.planner.explain import PlanExtremes, SmallKnapsack
from embnb.lab.planner.hosts import HostLayout
from embnb.lab.planner.measured import REFERENCE_PLAN, MeasuredWorlds
from embnb.lab.planner.models import Enumerated
from embnb.lab.planner.pitfall import share_by_tightness
from embnb.lab.planner.planning import EndToEnd, plain, records
from embnb.lab.planner.quality import quality_summary
from embnb.planner.enumerator import enumerator_missing

__all__ = ["Settings", "WorkedExamples", "Planned", "InUse", "PlannerNotebook", "notebook_results"]
__all__ += ["budget_advantage", "uvm_regime"]


@dataclass(frozen=True)
class Settings:
    """What notebook 03 planned (its parameters, as the results name them)."""

    num_tables: int
    world_size: int
    hbm_cap_gb: float  # per device
    compute_device: str
    bins_per_device: int
    storage_reservation_percentage: float  # FixedPercentageStorageReservation's, for every proposer


@dataclass(frozen=True)
class WorkedExamples:
    """Sections 1 and 2: the knapsack by hand, the placement example, how often its pitfall
    happens, and the page's own code checked against the library."""

    small: SmallKnapsack
    small_matches_brute_force: bool  # every cell of the DP table
    tiny: PlanExtremes
    pitfall: pd.DataFrame  # `summed_vs_rated`
    page_core: dict[str, bool]  # the page's recurrence (`page_core_agrees`)
    capped_core: dict[str, bool]  # the page's capped runs (`capped_runs_agree`)


@dataclass(frozen=True)
class Planned:
    """Sections 3 to 8 on the model: options, ablation, comparison, budget sweep, quality study
    against brute force, and embnb DP's plan rank by rank (`rank_loads`)."""

    enumerated: Enumerated
    ablation: pd.DataFrame
    comparison: pd.DataFrame
    sweep: pd.DataFrame
    study: pd.DataFrame
    chosen_loads: pd.DataFrame


@dataclass(frozen=True)
class InUse:
    """Section 9: create_planner end to end by enumerator, and the proposers on a CPU topology."""

    end_to_end: dict[str, EndToEnd]
    enumerator_here: str  # the one create_planner picks on this torchrec
    cpu: pd.DataFrame  # `compare_proposers` on the CPU topology


@dataclass(frozen=True)
class PlannerNotebook:
    settings: Settings
    examples: WorkedExamples
    planned: Planned
    in_use: InUse
    measured: MeasuredWorlds  # section 10
    calibration: CalibrationBench  # section 11: the committed calibrate bench, loaded
    hosts: tuple[HostLayout, ...]  # every topology planned on


def notebook_results(notebook: PlannerNotebook, notebook_s: float) -> dict[str, Any]:
    settings, examples, planned, in_use = (
        notebook.settings,
        notebook.examples,
        notebook.planned,
        notebook.in_use,
    )
    small, tiny, pitfall, study = examples.small, examples.tiny, examples.pitfall, planned.study
    gap = pitfall.least_placed_sum_over_best
    calibration = calibration_record(notebook.calibration)
    regime = uvm_regime(planned.comparison, planned.sweep, notebook.measured)
    quality = quality_summary(study).rename(
        columns={"max": "worst_ratio", "median": "median_ratio", "within 2%": "within_2_percent"}
    )
    quality["no_plan"] = (~np.isfinite(study.ratio)).groupby(study.proposer, sort=False).sum()
    return plain(
        {
            "summary": _measured_lead(notebook.measured)
            + regime["gpu_sentence"]
            + ". "
            + _calibration_lead(calibration)
            + _summary(settings, planned.comparison, planned.sweep, regime)
            + _summary_tail(study, pitfall, in_use.end_to_end),
            **asdict(settings),
            "enumerate_s": planned.enumerated.seconds,
            "proposers": records(planned.comparison),
            "budget_sweep": records(
                planned.sweep[
                    ["proposer", "hbm_cap_gb", "memory_ratio", "perf_rating", "plan_s", "uvm_tables"]
                ],
                "records",
            ),
            "uvm_regime": regime,
            "calibration": calibration,
            "ablation": records(planned.ablation),
            "pitfall_instances": len(pitfall),
            "pitfall_worse_share": (gap > 1 + 1e-9).mean(),
            "pitfall_median_ratio": gap.median(),
            "pitfall_max_ratio": gap.max(),
            "pitfall_by_memory_ratio": records(share_by_tightness(pitfall).reset_index(), "records"),
            "small_knapsack": {
                **plain(small),
                "capacity_bins": small.capacity,
                "fastest_bins": sum(m[p.index(min(p))] for p, m in zip(small.perfs, small.memories)),
                "best_bins": small.end,
                "best_perf": small.rows[-1][small.end],
                "best_plan": [small.options[t][o] for t, o in enumerate(small.plan)],
                "matches_brute_force": examples.small_matches_brute_force,
            },
            "page_core_agrees": examples.page_core,
            "page_capped_runs_agree": examples.capped_core,
            "tiny_least_sum_placeable": bool(pd.notna(tiny.least_sum.perf_rating)),
            "tiny_least_placed_sum_rating": tiny.least_placed_sum.perf_rating,
            "tiny_best_rating": tiny.best_rated.perf_rating,
            "quality": records(quality),
            "quality_instances": study.instance.nunique(),
            "chosen_plan_rank_perf": planned.chosen_loads.perf.round(6).tolist(),
            "cpu_topology": in_use.cpu.perf_rating.to_dict(),
            "cpu_notes": in_use.cpu.note.to_dict(),
            "torchrec_version": torchrec.__version__,
            "enumerator_missing": enumerator_missing(),
            "enumerator_here": in_use.enumerator_here,
            "create_planner_end_to_end": {
                name: {**asdict(run), "median_s": run.median_s} for name, run in in_use.end_to_end.items()
            },
            "measured": notebook.measured.to_json(),
            "hosts": {layout.name: layout.as_dict() for layout in notebook.hosts},
            "notebook_s": notebook_s,
        }
    )


def budget_advantage(sweep: pd.DataFrame, other: str = "Greedy", reference: str = "embnb DP") -> pd.Series:
    """`other`'s estimated rating over `reference`'s at each budget of a `budget_sweep`, largest
    budget first (NaN: either has no plan)."""
    ratings = sweep.pivot(index="hbm_cap_gb", columns="proposer", values="perf_rating")
    return (ratings[other] / ratings[reference]).sort_index(ascending=False)


def uvm_regime(comparison: pd.DataFrame, sweep: pd.DataFrame, measured: MeasuredWorlds) -> dict[str, Any]:
    """Which estimated ratings no measurement here backs: plans with tables in UVM (rows in DDR;
    FBGEMM runs those kernels only on a GPU). `estimated_only`: no plan measured here used one;
    `gpu_measured`: the regime as the GPU kit measured it (committed files, not this run)."""
    ours = sweep[sweep.proposer == "embnb DP"]
    with_uvm = ours[ours.uvm_tables > 0]
    measured_uvm = sum(p.uvm_tables for world in measured.worlds for p in world.measured())
    on_gpu = gpu_runs.gpu_uvm_runs()  # the GPU kit's committed runs of this regime
    return {
        "gpu_measured": records(on_gpu, "records"),
        "gpu_sentence": gpu_runs.uvm_sentence(on_gpu),
        "estimated_only": measured_uvm == 0,
        "measured_device": measured.worlds[0].device,
        "measured_uvm_tables": int(measured_uvm),
        "embnb_dp_uvm_tables": int(comparison.loc["embnb DP", "uvm_tables"]),
        "sweep_budgets_with_uvm": with_uvm.hbm_cap_gb.tolist(),
        "sweep_memory_ratios_with_uvm": with_uvm.memory_ratio.tolist(),
    }


def _calibration_lead(record: dict[str, Any]) -> str:
    """The committed calibration's held-out errors against the goal, and how often embnb DP on it
    measured fastest."""
    errors, worlds = record["heldout_errors"], record["worlds"]
    ours = sum(w["fastest"] == "embnb DP (calibrated)" for w in worlds)
    placed = sum(w["fastest_same_as"] == "embnb DP (calibrated)" for w in worlds)  # its placement, twice
    again = f" (its placement, returned again by another planner, in {placed - ours})" * (placed > ours)
    calibrated, default = errors["calibrated"], errors["torchrec_default"]
    verdict = "goal met" if record["goal_met"] else f"the {record['goal']:.0%} goal not met"
    floor = record["rank_repeat_gap"]
    if floor is not None:
        verdict += (
            f" (the same ranks measured twice came {floor['median']:.0%} apart, median over "
            f"{floor['ranks']}: the measurement's own noise there)"
        )
    paired, planners = "", [p for p in record["paired"] if not p["poor"]]
    if planners:  # a bench that paired its rounds
        slower, faster, apart = (sum(p["verdict"] == v for p in planners) for v in VERDICTS)
        paired = (
            f" Round by round against it (each plan's step minus its, mean and 95% CI over "
            f"{planners[0]['rounds']} rounds), the other planners' plans measured slower in {slower}, "
            f"faster in {faster} and not told apart in {apart} of {len(planners)}."
        )
    return (
        f"Calibrated estimator (committed bench, {record['device'].upper()} {record['device_name']}): "
        f"held-out per-rank error of the lookups median {calibrated['median']:.1%}, worst "
        f"{calibrated['worst']:.0%} (torchrec's default {default['median']:.0%}, {default['worst']:.0%}), "
        f"{verdict}; embnb DP on it measured fastest in {ours} of {len(worlds)} held-out worlds{again}."
        f"{paired} "
    )


def _measured_lead(measured: MeasuredWorlds) -> str:
    """What section 10 measured, before any estimate: per world size the planners' plan with the
    lowest median step, embnb DP's beside it, the other planners' plans against embnb DP's round by
    round (slower, faster, not told apart), and how well torchrec's ratings order the plans."""
    parts = []
    for world in measured.worlds:
        fastest = world.winner(planners_only=True)
        ours = next((p for p in world.measured(True) if p.name == REFERENCE_PLAN), None)
        beside = "" if ours is None or ours is fastest else f", embnb DP {ours.step_ms:.3g} ms"
        paired = [p for p in world.measured(True) if p.minus_paired is not None]
        counts = {v: [p.name for p in paired if p.verdict == v] for v in VERDICTS}
        named = {v: f" ({', '.join(counts[v])})" if counts[v] and v != VERDICTS[2] else "" for v in VERDICTS}
        against = (
            f"; against embnb DP's round by round ({world.settings.repeats} rounds), the other "
            f"planners' plans: {', '.join(f'{len(counts[v])} {v}{named[v]}' for v in VERDICTS)}"
            if paired
            else ""
        )
        among = world.spearman("step_ms", planners_only=True)
        parts.append(
            f"W = {world.world_size}: lowest median step {fastest.name} ({fastest.step_ms:.3g} ms{beside})"
            f"{against}; Spearman of rating and step "
            f"{'n/a (one plan)' if math.isnan(among) else f'{among:.2f}'} among the "
            f"planners' plans, {world.spearman('step_ms'):.2f} with the poor ones"
        )
    first = measured.worlds[0]
    clock = "thread CPU time" if first.clock == "cpu" else "wall time"
    where = f"{first.device.upper()} {first.device_name}, {clock}"
    return f"Measured rank by rank ({where}, the slowest rank's step): {'. '.join(parts)}. "


def _summary(
    settings: Settings, comparison: pd.DataFrame, sweep: pd.DataFrame, regime: dict[str, Any]
) -> str:
    """The estimated ratings and planning times at the notebook's budget, and Greedy's ratio to
    the DP across the sweep."""
    rating = comparison.perf_rating
    ours, peer = comparison.loc["embnb DP"], comparison.loc["torchrec DP"]
    advantage = budget_advantage(sweep).dropna()
    ours_uvm = sweep[sweep.proposer == "embnb DP"].set_index("hbm_cap_gb").uvm_tables
    memory = sweep.groupby("hbm_cap_gb").memory_ratio.first()
    swept = ", ".join(
        f"{cap:.3g} GiB ({memory[cap]:.2f}) {ratio:.3g}x"
        + (" (estimated only: UVM)" if regime["estimated_only"] and ours_uvm.get(cap, 0) else "")
        for cap, ratio in advantage.items()
    )
    uvm = regime["embnb_dp_uvm_tables"] if regime["estimated_only"] else 0
    uvm_note = bool(uvm) * (
        f" (estimated only: {uvm} tables in UVM, kernels FBGEMM runs only on a GPU; "
        "no plan measured here has any)"
    )
    text = lambda name: f"{rating[name]:.3g} ms" if pd.notna(rating.get(name)) else "no plan"  # noqa: E731
    return (
        f"{settings.num_tables} tables on {settings.world_size}x{settings.hbm_cap_gb} GiB "
        f"({settings.storage_reservation_percentage:.0%} reserved), torchrec's estimated rating of each "
        f"plan: embnb DP {ours.perf_rating:.3g} ms{uvm_note} in {ours.plan_s:.2g} s "
        f"({ours.end_to_end_s:.2g} s with enumeration), torchrec DP {text('torchrec DP')} in "
        f"{peer.plan_s:.2g} s ({peer.end_to_end_s:.2g} s), Greedy {text('Greedy')}"
        + ("; Greedy's estimated rating over embnb DP's by HBM per device (memory ratio): " + swept)
        * bool(swept)
    )


def _summary_tail(study: pd.DataFrame, pitfall: pd.DataFrame, end_to_end: dict[str, EndToEnd]) -> str:
    """Brute force, the pitfall by memory tightness, create_planner end to end."""
    worst = quality_summary(study)["max"]
    by_ratio = ", ".join(
        f"{row.share:.0%} of {int(row.instances)} at memory ratio {label}"
        for label, row in share_by_tightness(pitfall, edges=(1.0,)).iterrows()
        if row.instances
    )
    gap = pitfall.least_placed_sum_over_best
    return (
        f"; vs brute force on {study.instance.nunique()} instances, worst {worst['embnb DP']:.3f}x "
        f"(torchrec DP {worst['torchrec DP']:.3f}x); least summed placeable plan not the best rated on "
        f"{(gap > 1 + 1e-9).mean():.0%} of {len(pitfall)} tiny instances ({by_ratio}); create_planner "
        f"from model to plan {end_to_end['embnb'].median_s:.2g} s (with torchrec's enumerator "
        f"{end_to_end['torchrec'].median_s:.2g} s)"
    )

"""The key numbers of notebook 03, as the dict its results JSON holds.

The notebook computes each part with the package's functions (and shows it)
and gathers them section by section into small dataclasses (`Settings`,
`WorkedExamples`, `Planned`, `InUse`, the measured section's
`MeasuredWorlds`, a `HostLayout` per topology); its last cell hands one
`PlannerNotebook` to `notebook_results`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torchrec

from embnb.lab.planner.ablation import ablation_records
from embnb.lab.planner.calibrated import CalibrationBench, calibration_record
from embnb.lab.planner.explain import PlanExtremes, SmallKnapsack
from embnb.lab.planner.hosts import HostLayout
from embnb.lab.planner.measured import MeasuredWorlds
from embnb.lab.planner.models import Enumerated
from embnb.lab.planner.pitfall import share_by_tightness
from embnb.lab.planner.planning import EndToEnd
from embnb.lab.planner.quality import quality_summary
from embnb.planner.enumerator import TESTED_TORCHREC

__all__ = [
    "Settings",
    "WorkedExamples",
    "Planned",
    "InUse",
    "PlannerNotebook",
    "notebook_results",
    "budget_advantage",
    "uvm_regime",
]


def _rating(table: pd.DataFrame, name: str) -> float | None:
    """A proposer's perf rating in a `compare_proposers` table; None: no plan."""
    value = table.loc[name, "perf_rating"] if name in table.index else math.nan
    return None if pd.isna(value) else float(value)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None  # None: no plan


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
    """Sections 1 and 2: the knapsack by hand, the placement example and how
    often its pitfall happens."""

    small: SmallKnapsack
    small_matches_brute_force: bool  # every cell of the DP table
    tiny: PlanExtremes
    pitfall: pd.DataFrame  # `summed_vs_rated`
    page_core: dict[str, bool]  # the recurrence written on the page against the library (`page_core_agrees`)
    capped_core: dict[str, bool]  # the page's capped runs against the library (`capped_runs_agree`)


@dataclass(frozen=True)
class Planned:
    """Sections 3 to 8: the model's options, the proposers compared (also as
    the budget shrinks), the ablation, the quality study, the chosen plan."""

    enumerated: Enumerated
    ablation: pd.DataFrame  # `ablation_table`
    comparison: pd.DataFrame  # `compare_proposers`
    sweep: pd.DataFrame  # `budget_sweep`
    study: pd.DataFrame  # `quality_study`
    chosen_loads: pd.DataFrame  # `rank_loads` of embnb DP's plan


@dataclass(frozen=True)
class InUse:
    """Section 9: create_planner from the model to the plan, by enumerator,
    and the proposers on a CPU topology."""

    end_to_end: dict[str, EndToEnd]
    enumerator_here: str  # the one create_planner picks on this torchrec
    cpu: pd.DataFrame  # `compare_proposers` on the CPU topology


@dataclass(frozen=True)
class PlannerNotebook:
    """Everything notebook 03's results JSON reports, gathered section by section."""

    settings: Settings
    examples: WorkedExamples
    planned: Planned
    in_use: InUse
    measured: MeasuredWorlds  # section 10
    calibration: CalibrationBench  # section 11: the committed calibrate bench, loaded
    hosts: tuple[HostLayout, ...]  # every topology planned on


def notebook_results(notebook: PlannerNotebook, notebook_s: float) -> dict[str, Any]:
    """The results dict of notebook 03: the settings, each proposer's row of
    the comparison, the budget sweep, the ablation ladder, the pitfall study
    (least summed perf against the best rating, also by memory tightness),
    the quality study against brute force, the knapsack worked by hand and
    the placement example, the chosen plan's perf per rank, the CPU
    topology's ratings and notes, create_planner's end-to-end runs by
    enumerator, the measured section, the hosts of every topology, and a
    one-line summary. Ratings are torchrec's estimates (NoopPerfModel over
    its estimated perfs), in ms."""
    settings, planned, in_use = notebook.settings, notebook.planned, notebook.in_use
    calibration = calibration_record(notebook.calibration)
    regime = uvm_regime(planned.comparison, planned.sweep, notebook.measured)
    return {
        "summary": _measured_lead(notebook.measured)
        + _calibration_lead(calibration)
        + _summary(settings, planned.comparison, planned.sweep, regime)
        + _summary_tail(planned.study, notebook.examples.pitfall, in_use.end_to_end),
        **dataclasses.asdict(settings),
        "enumerate_s": planned.enumerated.seconds,
        "proposers": _proposer_records(planned.comparison),
        "budget_sweep": json.loads(
            planned.sweep[
                ["proposer", "hbm_cap_gb", "memory_ratio", "perf_rating", "plan_s", "uvm_tables"]
            ].to_json(orient="records")
        ),
        "uvm_regime": regime,
        "calibration": calibration,
        "ablation": ablation_records(planned.ablation),
        **_example_records(notebook.examples),
        "quality": _quality_records(planned.study, quality_summary(planned.study)),
        "quality_instances": int(planned.study.instance.nunique()),
        "chosen_plan_rank_perf": planned.chosen_loads.perf.round(6).tolist(),
        **_in_use_records(in_use),
        "measured": notebook.measured.to_json(),
        "hosts": {layout.name: layout.as_dict() for layout in notebook.hosts},
        "notebook_s": notebook_s,
    }


def _example_records(examples: WorkedExamples) -> dict[str, Any]:
    """Sections 1 and 2: the knapsack by hand, the placement example, the pitfall study."""
    pitfall, tiny = examples.pitfall, examples.tiny
    gap = pitfall.least_placed_sum_over_best
    return {
        "pitfall_instances": len(pitfall),
        "pitfall_worse_share": float((gap > 1 + 1e-9).mean()),
        "pitfall_median_ratio": float(gap.median()),
        "pitfall_max_ratio": float(gap.max()),
        "pitfall_by_memory_ratio": json.loads(
            share_by_tightness(pitfall).reset_index().to_json(orient="records")
        ),
        "small_knapsack": _small_record(examples.small, examples.small_matches_brute_force),
        "page_core_agrees": examples.page_core,
        "page_capped_runs_agree": examples.capped_core,
        "tiny_least_sum_placeable": bool(pd.notna(tiny.least_sum.perf_rating)),
        "tiny_least_placed_sum_rating": float(tiny.least_placed_sum.perf_rating),
        "tiny_best_rating": float(tiny.best_rated.perf_rating),
    }


def _in_use_records(in_use: InUse) -> dict[str, Any]:
    """Section 9: the CPU topology and create_planner end to end."""
    cpu = in_use.cpu
    return {
        "cpu_topology": {name: _rating(cpu, name) for name in cpu.index},
        "cpu_notes": {name: note for name, note in cpu.note.items()},
        "torchrec_version": torchrec.__version__,
        "enumerator_tested_on": list(TESTED_TORCHREC),
        "enumerator_here": in_use.enumerator_here,
        "create_planner_end_to_end": {
            name: {
                "median_s": run.median_s,
                "seconds": run.seconds,
                "rating": _finite(run.rating),
                "same_rating_every_run": run.same_rating_every_run,
            }
            for name, run in in_use.end_to_end.items()
        },
    }


def budget_advantage(sweep: pd.DataFrame, other: str = "Greedy", reference: str = "embnb DP") -> pd.Series:
    """`other`'s estimated rating over `reference`'s at each budget of a
    `budget_sweep` (by hbm_cap_gb, largest first; NaN: either has no plan)."""
    ratings = sweep.pivot(index="hbm_cap_gb", columns="proposer", values="perf_rating")
    return (ratings[other] / ratings[reference]).sort_index(ascending=False)


def uvm_regime(comparison: pd.DataFrame, sweep: pd.DataFrame, measured: MeasuredWorlds) -> dict[str, Any]:
    """Which estimated ratings no measurement here backs: plans keeping tables'
    rows in DDR (UVM kernels, which FBGEMM runs only on a GPU). `estimated_only`:
    no plan section 10 measured used a UVM kernel. Also embnb DP's UVM tables
    at the notebook's budget and the budgets of the sweep where its plan has any."""
    ours = sweep[sweep.proposer == "embnb DP"]
    with_uvm = ours[ours.uvm_tables > 0]
    measured_uvm = sum(p.uvm_tables for world in measured.worlds for p in world.measured())
    return {
        "estimated_only": measured_uvm == 0,
        "measured_device": measured.worlds[0].device,
        "measured_uvm_tables": int(measured_uvm),
        "embnb_dp_uvm_tables": int(comparison.loc["embnb DP", "uvm_tables"]),
        "sweep_budgets_with_uvm": [float(cap) for cap in with_uvm.hbm_cap_gb],
        "sweep_memory_ratios_with_uvm": [float(r) for r in with_uvm.memory_ratio],
    }


def _uvm_note(regime: dict[str, Any], tables: int) -> str:
    if not (regime["estimated_only"] and tables):
        return ""
    return (
        f" (estimated only: {tables} tables in UVM, kernels FBGEMM runs only on a GPU; "
        "no plan measured here has any)"
    )


def _calibration_lead(record: dict[str, Any]) -> str:
    """The calibration's held-out errors against the goal, and how often
    embnb DP on the calibrated estimator measured fastest (the committed bench)."""
    errors, goal = record["heldout_errors"], record["goal"]
    worlds = record["worlds"]
    ours = sum(w["fastest"] == "embnb DP (calibrated)" for w in worlds)
    placed = sum(w["fastest_same_as"] == "embnb DP (calibrated)" for w in worlds)  # its placement, twice
    again = f" (its placement, returned again by another planner, in {placed - ours})" * (placed > ours)
    return (
        f"Calibrated estimator (committed bench, {record['device'].upper()} {record['device_name']}): "
        f"held-out per-rank error of the lookups median {errors['calibrated']['median']:.0%}, worst "
        f"{errors['calibrated']['worst']:.0%} (torchrec's default "
        f"{errors['torchrec_default']['median']:.0%}, {errors['torchrec_default']['worst']:.0%}), "
        + ("goal met" if record["goal_met"] else f"the {goal:.0%} goal not met")
        + f"; embnb DP on it measured fastest in {ours} of {len(worlds)} held-out worlds{again}. "
    )


def _measured_lead(measured: MeasuredWorlds) -> str:
    """The summary's lead: what section 10 measured, before any estimate: the
    planners' plan that measured fastest at each world size, with embnb DP's
    step beside it, and how well torchrec's ratings order the planners' plans
    (Spearman) against all plans, the poor ones included."""
    parts = []
    for world in measured.worlds:
        fastest = world.winner(planners_only=True)
        ours = next((p for p in world.measured(True) if p.name == "embnb DP"), None)
        beside = "" if ours is None or ours is fastest else f", embnb DP {ours.step_ms:.3g} ms"
        among = world.spearman("step_ms", planners_only=True)
        among_text = "n/a (one plan)" if math.isnan(among) else f"{among:.2f}"
        parts.append(
            f"W = {world.world_size}: {fastest.name} fastest ({fastest.step_ms:.3g} ms{beside}; Spearman of "
            f"rating and step {among_text} among the planners' plans, "
            f"{world.spearman('step_ms'):.2f} with the poor ones)"
        )
    first = measured.worlds[0]
    clock = "thread CPU time" if first.clock == "cpu" else "wall time"
    where = f"{first.device.upper()} {first.device_name}, {clock}"
    return f"Measured rank by rank ({where}, the slowest rank's step): {'; '.join(parts)}. "


def _summary(
    settings: Settings, comparison: pd.DataFrame, sweep: pd.DataFrame, regime: dict[str, Any]
) -> str:
    """The summary's first half: the estimated ratings and planning times at
    the notebook's budget, and Greedy's ratio to the DP across the sweep."""
    proposers = _proposer_records(comparison)
    ours, theirs, greedy = (_rating(comparison, n) for n in ("embnb DP", "torchrec DP", "Greedy"))
    mine, peer = proposers["embnb DP"], proposers["torchrec DP"]
    advantage = budget_advantage(sweep).dropna()
    ours_uvm = sweep[sweep.proposer == "embnb DP"].set_index("hbm_cap_gb").uvm_tables
    swept = "; Greedy's estimated rating over embnb DP's by HBM per device (memory ratio): " * bool(
        len(advantage)
    ) + ", ".join(
        f"{cap:.3g} GiB ({_memory_ratio_at(sweep, cap):.2f}) {ratio:.3g}x"
        + (" (estimated only: UVM)" if regime["estimated_only"] and ours_uvm.get(cap, 0) else "")
        for cap, ratio in advantage.items()
    )
    return (
        f"{settings.num_tables} tables on {settings.world_size}x{settings.hbm_cap_gb} GiB "
        f"({settings.storage_reservation_percentage:.0%} reserved), torchrec's "
        f"estimated rating of each plan: embnb DP {ours:.3g} ms"
        + _uvm_note(regime, regime["embnb_dp_uvm_tables"])
        + f" in {mine['plan_s']:.2g} s "
        f"({mine['end_to_end_s']:.2g} s with enumeration), torchrec DP "
        + (f"{theirs:.3g} ms" if theirs else "no plan")
        + f" in {peer['plan_s']:.2g} s ({peer['end_to_end_s']:.2g} s), Greedy "
        + (f"{greedy:.3g} ms" if greedy else "no plan")
        + swept
    )


def _memory_ratio_at(sweep: pd.DataFrame, cap: float) -> float:
    return float(sweep.loc[sweep.hbm_cap_gb == cap, "memory_ratio"].iloc[0])


def _summary_tail(study: pd.DataFrame, pitfall: pd.DataFrame, end_to_end: dict[str, EndToEnd]) -> str:
    """The summary's second half: brute force, the pitfall by memory
    tightness, create_planner end to end."""
    worst = quality_summary(study)
    tightness = share_by_tightness(pitfall, edges=(1.0,))
    by_ratio = ", ".join(
        f"{row.share:.0%} of {int(row.instances)} at memory ratio {label}"
        for label, row in tightness.iterrows()
        if row.instances
    )
    gap = pitfall.least_placed_sum_over_best
    return (
        f"; vs brute force on {study.instance.nunique()} instances, worst "
        f"{worst.loc['embnb DP', 'max']:.3f}x (torchrec DP {worst.loc['torchrec DP', 'max']:.3f}x); "
        "least summed placeable plan not the best rated "
        f"on {(gap > 1 + 1e-9).mean():.0%} of {len(pitfall)} tiny instances ({by_ratio}); create_planner "
        f"from model to plan {end_to_end['embnb'].median_s:.2g} s (with torchrec's enumerator "
        f"{end_to_end['torchrec'].median_s:.2g} s)"
    )


def _small_record(small: SmallKnapsack, matches_brute_force: bool) -> dict[str, Any]:
    """The knapsack worked by hand: its inputs, its DP table and choices (what
    the figure marks), the best plan and whether every cell matched brute force."""
    return {
        "tables": small.tables,
        "capacity_bins": small.capacity,
        "bin_gb": small.bin_gb,
        "fastest_bins": sum(
            m[min(range(len(p)), key=p.__getitem__)] for p, m in zip(small.perfs, small.memories)
        ),
        "best_bins": small.end,
        "best_perf": small.rows[-1][small.end],
        "best_plan": [small.options[t][o] for t, o in enumerate(small.plan)],
        "plan": small.plan,
        "perfs": small.perfs,
        "memories": small.memories,
        "rows": [[_finite(v) for v in row] for row in small.rows],  # None: unreachable
        "choices": small.choices,
        "matches_brute_force": matches_brute_force,
    }


def _proposer_records(comparison: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Each proposer's row of `compare_proposers`, as plain numbers."""
    return {
        name: {
            "perf_rating": _rating(comparison, name),
            "plan_s": float(row.plan_s),
            "plan_s_min": float(row.plan_s_min),
            "plan_s_max": float(row.plan_s_max),
            "end_to_end_s": float(row.end_to_end_s),
            "proposer_s": float(row.proposer_s),
            "partitioner_s": float(row.partitioner_s),
            "plans_considered": int(row.plans_considered),
            "proposals": int(row.proposals),
            "feasible": bool(row.feasible),
            "timed_out": bool(row.timed_out),
            "note": row.note,
        }
        for name, row in comparison.iterrows()
    }


def _quality_records(study: pd.DataFrame, worst: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Each proposer's ratio to brute force over the quality study's instances."""
    return {
        name: {
            "worst_ratio": _finite(row["max"]),
            "median_ratio": _finite(row["median"]),
            "within_2_percent": float(row["within 2%"]),
            "no_plan": int((~np.isfinite(study.ratio[study.proposer == name])).sum()),
        }
        for name, row in worst.iterrows()
    }

"""The key numbers of notebook 03, as the dict its results JSON holds.

The notebook computes each part with the package's functions (and shows it);
`notebook_results` gathers them, so the notebook's last cell is one call.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from embnb.planner.ablation import ablation_records
from embnb.planner.explain import PlanExtremes
from embnb.planner.models import Enumerated
from embnb.planner.study import EndToEnd, quality_summary

__all__ = ["notebook_results"]


def _rating(table: pd.DataFrame, name: str) -> float | None:
    """A proposer's perf rating in a `compare_proposers` table; None: no plan."""
    value = table.loc[name, "perf_rating"] if name in table.index else math.nan
    return None if pd.isna(value) else float(value)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None  # None: no plan


def notebook_results(
    *,
    num_tables: int,
    world_size: int,
    hbm_cap_gb: float,
    compute_device: str,
    bins_per_device: int,
    enumerated: Enumerated,
    comparison: pd.DataFrame,
    sweep: pd.DataFrame,
    ablation: pd.DataFrame,
    pitfall: pd.DataFrame,
    study: pd.DataFrame,
    dp_matches_by_hand: bool,
    tiny: PlanExtremes,
    chosen_loads: pd.DataFrame,
    cpu: pd.DataFrame,
    end_to_end: dict[str, EndToEnd],
    notebook_s: float,
) -> dict[str, Any]:
    """The results dict of notebook 03: the settings, each proposer's row of
    `comparison`, the budget `sweep`, the `ablation` ladder, the `pitfall`
    study (least summed perf against the best rating), the quality `study`
    against brute force,
    the worked example (`tiny`), the chosen plan's perf per rank, the CPU
    topology's ratings and notes, create_planner's `end_to_end` runs by
    enumerator, and a one-line summary."""
    proposers = _proposer_records(comparison)
    worst = quality_summary(study)
    ours, theirs = _rating(comparison, "embnb DP"), _rating(comparison, "torchrec DP")
    mine, peer = proposers["embnb DP"], proposers["torchrec DP"]
    gap = pitfall.least_placed_sum_over_best
    summary = (
        f"{num_tables} tables on {world_size}x{hbm_cap_gb} GiB: embnb DP rates {ours:.3g} ms "
        f"in {mine['plan_s']:.2g} s ({mine['end_to_end_s']:.2g} s with enumeration), torchrec DP "
        + (f"{theirs:.3g} ms" if theirs else "no plan")
        + f" in {peer['plan_s']:.2g} s ({peer['end_to_end_s']:.2g} s); vs brute force on "
        f"{study.instance.nunique()} instances, worst {worst.loc['embnb DP', 'max']:.3f}x "
        f"(torchrec DP {worst.loc['torchrec DP', 'max']:.3f}x); least summed placeable plan not the best "
        f"on {(gap > 1 + 1e-9).mean():.0%} of {len(pitfall)} tiny instances; create_planner from model "
        f"to plan {end_to_end['embnb'].median_s:.2g} s (with torchrec's enumerator "
        f"{end_to_end['torchrec'].median_s:.2g} s)"
    )
    return {
        "summary": summary,
        "num_tables": num_tables,
        "world_size": world_size,
        "hbm_cap_gb": hbm_cap_gb,
        "compute_device": compute_device,
        "bins_per_device": bins_per_device,
        "enumerate_s": enumerated.seconds,
        "proposers": proposers,
        "budget_sweep": json.loads(
            sweep[["proposer", "hbm_cap_gb", "perf_rating", "plan_s"]].to_json(orient="records")
        ),
        "ablation": ablation_records(ablation),
        "pitfall_instances": len(pitfall),
        "pitfall_worse_share": float((gap > 1 + 1e-9).mean()),
        "pitfall_median_ratio": float(gap.median()),
        "pitfall_max_ratio": float(gap.max()),
        "quality": _quality_records(study, worst),
        "quality_instances": int(study.instance.nunique()),
        "tiny_dp_matches_by_hand": dp_matches_by_hand,
        "tiny_least_sum_placeable": bool(pd.notna(tiny.least_sum.perf_rating)),
        "tiny_least_placed_sum_rating": float(tiny.least_placed_sum.perf_rating),
        "tiny_best_rating": float(tiny.best_rated.perf_rating),
        "chosen_plan_rank_perf": chosen_loads.perf.round(6).tolist(),
        "cpu_topology": {name: _rating(cpu, name) for name in cpu.index},
        "cpu_notes": {name: note for name, note in cpu.note.items()},
        "create_planner_end_to_end": {
            name: {
                "median_s": run.median_s,
                "seconds": run.seconds,
                "rating": _finite(run.rating),
                "same_rating_every_run": run.same_rating_every_run,
            }
            for name, run in end_to_end.items()
        },
        "notebook_s": notebook_s,
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

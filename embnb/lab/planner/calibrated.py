"""Committed results notebook 03a reads as they are (nothing is refitted or re-measured here): the
newest `python -m embnb.bench calibrate` of a device kind, and the GPU kit's runs of the UVM regime
(`steptime_capped-*.json`, `gpu_uvm_runs`).

The bench fitted torchrec's perf model (`embnb.planner.calibration`) to ranks
measured with real kernels, then measured held-out plans rank by rank. Per
rank holding a shard it stored the measured lookups (forward + backward,
median of the repeats) beside torchrec's default estimate and the calibrated
one; per plan, the slowest rank's step per repeat (median and range) and, round by round, its
step minus embnb DP (calibrated)'s (`paired_plans`).
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Any

import pandas as pd

from embnb.lab.planner.candidates import POOR
from embnb.lab.planner.planning import records
from embnb.lab.report import COMMITTED_RESULTS
from embnb.planner.calibration import Calibration
from embnb.timing import VERDICTS, verdict

__all__ = [
    "GOAL",
    "CalibrationBench",
    "load_calibration_bench",
    "heldout_ranks",
    "heldout_errors",
    "measured_plans",
    "PAIRED_WITH",
    "VERDICTS",
    "paired_plans",
    "rank_repeat_gaps",
    "rank_repeat_gap",
    "calibration_record",
    "gpu_uvm_runs",
]

GOAL = 0.10  # issue #46: median per-rank error of the calibrated estimate on a CPU
ESTIMATES = {"torchrec_default": "torchrec_estimate_ms", "calibrated": "calibrated_estimate_ms"}
PAIRED_WITH = "embnb DP (calibrated)"  # the plan the bench compares every other with, round by round


@dataclass(frozen=True)
class CalibrationBench:
    """One committed calibrate bench: its file, its JSON, and the calibration it fitted."""

    path: pathlib.Path
    data: dict[str, Any]
    calibration: Calibration

    @property
    def device(self) -> str:
        return self.data["device"]

    @property
    def device_name(self) -> str:
        return self.data["machine"]


def load_calibration_bench(
    device_kind: str = "cpu", results_dir: pathlib.Path = COMMITTED_RESULTS
) -> CalibrationBench:
    """The newest committed `calibrate-*.json` measured on `device_kind` ("cpu" or "cuda")."""
    if device_kind not in ("cpu", "cuda"):
        raise ValueError(f"device_kind {device_kind!r} is not one of ['cpu', 'cuda']")
    found = []
    for path in sorted(pathlib.Path(results_dir).glob("calibrate-*.json")):
        data = json.loads(path.read_text())
        if data.get("device") == device_kind:
            found.append((data.get("date", ""), path.name, path, data))
    if not found:
        raise FileNotFoundError(
            f"no calibrate bench measured on {device_kind!r} in {results_dir}: "
            f"run `python -m embnb.bench calibrate` there (the GPU kit fits one on a GPU)"
        )
    _, _, path, data = max(found)
    return CalibrationBench(path, data, Calibration.from_json(data["calibration"]))


def heldout_ranks(bench: CalibrationBench) -> pd.DataFrame:
    """One row per held-out rank holding a shard, with each estimate's
    relative error `estimate / measured - 1` (columns `error_<estimator>`)."""
    rows = [
        {
            "seed": world["seed"],
            "world_size": world["world_size"],
            "plan": plan["plan"],
            "rank": rank["rank"],
            "measured_ms": rank["lookup_ms"],
            **{name: rank[key] for name, key in ESTIMATES.items()},
        }
        for world in bench.data["heldout"]
        for plan in world["plans"]
        if plan["measured"]
        for rank in plan["ranks"]
        if rank["shards"]
    ]
    table = pd.DataFrame(rows)
    for name in ESTIMATES:
        table[f"error_{name}"] = table[name] / table.measured_ms - 1
    return table


def heldout_errors(ranks: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per estimator, median and worst |relative error| over the ranks, and how many."""
    return {
        name: {
            "median": float(ranks[f"error_{name}"].abs().median()),
            "worst": float(ranks[f"error_{name}"].abs().max()),
            "ranks": len(ranks),
        }
        for name in ESTIMATES
    }


def measured_plans(bench: CalibrationBench) -> pd.DataFrame:
    """Per held-out world and measured plan: the estimator it planned on, the
    slowest rank's step (median, low, high over the repeats, ms), its spread
    (high / low - 1), its median over the world's fastest, and `gap_to_same_as`: where another
    planner returned the same placement first, how far apart the two medians came (|a / b - 1|,
    the noise between runs of one placement)."""
    rows = [
        {
            "seed": world["seed"],
            "world_size": world["world_size"],
            "plan": plan["plan"],
            "estimator": plan["estimator"],
            "same_as": plan["same_as"],
            "step_ms": plan["step_ms"]["median"],
            "step_low_ms": plan["step_ms"]["low"],
            "step_high_ms": plan["step_ms"]["high"],
        }
        for world in bench.data["heldout"]
        for plan in world["plans"]
        if plan["measured"]
    ]
    table = pd.DataFrame(rows)
    table["spread"] = table.step_high_ms / table.step_low_ms - 1
    fastest = table.groupby(["seed", "world_size"]).step_ms.transform("min")
    table["over_fastest"] = table.step_ms / fastest
    first = table.set_index(["seed", "world_size", "plan"]).step_ms  # the same placement, measured before
    again = [first.get((s, w, same)) for s, w, same in zip(table.seed, table.world_size, table.same_as)]
    gap = (table.step_ms / pd.Series(again, index=table.index, dtype=float) - 1).abs()
    table["gap_to_same_as"] = gap.where(table.plan != table.same_as)
    return table


def paired_plans(bench: CalibrationBench) -> pd.DataFrame:
    """Per held-out world and measured plan, its step minus PAIRED_WITH's, round by round (the
    bench's `paired_difference`: mean and 95% t-interval, ms): `verdict` "slower" or "faster" than
    it where the interval excludes 0, else "not told apart"; `poor`: a plan built to be slow. Empty
    for a bench that did not pair rounds."""
    key = "minus_" + PAIRED_WITH
    rows = [
        {
            "seed": world["seed"],
            "world_size": world["world_size"],
            "plan": plan["plan"],
            "poor": plan["note"] == POOR,
            "mean_ms": plan[key]["mean"],
            "ci_low_ms": plan[key]["ci_low"],
            "ci_high_ms": plan[key]["ci_high"],
            "rounds": plan[key]["repeats"],
            "verdict": verdict(plan[key]["ci_low"], plan[key]["ci_high"]),
        }
        for world in bench.data["heldout"]
        for plan in world["plans"]
        if key in plan
    ]
    return pd.DataFrame(rows)


def rank_repeat_gaps(heldout: list[dict[str, Any]]) -> pd.DataFrame:
    """The ranks of plans measured twice (two planners returned one placement) in a calibrate
    bench's held-out worlds (its JSON's "heldout"), rank by rank: how far apart the two measured
    lookups came (|a / b - 1|), the floor under any estimate's per-rank error on that machine.
    Ranks holding a shard in both runs only."""
    rows = []
    for world in heldout:
        by_name = {plan["plan"]: plan for plan in world["plans"] if plan["measured"]}
        for plan in by_name.values():
            first = by_name.get(plan["same_as"])
            if first is None or first is plan:
                continue
            earlier = {rank["rank"]: rank for rank in first["ranks"] if rank["shards"]}
            for rank in plan["ranks"]:
                if rank["shards"] and rank["rank"] in earlier:
                    rows.append(
                        {
                            "seed": world["seed"],
                            "world_size": world["world_size"],
                            "plan": plan["plan"],
                            "same_as": plan["same_as"],
                            "rank": rank["rank"],
                            "lookup_ms": rank["lookup_ms"],
                            "lookup_ms_first": earlier[rank["rank"]]["lookup_ms"],
                        }
                    )
    table = pd.DataFrame(
        rows, columns=["seed", "world_size", "plan", "same_as", "rank", "lookup_ms", "lookup_ms_first"]
    )
    table["gap"] = (table.lookup_ms / table.lookup_ms_first - 1).abs()
    return table


def rank_repeat_gap(gaps: pd.DataFrame) -> dict[str, float] | None:
    """`rank_repeat_gaps`' median gap and how many ranks; None where none was measured twice."""
    return {"median": float(gaps.gap.median()), "ranks": len(gaps)} if len(gaps) else None


def calibration_record(bench: CalibrationBench) -> dict[str, Any]:
    """What notebook 03a's results JSON keeps of the committed bench: its file and device, the
    held-out errors (recomputed from its ranks), the goal, the per-plan steps and the paired
    differences, and the same ranks measured twice (the measurement's own noise)."""
    errors = heldout_errors(heldout_ranks(bench))
    return {
        "file": bench.path.name,
        "device": bench.device,
        "device_name": bench.device_name,
        "clock": bench.data["clock"],
        "repeats": bench.data["repeats"],
        "train_ranks": bench.data["train"]["ranks"],
        "coefficient_groups": len(bench.calibration.coefficients),
        "heldout_errors": errors,
        "goal": GOAL,
        "goal_met": errors["calibrated"]["median"] <= GOAL,
        "plans": records(measured_plans(bench), "records"),
        "paired_with": PAIRED_WITH,
        "paired": records(paired_plans(bench), "records"),
        "rank_repeat_gap": rank_repeat_gap(rank_repeat_gaps(bench.data["heldout"])),
    }


def gpu_uvm_runs(results_dir: pathlib.Path = COMMITTED_RESULTS) -> pd.DataFrame:
    """The GPU kit's runs of `python -m embnb.bench steptime --hbm-gib GIB --device cuda`: each
    planner's plan at an HBM per device below the model's share (tables in UVM, kernels FBGEMM runs
    only on a GPU), one row per run and plan: date, measured critical path (the slowest rank's
    step, median of `repeats`, synchronized wall time), torchrec's rating, the plan's kernels."""
    rows = []
    for path in sorted(pathlib.Path(results_dir).glob("steptime_capped-*.json")):
        payload = json.loads(path.read_text())
        if payload["device"] != "cuda":
            continue
        for world in payload["worlds"]:
            for plan in world["plans"]:
                if plan["measured"] and plan.get("note") != POOR:
                    kernels = ", ".join(f"{n} {k}" for k, n in (plan.get("kernels") or {}).items())
                    rows.append({"machine": payload["machine"], "file": path.name, "date": payload["date"],
                                 "repeats": payload["repeats"], "world_size": world["world_size"],
                                 "hbm_cap_gb": world["hbm_cap_gb"], "plan": plan["plan"],
                                 "measured_ms": plan["critical_path_s"] * 1e3,
                                 "rating_ms": plan["rating_s"] * 1e3, "kernels": kernels})  # fmt: skip
    return pd.DataFrame(rows)

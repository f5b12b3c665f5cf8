"""Committed results notebook 03a reads as they are (nothing refitted or re-measured), through
`embnb.results.load_runs`: the newest `python -m embnb.bench calibrate` of a device kind, and the
GPU kit's runs of the UVM regime (`steptime_capped`, `gpu_uvm_runs`).

The calibrate bench fitted torchrec's perf model (`embnb.planner.calibration`) to ranks measured
with real kernels, then measured held-out plans rank by rank (`embnb.steptime.measure_world`). Per
rank holding a shard it stored the measured lookups (median of the rounds) beside torchrec's
default estimate and the calibrated one; per plan, the slowest rank's step per round and its step
minus embnb DP (calibrated)'s, round by round.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pandas as pd

from embnb._checks import check_choice
from embnb.lab.planner.candidates import POOR
from embnb.lab.planner.planning import records
from embnb.results import Run, load_runs
from embnb.timing import verdict

__all__ = [
    "GOAL",
    "PAIRED_WITH",
    "load_calibration_bench",
    "heldout_ranks",
    "heldout_errors",
    "measured_plans",
]
__all__ += ["rank_repeat_gaps", "rank_repeat_gap", "calibration_record", "gpu_uvm_runs"]

GOAL = 0.08  # issue #69: median per-rank error of the calibrated estimate on a CPU (issue #46's: 10%)
ESTIMATES = {"torchrec_default": "torchrec_estimate_ms", "calibrated": "calibrated_estimate_ms"}
# The same fit without the kernel-call term (issue #69), in benches that record it: the error before it.
BEFORE = {"calibrated_per_shard": "per_shard_estimate_ms"}
PAIRED_WITH = "embnb DP (calibrated)"  # the plan the bench compares every other with, round by round


def load_calibration_bench(device_kind: str = "cpu", results_dir: pathlib.Path | None = None) -> Run:
    """The newest `calibrate` run measured on `device_kind` ("cpu" or "cuda"); FileNotFoundError
    where none was."""
    check_choice("device_kind", device_kind, ("cpu", "cuda"))
    runs = [run for run in load_runs("calibrate", results_dir) if run.data.get("device") == device_kind]
    if not runs:
        raise FileNotFoundError(
            f"no calibrate bench measured on {device_kind!r} in {results_dir or 'the committed results'}: "
            "run `python -m embnb.bench calibrate` there (the GPU kit fits one on a GPU)"
        )
    return runs[-1]


def _measured(bench: Run):
    for world in bench.data["heldout"]:
        for plan in world["plans"]:
            if plan["measured"]:
                yield world, plan


def heldout_ranks(bench: Run) -> pd.DataFrame:
    """One row per held-out rank holding a shard: measured lookups and each estimate (ms: ESTIMATES,
    and BEFORE where the bench has it), and each estimate's relative error `estimate / measured - 1`
    (columns `error_<estimator>`); `kernel_calls`: the rank's TBEs, where recorded."""
    estimates = {**ESTIMATES, **BEFORE}
    table = pd.DataFrame(
        {"seed": world["seed"], "world_size": world["world_size"], "plan": plan["plan"], "rank": rank["rank"],
         "measured_ms": rank["lookup_ms"], "kernel_calls": rank.get("kernel_calls"),
         **{name: rank[key] for name, key in estimates.items() if key in rank}}
        for world, plan in _measured(bench)
        for rank in plan["ranks"]
        if rank["shards"]
    )  # fmt: skip
    for name in estimates:
        if name in table:
            table[f"error_{name}"] = table[name] / table.measured_ms - 1
    return table


def heldout_errors(ranks: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per estimator (ESTIMATES, and BEFORE where present), median and worst |relative error| over
    the ranks, and how many."""
    return {
        name: {"median": float(errors.median()), "worst": float(errors.max()), "ranks": len(ranks)}
        for name in (*ESTIMATES, *BEFORE)
        if f"error_{name}" in ranks
        for errors in [ranks[f"error_{name}"].abs()]
    }


def measured_plans(bench: Run) -> pd.DataFrame:
    """Per held-out world and measured plan: the estimator it planned on, the slowest rank's step
    (median, low, high over the rounds, ms), its spread (high / low - 1) and its median over the
    world's fastest;
    `gap_to_same_as`: where another planner returned the same placement first, how far apart the
    two medians came (|a / b - 1|, the noise between runs of one placement); its step minus
    PAIRED_WITH's round by round (mean and 95% t-interval, ms) with `verdict` "slower" or "faster"
    where the interval excludes 0, else "not told apart" (None: not paired)."""
    key = "minus_" + PAIRED_WITH
    table = pd.DataFrame(
        {"seed": world["seed"], "world_size": world["world_size"], "plan": plan["plan"],
         "estimator": plan["estimator"], "poor": plan.get("note") == POOR, "same_as": plan["same_as"],
         "step_ms": plan["step_ms"]["median"], "step_low_ms": plan["step_ms"]["low"],
         "step_high_ms": plan["step_ms"]["high"],
         **{f"{k}_ms": plan.get(key, {}).get(k) for k in ("mean", "ci_low", "ci_high")}}
        for world, plan in _measured(bench)
    )  # fmt: skip
    table["spread"] = table.step_high_ms / table.step_low_ms - 1
    table["over_fastest"] = table.step_ms / table.groupby(["seed", "world_size"]).step_ms.transform("min")
    first = table.set_index(["seed", "world_size", "plan"]).step_ms  # the same placement, measured before
    again = pd.Series([first.get(k) for k in zip(table.seed, table.world_size, table.same_as)], dtype=float)
    table["gap_to_same_as"] = (table.step_ms / again - 1).abs().where(table.plan != table.same_as)
    table["verdict"] = [
        None if pd.isna(low) else verdict(low, high) for low, high in zip(table.ci_low_ms, table.ci_high_ms)
    ]
    return table


def rank_repeat_gaps(heldout: list[dict[str, Any]]) -> pd.DataFrame:
    """The ranks of plans measured twice (two planners returned one placement) in a calibrate
    bench's held-out worlds (its JSON's "heldout"), rank by rank: how far apart the two measured
    lookups came (`gap`, |a / b - 1|), the floor under any estimate's per-rank error on that
    machine. Ranks holding a shard in both runs only."""
    rows = []
    for world in heldout:
        by_name = {plan["plan"]: plan for plan in world["plans"] if plan["measured"]}
        for plan in by_name.values():
            first = by_name.get(plan["same_as"])
            earlier = {} if first in (None, plan) else {r["rank"]: r for r in first["ranks"] if r["shards"]}
            rows += [
                {"seed": world["seed"], "world_size": world["world_size"], "plan": plan["plan"],
                 "same_as": plan["same_as"], "rank": rank["rank"], "lookup_ms": rank["lookup_ms"],
                 "lookup_ms_first": earlier[rank["rank"]]["lookup_ms"]}
                for rank in plan["ranks"]
                if rank["shards"] and rank["rank"] in earlier
            ]  # fmt: skip
    columns = ["seed", "world_size", "plan", "same_as", "rank", "lookup_ms", "lookup_ms_first"]
    table = pd.DataFrame(rows, columns=columns)
    return table.assign(gap=(table.lookup_ms / table.lookup_ms_first - 1).abs())


def rank_repeat_gap(gaps: pd.DataFrame) -> dict[str, float] | None:
    """`rank_repeat_gaps`' median gap and how many ranks; None where none was measured twice."""
    return {"median": float(gaps.gap.median()), "ranks": len(gaps)} if len(gaps) else None


def calibration_record(bench: Run) -> dict[str, Any]:
    """What notebook 03a's results JSON keeps of the committed bench: its file and device, the
    held-out errors (recomputed from its ranks) against the goal, the measured plans with their
    paired differences, and the same ranks measured twice (the measurement's own noise)."""
    errors = heldout_errors(heldout_ranks(bench))
    data = bench.data
    fitted = data["calibration"]
    return {"file": bench.name, "device": data["device"], "device_name": bench.machine,
            "clock": data["clock"], "repeats": data["repeats"], "train_ranks": data["train"]["ranks"],
            "scale": {"max_rows": data["model"]["max_rows"], "samples_per_rank": data["batch_size"]},
            "kernel_call_ms": fitted.get("kernel_call_ms", 0.0),
            "collective_ms": fitted.get("collective_ms", {}),
            "repeated_runs": data.get("repeated_runs"),
            "heldout_errors": errors,
            "goal": GOAL, "goal_met": errors["calibrated"]["median"] <= GOAL, "paired_with": PAIRED_WITH,
            "plans": records(measured_plans(bench), "records"),
            "rank_repeat_gap": rank_repeat_gap(rank_repeat_gaps(data["heldout"]))}  # fmt: skip


def gpu_uvm_runs(results_dir: pathlib.Path | None = None) -> pd.DataFrame:
    """The GPU kit's runs of `python -m embnb.bench steptime --hbm-gib GIB --device cuda`: each
    planner's plan at an HBM per device below the model's share (tables in UVM, kernels FBGEMM runs
    only on a GPU), one row per run and plan: date, measured critical path (the slowest rank's
    step, median of `repeats`, synchronized wall time), torchrec's rating, the plan's kernels."""
    return pd.DataFrame(
        {"machine": run.machine, "file": run.name, "date": run.date, "repeats": run.data["repeats"],
         "world_size": world["world_size"], "hbm_cap_gb": world["hbm_cap_gb"], "plan": plan["plan"],
         "measured_ms": plan["critical_path_s"] * 1e3, "rating_ms": plan["rating_s"] * 1e3,
         "kernels": ", ".join(f"{n} {k}" for k, n in (plan.get("kernels") or {}).items())}
        for run in load_runs("steptime_capped", results_dir)
        if run.data["device"] == "cuda"
        for world in run.data["worlds"]
        for plan in world["plans"]
        if plan["measured"] and plan.get("note") != POOR
    )  # fmt: skip


# Issue #69, item 5: the committed H200 steptime runs refitted with the kernel-call term.
GPU_MACHINE = "NVIDIA H200"
GPU_REFIT = "calibrate_gpu_refit"  # the benchmark name of its results file (`embnb.results.load_runs`)
GPU_SCALE = "tables of at most {max_rows:,} rows, {batch_size} samples per rank: the overhead-bound regime"
GPU_TERMS = ("lookup_size_multiplier",)  # per (sharding type, kernel): a scale of torchrec's lookups
REBUILT_REL_TOL = 1e-6  # a rebuilt plan's per-rank estimates must equal the file's to this


def _gpu_world_key(data: dict[str, Any], world: dict[str, Any]) -> tuple:
    model = data["model"]
    local = world.get("local_world_size") or world["world_size"]  # unrecorded: one host of all ranks
    return (model["tables"], model["max_rows"], model["seed"], data["batch_size"], world["world_size"],
            world["compute_device"], world.get("hbm_cap_gb"), local)  # fmt: skip


def rebuild_gpu_ranks(results_dir: pathlib.Path | None = None, timeout_s: float = 120.0) -> dict[str, Any]:
    """Every plan of the committed GPU `steptime` and `steptime_capped` runs planned again here (the
    same model, topology and planners: `candidate_plans`), kept where each rank's torchrec estimate
    (total, s) equals the file's within `REBUILT_REL_TOL`; per kept plan, each rank holding a shard
    as a `MeasuredRank` (measured lookups: the file's synchronized wall time, ms; its shards' terms;
    its kernel calls, `KernelCallPerfModel.kernel_calls`). Returns {"runs": [{file, world_size,
    hbm_cap_gb, plan, rebuilt, ranks: [MeasuredRank]}], "candidates": {world key: {model,
    topology, enumerated, plans, batch_size, hbm_cap_gb}}}. Planning runs on CPU; the stack should
    be the kit's (torchrec 1.6.1, fbgemm 1.6.0) for the plans to come out the same."""
    from embnb.lab.planner.candidates import candidate_plans, estimated_per_rank
    from embnb.lab.planner.models import enumerate_options, make_model
    from embnb.planner.calibration import MeasuredRank, rank_terms
    from embnb.planner.perf_model import KernelCallPerfModel
    from embnb.planner.topology import make_topology

    runs = [
        run
        for name in ("steptime", "steptime_capped")
        for run in load_runs(name, results_dir)
        if run.machine == GPU_MACHINE and run.data["device"] == "cuda"
    ]
    planned: dict[tuple, Any] = {}
    rows = []
    for run in runs:
        data = run.data
        for world in data["worlds"]:
            key = _gpu_world_key(data, world)
            if key not in planned:
                model = make_model(data["model"]["tables"], seed=data["model"]["seed"],
                                   max_rows=data["model"]["max_rows"])  # fmt: skip
                topology = make_topology(world["world_size"], world["compute_device"],
                                         hbm_cap_gb=world.get("hbm_cap_gb"),
                                         local_world_size=world.get("local_world_size"))  # fmt: skip
                enumerated = enumerate_options(
                    model.tables, topology, data["batch_size"], model.constraints, "embnb"
                )
                plans = candidate_plans(
                    model, topology, data["batch_size"], timeout_s=timeout_s, enumerated=enumerated
                )
                planned[key] = {"model": model, "topology": topology, "enumerated": enumerated,
                                "plans": plans, "batch_size": data["batch_size"],
                                "hbm_cap_gb": world.get("hbm_cap_gb")}  # fmt: skip
            model, topology, enumerated, plans = (
                planned[key][k] for k in ("model", "topology", "enumerated", "plans")
            )
            for plan in world["plans"]:
                if not plan["measured"]:
                    continue
                candidate = plans.get(plan["plan"])
                row = {"file": run.path.name, "date": run.date, "world_size": world["world_size"],
                       "hbm_cap_gb": world.get("hbm_cap_gb"), "plan": plan["plan"], "ranks": []}  # fmt: skip
                if candidate is None or candidate.options is None:
                    rows.append({**row, "rebuilt": False, "why": "no plan here"})
                    continue
                ours = estimated_per_rank(candidate.options, world["world_size"])["total"]
                theirs = [rank["estimated_s"]["total"] for rank in plan["ranks"]]
                same = len(ours) == len(theirs) and all(
                    abs(a - b) <= REBUILT_REL_TOL * max(abs(b), 1e-12) for a, b in zip(ours, theirs)
                )
                if not same:
                    gap = max((abs(a / b - 1) for a, b in zip(ours, theirs) if b), default=float("nan"))
                    rows.append(
                        {**row, "rebuilt": False, "why": f"per-rank estimates differ (up to {gap:.2%})"}
                    )
                    continue
                terms = rank_terms(candidate.options, topology, enumerated.sharders, model.constraints)
                calls = KernelCallPerfModel(topology).kernel_calls(candidate.options)
                ranks = [
                    MeasuredRank(
                        rank["lookup"]["wall_s"] * 1e3, tuple(terms[rank["rank"]]), calls[rank["rank"]]
                    )
                    for rank in plan["ranks"]
                    if terms[rank["rank"]]
                ]
                rows.append({**row, "rebuilt": True, "why": "", "ranks": ranks})
    return {"runs": rows, "candidates": planned}


def _abs_errors(calibration: Any, ranks: list[Any], with_calls: bool = True) -> list[float]:
    return [
        abs(calibration.estimate(r.shards, r.kernel_calls if with_calls else 0) / r.lookups_ms - 1)
        for r in ranks
    ]


def _summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": float(pd.Series(values).median()), "worst": max(values), "ranks": len(values)}


def _gpu_scale(worlds: Any) -> dict[str, Any]:
    """The scale the GPU fit comes from: the largest table and the samples per rank planned for."""
    worlds = list(worlds)
    max_rows = max((t.num_embeddings for w in worlds for t in w["model"].tables), default=0)
    batch = sorted({w["batch_size"] for w in worlds})
    label = GPU_SCALE.format(max_rows=max_rows, batch_size="/".join(map(str, batch)))
    return {"max_rows": max_rows, "samples_per_rank": batch, "label": label}


def _plan_groups(name: str, options: list | None, topology: Any) -> dict[str, Any]:
    """A plan's name, shape and TBE groups per rank (`KernelCallPerfModel.kernel_calls`)."""
    from embnb.lab.planner.candidates import plan_shape
    from embnb.planner.perf_model import KernelCallPerfModel

    if not options:
        return {"plan": name, "shape": None, "tbe_groups_per_rank": None}
    calls = KernelCallPerfModel(topology).kernel_calls(options)
    return {"plan": name, "shape": plan_shape(options), "tbe_groups_per_rank": calls}


def fit_determined(ranks: list[Any], *args: Any, **kwargs: Any) -> tuple[Any, dict[str, str]]:
    """`embnb.planner.fitting.fit`; where the ranks do not determine every group's coefficients (a group's
    columns a combination of others': e.g. two kernels of one sharding type that every plan holds
    in one proportion), the group of fewest shards among those of the combination is fitted as one
    with another of them (same sharding type first) and given its coefficients, until the ranks
    determine the rest. Returns the calibration and the groups so merged ("type/kernel" ->
    "type/kernel"); ValueError where a combination holds one group only (with the kernel calls)."""
    from collections import Counter
    from dataclasses import replace

    from embnb.planner.calibration import TERMS, MeasuredRank
    from embnb.planner.fitting import fit

    columns = [TERMS.index(t) for t in (kwargs.get("terms") or TERMS)]
    merged: dict[tuple[str, str], tuple[str, str]] = {}
    while True:
        try:
            calibration = fit(ranks, *args, **kwargs)
        except ValueError:
            groups = sorted({shard.group for rank in ranks for shard in rank.shards})
            design = np.zeros((len(ranks), len(groups) * len(columns) + 1))
            for r, rank in enumerate(ranks):
                for shard in rank.shards:
                    g = groups.index(shard.group) * len(columns)
                    design[r, g : g + len(columns)] += [shard.terms[c] for c in columns]
                design[r, -1] = rank.kernel_calls
            norms = np.linalg.norm(design, axis=0)
            null = np.linalg.svd(design / np.where(norms > 0, norms, 1.0))[2][-1]
            weight = np.abs(null[:-1]).reshape(len(groups), len(columns)).sum(axis=1)
            support = [g for g, w in zip(groups, weight) if w > 1e-6]
            if len(support) < 2:
                raise
            counts = Counter(shard.group for rank in ranks for shard in rank.shards)
            group = min(support, key=lambda g: (counts[g], g))
            into = min((g for g in support if g != group), key=lambda g: (g[0] != group[0], -counts[g], g))
            merged[group] = into
            ranks = [
                MeasuredRank(
                    r.lookups_ms,
                    tuple(
                        replace(t, sharding_type=into[0], compute_kernel=into[1]) if t.group == group else t
                        for t in r.shards
                    ),
                    r.kernel_calls,
                )
                for r in ranks
            ]
            continue
        coefficients = dict(calibration.coefficients)
        for group in merged:  # a merged group is priced as the group it was fitted with
            into = merged[group]
            while into in merged:
                into = merged[into]
            coefficients[group] = coefficients[into]
        calibration = replace(calibration, coefficients=coefficients)
        return calibration, {"/".join(a): "/".join(b) for a, b in merged.items()}


def gpu_refit(results_dir: pathlib.Path | None = None, timeout_s: float = 120.0) -> dict[str, Any]:
    """Issue #69, item 5: the GPU terms fitted on the committed H200 runs' rebuildable plans
    (`rebuild_gpu_ranks`), `GPU_TERMS` per (sharding type, kernel) plus `kernel_call_ms`, with a
    leave-one-run-out held-out error (fit on the other files' ranks, |estimate / measured - 1| on
    this file's) beside the same fit without the kernel-call term and torchrec's default; then the
    plan embnb's DP proposes under the fit on all of them (calibrated enumeration, rated with
    `KernelCallPerfModel`) for the steptime bench's model at each planned topology, with each rank's
    TBE groups, beside the DP's plan on torchrec's defaults. Returns the results file's payload."""
    from embnb.lab.planner.models import Enumerated
    from embnb.lab.planner.planning import run_planner
    from embnb.planner.calibration import estimators, torchrec_default_estimate
    from embnb.planner.enumerator import make_enumerator
    from embnb.planner.perf_model import KernelCallPerfModel
    from embnb.planner.proposer import DynamicProgrammingProposer

    rebuilt = rebuild_gpu_ranks(results_dir, timeout_s)
    rows = rebuilt["runs"]
    kept = [row for row in rows if row["rebuilt"]]
    files = sorted({row["file"] for row in kept})
    payload: dict[str, Any] = {
        "benchmark": GPU_REFIT, "machine": GPU_MACHINE, "device": "cuda",
        "plans": [{k: v for k, v in row.items() if k != "ranks"} | {"measured_ranks": len(row["ranks"])}
                  for row in rows],
        "rebuildable_plans": len(kept), "plans_in_files": len(rows), "terms": list(GPU_TERMS),
        "scale": _gpu_scale(rebuilt["candidates"].values()),
    }  # fmt: skip
    ranks = [r for row in kept for r in row["ranks"]]

    def refit(train: list[Any], calls: bool) -> Any:
        return fit_determined(train, "cuda", GPU_MACHINE, terms=GPU_TERMS, kernel_calls=calls)[0]

    if len(files) < 2 or not ranks:
        payload["fitted"] = False
        payload["why"] = f"{len(kept)} of {len(rows)} plans rebuildable, in {len(files)} runs: too few to fit"
        return payload
    per_run, heldout = [], {"calibrated": [], "calibrated_per_shard": [], "torchrec_default": []}
    for name in files:
        train = [r for row in kept if row["file"] != name for r in row["ranks"]]
        test = [r for row in kept if row["file"] == name for r in row["ranks"]]
        errors = {
            "calibrated": _abs_errors(refit(train, True), test),
            "calibrated_per_shard": _abs_errors(refit(train, False), test, with_calls=False),
            "torchrec_default": [abs(torchrec_default_estimate(r.shards) / r.lookups_ms - 1) for r in test],
        }
        for key, values in errors.items():
            heldout[key] += values
        per_run.append({"file": name, **{key: _summary(values) for key, values in errors.items()}})
    calibration, merged = fit_determined(ranks, "cuda", GPU_MACHINE, terms=GPU_TERMS, kernel_calls=True)
    payload |= {"fitted": True, "runs": files, "ranks": len(ranks), "leave_one_run_out": per_run,
                "heldout_errors": {key: _summary(values) for key, values in heldout.items()},
                "calibration": calibration.to_json(), "merged_groups": merged,
                "calibration_per_shard": refit(ranks, False).to_json()}  # fmt: skip
    proposed = []
    for world in rebuilt["candidates"].values():
        model, topology, enumerated, plans = (world[k] for k in ("model", "topology", "enumerated", "plans"))
        rating = KernelCallPerfModel.from_calibration(topology, calibration)
        chosen = make_enumerator("embnb", topology, world["batch_size"], model.constraints,
                                 estimator=estimators(calibration, topology, model.constraints))  # fmt: skip
        options = chosen.enumerate(enumerated.module, enumerated.sharders)
        calibrated = Enumerated(enumerated.module, enumerated.sharders, options, 0.0)
        run = run_planner(DynamicProgrammingProposer(performance_model=rating), calibrated, topology,
                          world["batch_size"], name="embnb DP (GPU refit)",
                          constraints=model.constraints, timeout_s=timeout_s)  # fmt: skip
        before = plans.get("embnb DP")
        proposed.append(
            {"world_size": topology.world_size, "hbm_cap_gb": world["hbm_cap_gb"],
             "local_world_size": topology.local_world_size, "note": run.note,
             **_plan_groups(run.proposer, run.plan, topology),
             "rating_ms": rating.rate(run.plan) if run.plan else None,
             "uncalibrated": _plan_groups("embnb DP", before.options if before else None, topology)}
        )  # fmt: skip
    payload["proposed"] = proposed
    return payload


def main(argv: list[str] | None = None) -> int:
    """`python -m embnb.lab.planner.calibrated [--out DIR]`: `gpu_refit` on the committed runs,
    written as a results file (`calibrate_gpu_refit-DATE-nvidia-h200.json`)."""
    import argparse

    from embnb.results import stack_versions, write_results

    parser = argparse.ArgumentParser(
        prog="python -m embnb.lab.planner.calibrated", description=gpu_refit.__doc__
    )
    parser.add_argument(
        "--out", default=None, help="folder of the results file (default: benchmarks/results)"
    )
    parser.add_argument("--timeout-s", type=float, default=120.0, help="each planner's time limit")
    opts = parser.parse_args(argv)
    payload = gpu_refit(timeout_s=opts.timeout_s)
    payload["planned_on"] = stack_versions()  # the stack the plans were rebuilt on
    path = write_results(GPU_REFIT, payload, opts.out)
    print(f"{payload['rebuildable_plans']} of {payload['plans_in_files']} plans rebuilt; wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def load_gpu_refit(results_dir: pathlib.Path | None = None) -> Run:
    """The newest committed `calibrate_gpu_refit` (`gpu_refit`'s file); FileNotFoundError where none."""
    runs = load_runs(GPU_REFIT, results_dir)
    if not runs:
        raise FileNotFoundError(
            f"no {GPU_REFIT} results in {results_dir or 'the committed results'}: "
            "run `python -m embnb.lab.planner.calibrated` on the kit's stack"
        )
    return runs[-1]


def gpu_refit_record(run: Run) -> dict[str, Any]:
    """What notebook 03a keeps of the GPU refit: its file, device and scale, how many plans were
    rebuilt, the fitted kernel-call term, each estimate's leave-one-run-out error, and embnb DP's
    plan before and under the refit with its TBE groups per rank (the most on one rank)."""
    data = run.data
    record = {"file": run.path.name, "device": data["device"], "device_name": run.machine,
              "scale": data["scale"], "rebuildable_plans": data["rebuildable_plans"],
              "plans_in_files": data["plans_in_files"], "fitted": data["fitted"]}  # fmt: skip
    if not data["fitted"]:
        return {**record, "why": data["why"]}
    proposed = [
        {
            "world_size": p["world_size"],
            "hbm_cap_gb": p["hbm_cap_gb"],
            **{
                f"{key}_{name}": plan[key]
                for name, plan in (("before", p["uncalibrated"]), ("refit", p))
                for key in ("shape", "tbe_groups_per_rank")
            },
            "most_groups_before": max(p["uncalibrated"]["tbe_groups_per_rank"] or [0]),
            "most_groups_refit": max(p["tbe_groups_per_rank"] or [0]),
        }
        for p in {
            (p["world_size"], p["hbm_cap_gb"], p.get("local_world_size")): p for p in data["proposed"]
        }.values()
    ]  # fmt: skip  (one proposal per topology: runs that planned one topology alike give one plan)
    return {**record, "runs": data["runs"], "ranks": data["ranks"], "terms": data["terms"],
            "kernel_call_ms": data["calibration"]["kernel_call_ms"], "heldout_errors": data["heldout_errors"],
            "leave_one_run_out": data["leave_one_run_out"], "proposed": proposed}  # fmt: skip

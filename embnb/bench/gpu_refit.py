"""`python -m embnb.bench gpu_refit`: the committed H200 steptime runs refitted with the kernel-call term
(issue #69, item 5), written as `calibrate_gpu_refit-DATE-nvidia-h200.json` (notebook 03a reads it through
`embnb.lab.planner.load_gpu_refit`).

1. Rebuild (`rebuild_gpu_ranks`): the files hold each rank's measured lookups and torchrec's estimate, not
   its shards, so every plan of the committed GPU `steptime` and `steptime_capped` runs is planned again
   here (the same model, topology and planners: `candidate_plans`) and kept where each rank's torchrec
   estimate equals the file's. Planning runs on CPU; the stack should be the kit's (torchrec 1.6.1,
   fbgemm 1.6.0) for the plans to come out the same.
2. Fit (`gpu_refit`): `GPU_TERMS` per (sharding type, kernel) plus `kernel_call_ms` on the kept ranks, with
   a leave-one-run-out held-out error beside the same fit without the kernel-call term and torchrec's
   default.
3. Propose: embnb's DP under the fit on all of them (`calibrated_dp`: create_planner with the
   calibration) for the steptime bench's model at each planned topology, with each rank's TBE groups,
   beside the DP's plan on torchrec's defaults.
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import statistics
import sys
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np

from embnb.bench.calibrate import calibrated_dp
from embnb.bench.results import add_out_argument
from embnb.lab.planner.calibrated import GPU_REFIT
from embnb.lab.planner.candidates import POOR, candidate_plans, estimated_per_rank, plan_shape
from embnb.lab.planner.models import Enumerated, enumerate_options, make_model
from embnb.planner.calibration import TERMS, Calibration, MeasuredRank, rank_terms, torchrec_default_estimate
from embnb.planner.fitting import design_matrix, fit
from embnb.planner.perf_model import KernelCallPerfModel
from embnb.planner.topology import make_topology
from embnb.results import load_runs, stack_versions, write_results

GPU_MACHINE = "NVIDIA H200"
GPU_SCALE = "tables of at most {max_rows:,} rows, {batch_size} samples per rank: the overhead-bound regime"
GPU_TERMS = ("lookup_size_multiplier",)  # per (sharding type, kernel): a scale of torchrec's lookups
REBUILT_REL_TOL = 1e-6  # a rebuilt plan's per-rank estimates must equal the file's to this


def _gpu_world_key(data: dict[str, Any], world: dict[str, Any]) -> tuple:
    """What plans a committed world: its model, batch size and topology."""
    local = world.get("local_world_size") or world["world_size"]  # unrecorded: one host of all ranks
    model = tuple(data["model"][k] for k in ("tables", "max_rows", "seed"))
    topology = (world["world_size"], world["compute_device"], world.get("hbm_cap_gb"), local)
    return (*model, data["batch_size"], *topology)


def kernel_variants(options: list, enumerated: Enumerated) -> list[list]:
    """A poor plan of `candidate_plans` (one option per table, one sharding type) with each compute
    kernel its options come in, in sorted order, each shard on the rank it had. Which kernel the
    poor plans took follows the order torchrec's enumerator lists a table's kernels in, a set's
    (`list(set(...) & set(...))` in `EmbeddingEnumerator._filter_compute_kernels`, torchrec 1.6.1),
    which changes with the process's string hash seed: rebuilt with every kernel, a committed poor
    plan is found whatever the seed."""
    by_key = {(o.name, o.sharding_type, o.compute_kernel): o for o in enumerated.options}
    variants = []
    for kernel in sorted({o.compute_kernel for o in enumerated.options}):
        twins = [by_key.get((o.name, o.sharding_type, kernel)) for o in options]
        if None in twins:
            continue
        placed = [copy.deepcopy(twin) for twin in twins]
        for twin, option in zip(placed, options):
            for shard, ranked in zip(twin.shards, option.shards, strict=True):
                shard.rank = ranked.rank
        variants.append(placed)
    return variants


def _same_estimates(options: list, ranks: list[dict[str, Any]], world_size: int) -> tuple[bool, float]:
    """Whether each rank's torchrec estimate (total, s) of `options` equals the file's `ranks`'
    within `REBUILT_REL_TOL`, and the largest relative gap."""
    ours = estimated_per_rank(options, world_size)["total"]
    theirs = [rank["estimated_s"]["total"] for rank in ranks]
    if len(ours) != len(theirs):
        return False, float("nan")
    same = all(abs(a - b) <= REBUILT_REL_TOL * max(abs(b), 1e-12) for a, b in zip(ours, theirs))
    return same, max((abs(a / b - 1) for a, b in zip(ours, theirs) if b), default=float("nan"))


def _plan_world(data: dict[str, Any], world: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The model, topology, enumeration and candidate plans of one committed world."""
    given = data["model"]
    model = make_model(given["tables"], seed=given["seed"], max_rows=given["max_rows"])
    topology = make_topology(
        world["world_size"],
        world["compute_device"],
        hbm_cap_gb=world.get("hbm_cap_gb"),
        local_world_size=world.get("local_world_size"),
    )
    enumerated = enumerate_options(model.tables, topology, data["batch_size"], model.constraints, "embnb")
    plans = candidate_plans(model, topology, data["batch_size"], timeout_s=timeout_s, enumerated=enumerated)
    return {
        "model": model,
        "topology": topology,
        "enumerated": enumerated,
        "plans": plans,
        "batch_size": data["batch_size"],
        "hbm_cap_gb": world.get("hbm_cap_gb"),
    }


def rebuild_gpu_ranks(results_dir: pathlib.Path | None = None, timeout_s: float = 120.0) -> dict[str, Any]:
    """Every plan of the committed GPU `steptime` and `steptime_capped` runs planned again here,
    kept where each rank's torchrec estimate equals the file's (`_same_estimates`; the poor plans
    tried with each kernel, `kernel_variants`); per kept plan, each rank holding a shard as a
    `MeasuredRank` (measured lookups: the file's synchronized wall time, ms; its shards' terms; its
    kernel calls, `KernelCallPerfModel.kernel_calls`). Returns {"runs": [{file, date, world_size,
    hbm_cap_gb, plan, rebuilt, why, ranks: [MeasuredRank]}], "candidates": {world key: `_plan_world`}}."""
    runs = [
        run
        for name in ("steptime", "steptime_capped")
        for run in load_runs(name, results_dir)
        if run.machine == GPU_MACHINE and run.data["device"] == "cuda"
    ]
    planned: dict[tuple, Any] = {}
    rows = []
    for run in runs:
        for world in run.data["worlds"]:
            key = _gpu_world_key(run.data, world)
            if key not in planned:
                planned[key] = _plan_world(run.data, world, timeout_s)
            model, topology, enumerated, plans = (
                planned[key][k] for k in ("model", "topology", "enumerated", "plans")
            )
            for plan in world["plans"]:
                if not plan["measured"]:
                    continue
                candidate = plans.get(plan["plan"])
                row = {
                    "file": run.path.name,
                    "date": run.date,
                    "world_size": world["world_size"],
                    "hbm_cap_gb": world.get("hbm_cap_gb"),
                    "plan": plan["plan"],
                    "ranks": [],
                }
                if candidate is None or candidate.options is None:
                    rows.append({**row, "rebuilt": False, "why": "no plan here"})
                    continue
                tried = [candidate.options]
                if candidate.note == POOR:
                    tried = kernel_variants(candidate.options, enumerated)
                results = [(o, *_same_estimates(o, plan["ranks"], world["world_size"])) for o in tried]
                options = next((o for o, same, _ in results if same), None)
                if options is None:
                    why = f"per-rank estimates differ (up to {min(gap for *_, gap in results):.2%})"
                    rows.append({**row, "rebuilt": False, "why": why})
                    continue
                terms = rank_terms(options, topology, enumerated.sharders, model.constraints)
                calls = KernelCallPerfModel(topology).kernel_calls(options)
                lookups_ms = {rank["rank"]: rank["lookup"]["wall_s"] * 1e3 for rank in plan["ranks"]}
                ranks = [
                    MeasuredRank(ms, tuple(terms[r]), calls[r]) for r, ms in lookups_ms.items() if terms[r]
                ]
                rows.append({**row, "rebuilt": True, "why": "", "ranks": ranks})
    return {"runs": rows, "candidates": planned}


def _abs_errors(calibration: Calibration, ranks: list[MeasuredRank], with_calls: bool = True) -> list[float]:
    return [
        abs(calibration.estimate(r.shards, r.kernel_calls if with_calls else 0) / r.lookups_ms - 1)
        for r in ranks
    ]


def _summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "worst": max(values), "ranks": len(values)}


def _gpu_scale(worlds: Any) -> dict[str, Any]:
    """The scale the GPU fit comes from: the largest table and the samples per rank planned for."""
    worlds = list(worlds)
    max_rows = max((t.num_embeddings for w in worlds for t in w["model"].tables), default=0)
    batch = sorted({w["batch_size"] for w in worlds})
    label = GPU_SCALE.format(max_rows=max_rows, batch_size="/".join(map(str, batch)))
    return {"max_rows": max_rows, "samples_per_rank": batch, "label": label}


def _plan_groups(name: str, options: list | None, topology: Any) -> dict[str, Any]:
    """A plan's name, shape and TBE groups per rank (`KernelCallPerfModel.kernel_calls`)."""
    if not options:
        return {"plan": name, "shape": None, "tbe_groups_per_rank": None}
    calls = KernelCallPerfModel(topology).kernel_calls(options)
    return {"plan": name, "shape": plan_shape(options), "tbe_groups_per_rank": calls}


def fit_determined(
    ranks: list[MeasuredRank], *args: Any, **kwargs: Any
) -> tuple[Calibration, dict[str, str]]:
    """`embnb.planner.fitting.fit`; where the ranks do not determine every group's coefficients (a group's
    columns a combination of others': e.g. two kernels of one sharding type that every plan holds
    in one proportion), the group of fewest shards among those of the combination is fitted as one
    with another of them (same sharding type first) and given its coefficients, until the ranks
    determine the rest. Returns the calibration and the groups so merged ("type/kernel" ->
    "type/kernel"); ValueError where a combination holds one group only (with the kernel calls)."""
    terms = tuple(kwargs.get("terms") or TERMS)
    merged: dict[tuple[str, str], tuple[str, str]] = {}
    while True:
        try:
            calibration = fit(ranks, *args, **kwargs)
        except ValueError:
            groups = sorted({shard.group for rank in ranks for shard in rank.shards})
            design = design_matrix(ranks, terms, groups, kernel_calls=True)
            norms = np.linalg.norm(design, axis=0)
            null = np.linalg.svd(design / np.where(norms > 0, norms, 1.0))[2][-1]
            weight = np.abs(null[:-1]).reshape(len(groups), len(terms)).sum(axis=1)
            support = [g for g, w in zip(groups, weight) if w > 1e-6]
            if len(support) < 2:
                raise
            counts = Counter(shard.group for rank in ranks for shard in rank.shards)
            group = min(support, key=lambda g: (counts[g], g))
            into = min((g for g in support if g != group), key=lambda g: (g[0] != group[0], -counts[g], g))
            merged[group] = into
            as_into = {"sharding_type": into[0], "compute_kernel": into[1]}
            regrouped = [
                tuple(replace(t, **as_into) if t.group == group else t for t in r.shards) for r in ranks
            ]
            ranks = [replace(r, shards=shards) for r, shards in zip(ranks, regrouped)]
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
    """Items 1-3 of the module docstring on the committed runs in `results_dir` (default: the
    repository's). Returns the results file's payload."""
    rebuilt = rebuild_gpu_ranks(results_dir, timeout_s)
    rows = rebuilt["runs"]
    kept = [row for row in rows if row["rebuilt"]]
    files = sorted({row["file"] for row in kept})
    payload: dict[str, Any] = {
        "benchmark": GPU_REFIT,
        "machine": GPU_MACHINE,
        "device": "cuda",
        "plans": [
            {k: v for k, v in row.items() if k != "ranks"} | {"measured_ranks": len(row["ranks"])}
            for row in rows
        ],
        "rebuildable_plans": len(kept),
        "plans_in_files": len(rows),
        "terms": list(GPU_TERMS),
        "scale": _gpu_scale(rebuilt["candidates"].values()),
        # the runs timed lookups and computed their comms from bytes: no collective's fixed latency
        "collective_ms_why": "not fitted: the committed runs timed no collective (comms computed from bytes)",
    }
    ranks = [r for row in kept for r in row["ranks"]]

    def refit(train: list[MeasuredRank], calls: bool) -> Calibration:
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
    payload |= {
        "fitted": True,
        "runs": files,
        "ranks": len(ranks),
        "leave_one_run_out": per_run,
        "heldout_errors": {key: _summary(values) for key, values in heldout.items()},
        "calibration": calibration.to_json(),
        "merged_groups": merged,
        "calibration_per_shard": refit(ranks, False).to_json(),
    }
    payload["proposed"] = [
        _proposed(world, calibration, timeout_s) for world in rebuilt["candidates"].values()
    ]
    return payload


def _proposed(world: dict[str, Any], calibration: Calibration, timeout_s: float) -> dict[str, Any]:
    """embnb DP's plan for one planned world under `calibration` (`calibrated_dp`), its rating and
    TBE groups per rank, beside the DP's plan on torchrec's defaults."""
    topology = world["topology"]
    options, rating, note = calibrated_dp(
        calibration, world["enumerated"], topology, world["batch_size"], world["model"].constraints, timeout_s
    )
    before = world["plans"].get("embnb DP")
    return {
        "world_size": topology.world_size,
        "hbm_cap_gb": world["hbm_cap_gb"],
        "local_world_size": topology.local_world_size,
        "note": note,
        **_plan_groups("embnb DP (GPU refit)", options, topology),
        "rating_ms": rating if options else None,
        "uncalibrated": _plan_groups("embnb DP", before.options if before else None, topology),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench gpu_refit", description=__doc__.split("\n")[0]
    )
    add_out_argument(parser)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="each planner's time limit")
    opts = parser.parse_args(argv)
    if not opts.timeout_s > 0:
        print(f"--timeout-s must be > 0, got {opts.timeout_s}", file=sys.stderr)
        return 2
    payload = gpu_refit(timeout_s=opts.timeout_s)
    payload["planned_on"] = stack_versions()  # the stack the plans were rebuilt on
    path = write_results(GPU_REFIT, payload, opts.out)
    print(f"{payload['rebuildable_plans']} of {payload['plans_in_files']} plans rebuilt; wrote {path}")
    return 0

"""`python -m embnb.bench steptime`: plans measured rank by rank against torchrec's estimates.

For each world size, a model of `--tables` tables (`make_model`) is planned on a topology of that
many devices of `--compute-device` (default: the measuring device's kind, so torchrec's estimator
models this hardware) by embnb's DP, torchrec's DP, Greedy and torchrec's default, beside poor plans
(`candidate_plans`). `--devices-per-host` makes hosts of that many devices (torchrec then offers
table_row_wise and grid_shard); `--hbm-gib` caps each device's HBM (the planners choose UVM caching).
Ids are uniform over each table's rows, or Zipf (`--ids zipf --zipf-alpha A`).

Before any comparison, issue #70's acceptance check (`embnb.scaling`): each planner's plan's critical
rank (torchrec's largest estimated total) runs its lookups at --batch-size times each of
--sweep-factors samples per rank, fitted on the bytes of table rows they read, beside the device's
copy bandwidth measured in the same run. The plans are compared at the smallest batch at which every
plan's fixed share is at most --max-fixed-share (`measure_placed`: the planners' plans in --repeats
interleaved rounds, each paired with embnb DP's; the poor plans after them); where some plan has no
such batch, the world says "overhead-bound: not compared". Per plan the JSON keeps each rank's
measured phases, torchrec's estimate per rank, the bytes of every collective with a communication
time computed from them (not measured), the critical path and the rating; across plans, Spearman's
rank correlation of measured critical path and rating.

`--write-plans FILE` plans each world and writes the plans (on a CUDA topology, with embnb's DP over
the committed GPU calibration) as plain data, measuring nothing; `--plans FILE` measures a file's
plans on its model and topologies and runs no planner, so a GPU's time goes to the measurement.
Results: steptime-DATE-MACHINE.json; steptime_capped-* with --hbm-gib, steptime_scale-* with --plans.
On a GPU the ranks run one after another on the one card, on FBGEMM's CUDA TBEs (exit 2 without).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from collections import Counter
from typing import Any

import torch
from torchrec.distributed.planner.planners import to_sharding_plan

from embnb.bench.plans import candidates_from_json, candidates_to_json
from embnb.bench.results import (
    add_out_argument,
    add_sweep_options,
    check_sweep_options,
    quiet_torchrec_logs,
    sweep_text,
    tbe_device,
    write_results,
)
from embnb.lab.planner.calibrated import load_gpu_refit
from embnb.lab.planner.candidates import (
    POOR,
    REFERENCE,
    CandidatePlan,
    candidate_plans,
    estimated_per_rank,
    measure_placed,
    plan_row,
)
from embnb.lab.planner.models import make_model
from embnb.metrics import spearman
from embnb.planner.calibration import Calibration
from embnb.planner.topology import make_topology
from embnb.results import stack_versions
from embnb.scaling import NOT_COMPARED, copy_bandwidth, measure_scaling, sweep_batches
from embnb.steptime import LINK_MODEL, PlanTimes, StepTimes, make_batch
from embnb.steptime.batch import ID_DISTRIBUTIONS
from embnb.steptime.kernels import DEFAULT_OPTIMIZER
from embnb.steptime.measure import CPU_CLOCK, DEFAULT_HIDDEN, StepOptions, lookup_steps
from embnb.steptime.work import plan_shards, plan_work
from embnb.timing import machine_name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench steptime", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--tables", type=int, default=100, help="tables in the model (make_model)")
    parser.add_argument("--max-rows", type=int, default=100_000, help="make_model's largest table (rows)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument(
        "--batch-size", type=int, default=256, help="samples per rank (torchrec's batch_size)"
    )
    parser.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"), help="where ranks run")
    parser.add_argument("--compute-device", default=None, choices=("cpu", "cuda"), help="the topology's")
    parser.add_argument(
        "--devices-per-host",
        type=int,
        default=None,
        help="devices per host (torchrec's local_world_size; host-level sharding types appear); "
        "default: one host",
    )
    parser.add_argument(
        "--hbm-gib",
        type=float,
        default=None,
        help="HBM per device of the topology (default: torchrec's); below the model's share, the "
        "planners choose UVM caching (a CUDA topology)",
    )
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads while measuring")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="each planner's time limit")
    parser.add_argument("--ids", default="uniform", choices=ID_DISTRIBUTIONS, help="the ids' distribution")
    parser.add_argument("--zipf-alpha", type=float, default=1.2, help="the Zipf ids' exponent")
    add_sweep_options(parser, "--batch-size", "bytes")
    parser.add_argument(
        "--plans", type=pathlib.Path, help="measure this file's plans (--write-plans'); plan nothing"
    )
    parser.add_argument(
        "--write-plans", type=pathlib.Path, help="plan, write the plans here, measure nothing"
    )
    add_out_argument(parser)
    return parser


def _check(opts: argparse.Namespace) -> str | None:
    for name in ("tables", "batch_size", "threads", "repeats"):
        if getattr(opts, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {getattr(opts, name)}"
    if min(opts.world_sizes) < 2:
        return f"--world-sizes must all be >= 2, got {opts.world_sizes}"
    per_host = opts.devices_per_host
    if per_host is not None and (per_host < 1 or any(w % per_host for w in opts.world_sizes if w > per_host)):
        sizes = opts.world_sizes
        return f"--devices-per-host must be >= 1 and divide each larger world size {sizes}, got {per_host}"
    if opts.hbm_gib is not None and not opts.hbm_gib > 0:
        return f"--hbm-gib must be > 0, got {opts.hbm_gib}"
    if opts.warmup < 0 or opts.max_rows < 1000 or opts.timeout_s <= 0:
        got = f"{opts.warmup}, {opts.max_rows}, {opts.timeout_s}"
        return f"--warmup >= 0, --max-rows >= 1000, --timeout-s > 0; got {got}"
    if not opts.zipf_alpha > 0:
        return f"--zipf-alpha must be > 0, got {opts.zipf_alpha}"
    if opts.plans and opts.write_plans:
        return "--plans and --write-plans exclude each other: measure a file's plans, or write them"
    if opts.plans and not opts.plans.is_file():
        return f"--plans {opts.plans}: no such file"
    return None


def _phases(times: StepTimes, estimate: dict[str, list[float]], topology) -> list[dict[str, Any]]:
    ranks = []
    for rank, comms in zip(times.ranks, times.comms):
        entry: dict[str, Any] = {"rank": rank.rank, "num_ids": rank.num_ids, "tbe_groups": list(rank.groups)}
        for name, timing in [*rank.phases.items(), ("lookup", rank.lookup), ("compute", rank.compute)]:
            entry[name] = {f"{clock}_s": timing.median_s(clock) for clock in ("wall", "cpu")}
            entry[name] |= {f"{clock}_s_range": list(timing.range_s(clock)) for clock in ("wall", "cpu")}
        entry |= {
            "bytes_read": rank.bytes_read,
            "sent_bytes": comms.sent_bytes,
            "received_bytes": comms.received_bytes,
            "collectives": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "phase": c.phase,
                    "sent": c.sent_bytes,
                    "received": c.received_bytes,
                }
                for c in comms.collectives
            ],
            "estimated_s": {key: values[rank.rank] for key, values in estimate.items()},
            "computed_comms_s": comms.computed_seconds(topology),
        }
        ranks.append(entry)
    return ranks


def _row(row: dict[str, Any], candidate: CandidatePlan, plan: PlanTimes | None, topology) -> dict[str, Any]:
    """`MeasuredCandidates.rows`' row with the bench's own keys: seconds, wall and CPU critical paths,
    kernels, and every rank's phases."""
    row = {**row, "rating_s": candidate.rating / 1e3, "planning_s": candidate.planning_s}
    if plan is None or not plan.measured:
        return {**row, "measured": False}
    times = plan.times
    ranks = _phases(times, estimated_per_rank(candidate.options, topology.world_size), topology)
    return {
        **row,
        "measured": True,
        "kernels": dict(Counter(o.compute_kernel for o in candidate.options)),
        "critical_rank": times.critical_rank("wall"),
        "critical_path_s": times.critical_path_s("wall"),
        "critical_path_cpu_s": times.critical_path_s("cpu"),
        "lookup_critical_path_s": max(r.lookup.median_s("wall") for r in times.ranks),
        "with_computed_comms_s": max(r["compute"]["wall_s"] + r["computed_comms_s"] for r in ranks),
        "ranks": ranks,
    }


def _correlations(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    measured = [r for r in rows if r["measured"]]
    if len(measured) < 2:
        return {}
    rating = [r["rating_s"] for r in measured]
    keys = ("critical_path_s", "critical_path_cpu_s", "lookup_critical_path_s", "with_computed_comms_s")
    return {key: spearman([r[key] for r in measured], rating) for key in keys}


def _topology(world_size: int, opts: argparse.Namespace, device: str):
    per_host = opts.devices_per_host if opts.devices_per_host and opts.devices_per_host < world_size else None
    return make_topology(
        world_size, opts.compute_device or device, hbm_cap_gb=opts.hbm_gib, local_world_size=per_host
    )


def _world_record(topology, opts: argparse.Namespace) -> dict[str, Any]:
    """A world's topology as the results and the plans files record it."""
    keys = ("world_size", "compute_device", "local_world_size")
    return {key: getattr(topology, key) for key in keys} | {"hbm_cap_gb": opts.hbm_gib}


def _acceptance(
    candidate: CandidatePlan, topology, model, batches, opts, device, bandwidth
) -> dict[str, Any]:
    """Issue #70's check of one plan (module docstring): its critical rank by torchrec's estimate,
    its lookups at every batch of `batches` (samples per rank -> GlobalBatch), `embnb.scaling`'s
    fit on the bytes they read. A plan that cannot run says why (`error`; no `fit`)."""
    estimate = estimated_per_rank(candidate.options, topology.world_size)["total"]
    rank = max(range(topology.world_size), key=estimate.__getitem__)
    head = {"plan": candidate.name, "critical_rank": rank}
    sizes = sorted(batches)
    try:
        shards = plan_shards(to_sharding_plan(candidate.options, topology), model.tables, topology.world_size)
        works = [plan_work(shards, batches[b], rank) for b in sizes]
        head["num_ids"] = [w.num_ids for w in works]
        steps = dict(zip(sizes, lookup_steps(works, StepOptions(device=device))))
        # at least one untimed call per batch: a TBE's first one sets up its state, slow at any size
        work, share, warmup = [w.bytes_read for w in works], opts.max_fixed_share, max(opts.warmup, 1)
        check = measure_scaling(steps, work, "bytes", opts.repeats, device, share, bandwidth, warmup)
    except (RuntimeError, ValueError) as error:  # out of memory at the largest batch, among others
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return head | {"chosen_batch": None, "error": f"{type(error).__name__}: {str(error)[:300]}"}
    return head | check.as_dict()


def _world(world_size: int, opts: argparse.Namespace, device: str, bandwidth: float, save, planned=None):
    """One world: its plans (planned here, or `planned`: (topology, candidates) from --plans), the
    acceptance check, then the plans compared at the batch it chose, or not compared. `save(record)`
    writes the results with this world's record so far: the check's, before the comparison starts
    (a run cut during the comparison keeps it)."""
    model = make_model(opts.tables, seed=opts.seed, max_rows=opts.max_rows)
    if planned is None:
        topology = _topology(world_size, opts, device)
        candidates = candidate_plans(model, topology, opts.batch_size, timeout_s=opts.timeout_s)
    else:
        topology, candidates = planned
    batches = {
        b: make_batch(model.tables, model.constraints, world_size, b, opts.seed, opts.ids, opts.zipf_alpha)
        for b in sweep_batches(opts.batch_size, opts.sweep_factors)
    }
    checks = [
        _acceptance(c, topology, model, batches, opts, device, bandwidth)
        for c in candidates.values()
        if c.note != POOR and c.options is not None
    ]
    for check in checks:
        print(f"W={world_size:>3} {check['plan']:<26} rank {check['critical_rank']}: {sweep_text(check)}")
    chosen = [c["chosen_batch"] for c in checks if "fit" in c]
    batch_size = max(chosen) if chosen and None not in chosen else None
    record = _world_record(topology, opts) | {
        "acceptance": checks,
        "batch_size": batch_size,
        "verdict": NOT_COMPARED if batch_size is None else f"compared at batch {batch_size}",
    }
    record["plans"] = [_row(plan_row(c, topology), c, None, topology) for c in candidates.values()]
    if batch_size is None:
        print(f"W={world_size:>3} {NOT_COMPARED}", flush=True)
        return record
    save(record | {"comparison": "not finished"})
    measured = measure_placed(
        topology,
        candidates,
        model.tables,
        batches[batch_size],
        opts.repeats,
        device=device,
        alone_repeats=opts.repeats,
        threads=opts.threads,
        warmup=opts.warmup,
    )
    plans = measured.world.plans
    rows = [_row(row, candidates[row["plan"]], plans.get(row["plan"]), topology) for row in measured.rows()]
    for row in rows:
        if row["measured"]:
            path, cpu = row["critical_path_s"] * 1e3, row["critical_path_cpu_s"] * 1e3
            print(
                f"W={world_size:>3} {row['plan']:<26} measured critical path {path:8.1f} ms "
                f"(rank {row['critical_rank']}, thread CPU {cpu:8.1f} ms)  "
                f"torchrec rating {row['rating_s'] * 1e3:8.2f} ms  {row['shape']}",
                flush=True,
            )
        else:
            print(f"W={world_size:>3} {row['plan']:<26} no plan: {row['note']}", flush=True)
    correlations = _correlations(rows)
    print(f"W={world_size:>3} Spearman(measured critical path, torchrec rating): {correlations}", flush=True)
    told = measured.world.told_apart() or "none (this machine cannot tell these plans apart)"
    print(f"W={world_size:>3} told apart from {REFERENCE}, round by round: {told}", flush=True)
    return record | {
        "plans": rows,
        "clock": measured.world.clock,
        "spearman_vs_rating": correlations,
        "told_apart": measured.world.told_apart(),
    }


# --write-plans: issue #70's planners' plans, beside embnb's DP over the GPU calibration (CALIBRATED)
WRITTEN_PLANNERS = ("embnb DP", "Greedy", "torchrec default")


def write_plans(opts: argparse.Namespace, device: str) -> int:
    """Plan each world of --world-sizes and write the plans to --write-plans (module docstring)."""
    model = make_model(opts.tables, seed=opts.seed, max_rows=opts.max_rows)
    worlds, refit = [], None
    for world_size in opts.world_sizes:
        topology = _topology(world_size, opts, device)
        calibration = None
        if topology.compute_device == "cuda":
            refit = load_gpu_refit()
            calibration = Calibration.from_json(refit.data["calibration"])
        candidates = candidate_plans(
            model,
            topology,
            opts.batch_size,
            timeout_s=opts.timeout_s,
            planners=WRITTEN_PLANNERS,
            poor=False,
            calibration=calibration,
        )
        for c in candidates.values():
            print(
                f"W={world_size:>3} {c.name:<26} rating {c.rating:8.2f} ms in {c.planning_s:6.1f} s {c.note}"
            )
        given = {"devices_per_host": opts.devices_per_host, "batch_size": opts.batch_size}
        worlds.append(_world_record(topology, opts) | given | {"plans": candidates_to_json(candidates)})
    payload = {
        "model": {"tables": opts.tables, "max_rows": opts.max_rows, "seed": opts.seed},
        "planned_on": stack_versions(),
        "calibration": refit and refit.path.name,
        "worlds": worlds,
    }
    opts.write_plans.parent.mkdir(parents=True, exist_ok=True)
    opts.write_plans.write_text(json.dumps(payload) + "\n")
    print(f"wrote {opts.write_plans}")
    return 0


def load_plans(opts: argparse.Namespace) -> list:
    """--plans' worlds as (world size, (topology, candidates)); the file's model and topologies
    replace the options' (module docstring)."""
    data = json.loads(opts.plans.read_text())
    opts.tables, opts.max_rows, opts.seed = (data["model"][k] for k in ("tables", "max_rows", "seed"))
    model = make_model(opts.tables, seed=opts.seed, max_rows=opts.max_rows)
    first = data["worlds"][0]  # --write-plans gives every world the same device, HBM and hosts
    opts.compute_device, opts.hbm_gib, opts.devices_per_host = (
        first[k] for k in ("compute_device", "hbm_cap_gb", "devices_per_host")
    )
    opts.world_sizes = [w["world_size"] for w in data["worlds"]]
    return [
        (
            w["world_size"],
            (_topology(w["world_size"], opts, opts.compute_device), candidates_from_json(w["plans"], model)),
        )
        for w in data["worlds"]
    ]


def main(argv: list[str]) -> int:
    parser = _parser()
    opts = parser.parse_args(argv)
    check_sweep_options(parser, opts)
    problem = _check(opts)
    if problem:
        parser.error(problem)
    try:
        device = tbe_device(opts.device)
    except ValueError as error:
        parser.error(str(error))
    quiet_torchrec_logs()
    if opts.write_plans:
        return write_plans(opts, device)
    planned = dict(load_plans(opts)) if opts.plans else {}
    start = time.perf_counter()
    before = torch.get_num_threads()
    worlds: list[dict[str, Any]] = []

    def save(partial: dict[str, Any] | None = None) -> pathlib.Path:
        payload = {
            "device": device,
            "machine": machine_name(device),
            "threads": opts.threads,
            "cpu_clock": CPU_CLOCK[device],  # what the "cpu" times are: thread CPU time, or enqueue time
            "torch_threads_before": before,
            "model": {"tables": opts.tables, "max_rows": opts.max_rows, "seed": opts.seed},
            "plans_file": opts.plans and opts.plans.name,
            "ids": opts.ids,
            "zipf_alpha": opts.zipf_alpha if opts.ids == "zipf" else None,
            "batch_size": opts.batch_size,
            "sweep_factors": opts.sweep_factors,
            "max_fixed_share": opts.max_fixed_share,
            "copy_bandwidth_bytes_per_s": bandwidth,
            "warmup": opts.warmup,
            "repeats": opts.repeats,
            "optimizer": DEFAULT_OPTIMIZER,
            "dense_hidden": list(DEFAULT_HIDDEN),
            "link_model": LINK_MODEL,
            "worlds": worlds + ([partial] if partial else []),
            "seconds": time.perf_counter() - start,
        }
        # a capped HBM is a regime of its own (UVM on a GPU), and so are plans made beforehand (the
        # production-scale run): each its own file, beside the uncapped one
        name = "steptime_capped" if opts.hbm_gib else "steptime_scale" if opts.plans else "steptime"
        return write_results(name, payload, opts.out)

    torch.set_num_threads(opts.threads)  # the sweep's and the copy's clock: this thread count
    try:
        bandwidth = copy_bandwidth(device)
        print(f"copy bandwidth on {machine_name(device)}: {bandwidth / 1e9:.3g} GB/s", flush=True)
        for world_size in opts.world_sizes:
            worlds.append(_world(world_size, opts, device, bandwidth, save, planned.get(world_size)))
            path = save()
    finally:
        torch.set_num_threads(before)
    print(f"wrote {path} in {time.perf_counter() - start:.0f} s")
    return 0

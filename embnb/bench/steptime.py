"""`python -m embnb.bench steptime`: plans measured rank by rank against torchrec's estimates.

For each world size, a model of `--tables` tables (`make_model`) is planned
on a topology of that many devices of `--compute-device` (default: the
measuring device's kind, so torchrec's estimator models this hardware) by
embnb's DP, torchrec's DP, Greedy and torchrec's default proposers, beside
poor plans (every table table-wise on 1 and 2 ranks, every table
data-parallel). Each plan is run rank by rank (`measure_candidates` over
`embnb.steptime.measure_world`): the rank's own TBEs fed the ids torchrec's
input dist would deliver, and the dense MLP on its local samples, forward
and backward at `--threads` threads; the planners' plans in `--repeats`
interleaved rounds (`--warmup` untimed steps, one timed, per round), each
one's step minus embnb DP's paired round by round (`minus_embnb_dp_mean`,
`_ci_low`, `_ci_high`, `verdict`: `MeasuredCandidates.rows`), the
poor plans after them, `--repeats` times each. Per plan the JSON keeps each
rank's measured phases (median, range; wall and thread CPU time),
torchrec's estimate per rank, the bytes of every collective and a
communication time computed from them with torchrec's bandwidths (not
measured), the critical path (slowest rank) and the rating; across plans,
Spearman's rank correlation of measured critical path and rating.

`--devices-per-host` makes hosts of that many devices: torchrec then offers
table_row_wise and grid_shard, replayed as torchrec runs them (each block's
rows over one host's devices; a reduce-scatter within the host, then an
all-to-all across hosts, timed by the link model at torchrec's intra- and
cross-host bandwidths).

On a GPU (`--device cuda`), the ranks run one after another on the one
card; FBGEMM's CUDA TBE is needed (the fbgemm-gpu-cpu wheel has none): the
bench says so and exits 2 without it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

import torch

from embnb.bench.results import add_out_argument, quiet_torchrec_logs, tbe_device, write_results
from embnb.lab.planner.candidates import (
    REFERENCE,
    CandidatePlan,
    estimated_per_rank,
    measure_candidates,
)
from embnb.lab.planner.models import make_model
from embnb.metrics import spearman
from embnb.steptime import LINK_MODEL, PlanTimes, StepTimes
from embnb.steptime.kernels import DEFAULT_OPTIMIZER
from embnb.steptime.measure import DEFAULT_HIDDEN
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
        "--hbm-gib", type=float, default=None,
        help="HBM per device of the topology (default: torchrec's); below the model's share, the "
        "planners choose UVM caching (a CUDA topology)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads while measuring")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="each planner's time limit")
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
    return None


def _phases(times: StepTimes, estimate: dict[str, list[float]], topology) -> list[dict[str, Any]]:
    ranks = []
    for rank, comms in zip(times.ranks, times.comms):
        entry: dict[str, Any] = {"rank": rank.rank, "num_ids": rank.num_ids, "tbe_groups": list(rank.groups)}
        for name, timing in [*rank.phases.items(), ("lookup", rank.lookup), ("compute", rank.compute)]:
            entry[name] = {
                "wall_s": timing.median_s("wall"),
                "wall_s_range": list(timing.range_s("wall")),
                "cpu_s": timing.median_s("cpu"),
                "cpu_s_range": list(timing.range_s("cpu")),
            }
        entry["sent_bytes"], entry["received_bytes"] = comms.sent_bytes, comms.received_bytes
        entry["collectives"] = [
            {
                "name": c.name,
                "kind": c.kind,
                "phase": c.phase,
                "sent": c.sent_bytes,
                "received": c.received_bytes,
            }
            for c in comms.collectives
        ]
        entry["estimated_s"] = {key: values[rank.rank] for key, values in estimate.items()}
        entry["computed_comms_s"] = comms.computed_seconds(topology)
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


def _world(world_size: int, opts: argparse.Namespace, device: str) -> dict[str, Any]:
    model = make_model(opts.tables, seed=opts.seed, max_rows=opts.max_rows)
    per_host = opts.devices_per_host if opts.devices_per_host and opts.devices_per_host < world_size else None
    measured = measure_candidates(
        model, world_size, opts.batch_size, opts.repeats, device=device, compute_device=opts.compute_device,
        hbm_cap_gb=opts.hbm_gib, local_world_size=per_host, alone_repeats=opts.repeats, seed=opts.seed,
        timeout_s=opts.timeout_s, threads=opts.threads, warmup=opts.warmup,
    )  # fmt: skip
    topology = measured.topology
    plans, candidates = measured.world.plans, measured.candidates
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
    return {"world_size": world_size, "compute_device": topology.compute_device, "hbm_cap_gb": opts.hbm_gib,
            "local_world_size": topology.local_world_size, "plans": rows, "clock": measured.world.clock,
            "spearman_vs_rating": correlations, "told_apart": measured.world.told_apart()}  # fmt: skip


def main(argv: list[str]) -> int:
    parser = _parser()
    opts = parser.parse_args(argv)
    problem = _check(opts)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        device = tbe_device(opts.device)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    quiet_torchrec_logs()
    start = time.perf_counter()
    worlds = [_world(w, opts, device) for w in opts.world_sizes]
    payload = {
        "device": device,
        "machine": machine_name(device),
        "threads": opts.threads,
        "torch_threads_before": torch.get_num_threads(),
        "model": {"tables": opts.tables, "max_rows": opts.max_rows, "seed": opts.seed},
        "batch_size": opts.batch_size,
        "warmup": opts.warmup,
        "repeats": opts.repeats,
        "optimizer": DEFAULT_OPTIMIZER,
        "dense_hidden": list(DEFAULT_HIDDEN),
        "link_model": LINK_MODEL,
        "worlds": worlds,
        "seconds": time.perf_counter() - start,
    }
    # a capped HBM is a regime of its own (UVM on a GPU): its own file, beside the uncapped one
    path = write_results("steptime_capped" if opts.hbm_gib else "steptime", payload, opts.out)
    print(f"wrote {path} in {payload['seconds']:.0f} s")
    return 0

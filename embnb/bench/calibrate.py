"""`python -m embnb.bench calibrate`: torchrec's perf model fitted to kernels measured rank by rank, then
checked on models and plans it was not fitted on.

1. Training set: for each of `--train-seeds` x `--train-world-sizes`, a model of `--tables` tables
   (`make_model`) on a topology of `--device`'s kind (on CUDA, UVM kernels are among the options) and
   `--train-plans` random plans over torchrec's enumerated options (each table a random sharding type,
   then a random option of it, its shards on random ranks). Every plan is measured rank by rank
   (`embnb.steptime.measure_plan`: real FBGEMM TBEs, forward + backward with the fused optimizer; on a
   CPU thread CPU time at one thread, on a GPU wall time with the GPU synchronized) and each rank
   becomes a `MeasuredRank` (`calibration.measured_ranks`); `fitting.fit` fits torchrec's forward
   coefficients per (sharding type, compute kernel).
2. Held-out check: other seeds' models at `--heldout-world-sizes` (notebook 03's seed is the first),
   planned by torchrec's planner with embnb's DP, torchrec's DP, Greedy and torchrec's default
   proposers on torchrec's default estimator, beside embnb's DP and torchrec's default proposers on the
   calibrated estimator and two poor plans (every table table-wise on 1 and on 2 ranks). Every plan is
   measured; per rank holding a shard, the relative error of torchrec's default estimate and of the
   calibrated estimate against the measured lookups (median and worst of |error|). A world's plans
   are measured in interleaved rounds (`embnb.steptime.measure_world`): each round runs every plan
   once, so a machine that slows during the run slows every plan alike. The default
   held-out set: notebook 03's seed at W = 8 and 32, and two other models. Where two planners
   return one placement it is measured twice: rank by rank, how far apart the two came is the
   noise under those errors (`rank_repeat_gap`).
3. `collective_ms`: each sharding type's collectives (their fixed latency, payloads of one element)
   timed on `--collective-world-size` real ranks (`embnb.planner.latency`), before the held-out
   worlds are planned: the calibrated DP rates plans with it.
4. Which plan measured fastest: per held-out model, each plan's measured critical path (the slowest
   rank's step, lookups + dense part, per repeat: median and range), and round by round its step
   minus embnb DP (calibrated)'s (`measure_world`'s paired difference: the mean with its 95%
   t-interval).

5. `speed_probe`: one fixed rank timed before the training set, after it and after the held-out
   worlds: the machine's own drift over the run, beside the errors it would move.

The figures are measured on `--device` (this machine's CPU by default, or its GPU; named by
`embnb.timing.machine_name`), except the estimates, which are labelled as torchrec's.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from dataclasses import asdict, replace
from typing import Any

import torch
from torchrec.distributed.planner.planners import to_sharding_plan
from torchrec.distributed.planner.types import PlannerError

from embnb._torchrec_private import best_plan
from embnb.bench.calibrate_training import PROBE_SEED, PROBE_TABLES, speed_probe, training_set
from embnb.bench.results import add_out_argument, quiet_torchrec_logs, tbe_device, write_results
from embnb.devices import device_cache_bytes, visible_gpus
from embnb.lab.planner.calibrated import PAIRED_WITH, rank_repeat_gap, rank_repeat_gaps
from embnb.lab.planner.candidates import candidate_plans, plan_shape
from embnb.lab.planner.comparison import default_proposers
from embnb.lab.planner.models import Enumerated, Model, enumerate_options, make_model
from embnb.lab.planner.planning import run_planner
from embnb.planner.calibration import (
    TERMS,
    Calibration,
    estimators,
    rank_terms,
    torchrec_default_estimate,
)
from embnb.planner.enumerator import make_enumerator
from embnb.planner.factory import create_planner
from embnb.planner.fitting import fit
from embnb.planner.latency import CollectiveLatency, measure_collective_ms
from embnb.planner.perf_model import KernelCallPerfModel
from embnb.planner.topology import make_topology
from embnb.steptime import CLOCKS, make_batch, measure_world
from embnb.timing import Stopwatch, machine_name

SKIPPED = (
    "all data-parallel",
)  # the dense kernel's whole-table update: minutes on a CPU, not a plan anyone runs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench calibrate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--tables", type=int, default=20, help="tables per model (make_model)")
    parser.add_argument("--max-rows", type=int, default=100_000, help="make_model's largest table (rows)")
    parser.add_argument("--batch-size", type=int, default=128, help="samples per rank")
    parser.add_argument("--train-seeds", type=int, nargs="+", default=[1, 2])
    # the held-out worlds' sizes too: trained on W <= 16, the per-call cost took over what grows with
    # the bags a shard pools (W x samples), and W = 32's ranks came out 13-21% low (issue #69)
    parser.add_argument("--train-world-sizes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--train-plans", type=int, default=8, help="random plans per model and world size")
    parser.add_argument(
        "--heldout",
        nargs="+",
        default=["0:8", "0:32", "3:8", "4:16"],
        help="held-out models as SEED:WORLD_SIZE (seed 0: notebook 03's model seed)",
    )
    parser.add_argument(
        "--terms",
        nargs="+",
        default=None,
        choices=TERMS,
        help="the coefficients to fit (fit's terms; default: all, less the miss term without a cache size)",
    )
    parser.add_argument(
        "--cache-bytes",
        type=int,
        default=None,
        help="the cache the miss term measures tables against (default: the device's, device_cache_bytes)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("auto", "cpu", "cuda"),
        help="where ranks run; the topology is of this device's kind (cuda: UVM kernels among the options)",
    )
    parser.add_argument(
        "--collective-world-size",
        type=int,
        default=None,
        help="ranks each sharding type's collectives are timed on for collective_ms (default: the "
        "machine's cores, at least 2, each rank on a core of its own, even where the bench is pinned; "
        "on CUDA its GPUs, one per rank, else not measured)",
    )
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads while measuring")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="of the batches and the random plans")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="each planner's time limit")
    add_out_argument(parser)
    return parser


def _check(opts: argparse.Namespace) -> str | None:
    for name in ("tables", "batch_size", "threads", "repeats", "train_plans"):
        if getattr(opts, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {getattr(opts, name)}"
    try:
        opts.heldout = [tuple(int(part) for part in pair.split(":")) for pair in opts.heldout]
    except ValueError:
        return f"--heldout takes SEED:WORLD_SIZE pairs of integers, e.g. 0:8, got {opts.heldout}"
    if any(len(pair) != 2 for pair in opts.heldout):
        return f"--heldout takes SEED:WORLD_SIZE pairs, got {opts.heldout}"
    sizes = opts.train_world_sizes + [w for _, w in opts.heldout]
    if min(sizes) < 2:
        return f"world sizes must all be >= 2, got {sizes}"
    if set(opts.train_seeds) & {s for s, _ in opts.heldout}:
        both = sorted(set(opts.train_seeds) & {s for s, _ in opts.heldout})
        return f"--train-seeds and the --heldout seeds must differ (held out: not fitted on), both: {both}"
    if opts.collective_world_size is not None and opts.collective_world_size < 2:
        return f"--collective-world-size must be >= 2, got {opts.collective_world_size}"
    if opts.cache_bytes is not None and opts.cache_bytes < 1:
        return f"--cache-bytes must be >= 1, got {opts.cache_bytes}"
    if opts.warmup < 0 or opts.max_rows < 1000 or opts.timeout_s <= 0:
        got = f"{opts.warmup}, {opts.max_rows}, {opts.timeout_s}"
        return f"--warmup >= 0, --max-rows >= 1000, --timeout-s > 0; got {got}"
    return None


def _placement(options) -> tuple:
    """A plan's placement: every shard's table, sharding type, kernel, offsets and rank."""
    return tuple(
        sorted(
            (o.name, o.sharding_type, o.compute_kernel, tuple(s.offset), s.rank)
            for o in options
            for s in o.shards
        )
    )


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def calibrated_dp(
    calibration: Calibration, enumerated: Enumerated, topology, batch_size: int, constraints, timeout_s: float
) -> tuple[list | None, float, str]:
    """embnb's DP as a torchrec user plans with a calibration: `create_planner(...,
    calibration=calibration)`, over the calibrated estimates, the planner and the DP's replica both
    rating with its `KernelCallPerfModel`; memory reserved as `run_planner` reserves it (a fixed
    15%). Returns the placed plan (None: none placed), its rating (ms; NaN: none) and a note (why
    no plan, or where the planner and the replica disagreed)."""
    the_planner = create_planner(
        topology,
        batch_size,
        constraints=constraints,
        calibration=calibration,
        progress=False,
        storage_reservation="fixed",
        timeout_seconds=max(1, math.ceil(timeout_s)),
    )
    try:
        the_planner.plan(enumerated.module, enumerated.sharders)
    except PlannerError as error:
        return None, math.nan, "no plan: " + str(error).strip().splitlines()[0][:200]
    return best_plan(the_planner), the_planner.rating, "; ".join(the_planner.dp_proposer.disagreements)


def _calibrated_plans(
    calibration: Calibration, model: Model, enumerated: Enumerated, topology, opts
) -> dict[str, tuple[list | None, float, str]]:
    """embnb's DP (`calibrated_dp`) and torchrec's default proposers planning over the calibrated
    estimates: per plan name, the placed plan, its rating (ms) and a note."""
    chosen = make_enumerator(
        "embnb",
        topology,
        opts.batch_size,
        model.constraints,
        estimator=estimators(calibration, topology, model.constraints),
    )
    options = chosen.enumerate(enumerated.module, enumerated.sharders)
    calibrated = Enumerated(enumerated.module, enumerated.sharders, options, 0.0)
    # torchrec's proposers rate nothing themselves: the planner's NoopPerfModel rates their plans
    default = run_planner(
        default_proposers()["torchrec default"](),
        calibrated,
        topology,
        opts.batch_size,
        name="torchrec default (calibrated)",
        constraints=model.constraints,
        timeout_s=opts.timeout_s,
    )
    dp = calibrated_dp(calibration, enumerated, topology, opts.batch_size, model.constraints, opts.timeout_s)
    return {"embnb DP (calibrated)": dp, default.proposer: (default.plan, default.perf_rating, default.note)}


def heldout_world(
    calibration: Calibration, seed: int, world_size: int, opts, per_shard: Calibration | None = None
) -> dict[str, Any]:
    """Items 2 and 3 for one held-out model at one world size; `per_shard`: the fit without the
    kernel-call term, whose estimate each rank records beside (the error before the term)."""
    model = make_model(opts.tables, seed=seed, max_rows=opts.max_rows)
    topology = make_topology(world_size, opts.device)
    enumerated = enumerate_options(model.tables, topology, opts.batch_size, model.constraints, "embnb")
    plans = {
        name: (c.options, c.rating, c.note, "torchrec default")
        for name, c in candidate_plans(
            model, topology, opts.batch_size, timeout_s=opts.timeout_s, enumerated=enumerated
        ).items()
        if name not in SKIPPED
    }
    for name, (options, rating, note) in _calibrated_plans(
        calibration, model, enumerated, topology, opts
    ).items():
        plans[name] = (options, rating, note, "calibrated")
    batch = make_batch(model.tables, model.constraints, world_size, opts.batch_size, opts.seed)
    world = measure_world(
        {name: to_sharding_plan(plan[0], topology) for name, plan in plans.items() if plan[0] is not None},
        model.tables,
        batch,
        opts.repeats,
        reference=PAIRED_WITH if plans[PAIRED_WITH][0] else None,
        device=opts.device,
        threads=opts.threads,
        warmup=opts.warmup,
    )
    rows, placements = [], {}
    for name, (options, rating, note, estimator) in plans.items():
        rating = None if math.isnan(rating) else rating  # no plan: strict JSON has no NaN
        row: dict[str, Any] = {"plan": name, "estimator": estimator, "rating_ms": rating, "note": note}
        if options is None:
            rows.append({**row, "measured": False})
            continue
        # Two planners may return one placement: measured again, it shows the spread between runs.
        row["same_as"] = placements.setdefault(_placement(options), name)
        measured = world.plans[name]
        if not measured.measured:  # a sharding type steptime does not replay: the others count
            rows.append({**row, "measured": False, "note": measured.error})
            print(f"heldout seed={seed} W={world_size:>2} {name:<30} {measured.error}", flush=True)
            continue
        per_rank = rank_terms(
            options, topology, enumerated.sharders, model.constraints, calibration.cache_bytes
        )
        calls = KernelCallPerfModel(topology).kernel_calls(options)
        ranks = [
            {
                "rank": r.rank,
                "lookup_ms": r.lookup.median_s(opts.clock) * 1e3,
                "lookup_ms_range": [v * 1e3 for v in r.lookup.range_s(opts.clock)],
                "step_ms": r.compute.median_s(opts.clock) * 1e3,
                "torchrec_estimate_ms": torchrec_default_estimate(per_rank[r.rank]),
                "calibrated_estimate_ms": calibration.estimate(per_rank[r.rank], calls[r.rank]),
                **({"per_shard_estimate_ms": per_shard.estimate(per_rank[r.rank])} if per_shard else {}),
                "shards": len(per_rank[r.rank]),
                "kernel_calls": calls[r.rank],
                "tbe_groups": list(r.groups),
            }
            for r in measured.times.ranks
        ]
        step = _spread(measured.step_ms)
        row["priced_without_own_fit"] = _unfitted(calibration, per_rank)
        row |= {
            "measured": True,
            "shape": plan_shape(options),
            "step_ms": step,
            "ranks": ranks,
            "lookup_ms": _spread(measured.lookup_ms),
            "step_ms_rounds": measured.step_ms,
        }
        print(
            f"heldout seed={seed} W={world_size:>2} {name:<30} critical path {step['median']:7.1f} ms "
            f"({step['low']:.1f}-{step['high']:.1f}, {opts.clock} time) {plan_shape(options)}",
            flush=True,
        )
        if measured.minus_reference is not None:
            row["minus_" + PAIRED_WITH] = measured.minus_reference.as_dict()
            print(
                f"heldout seed={seed} W={world_size:>2} {name:<30} minus {PAIRED_WITH}, round by "
                f"round: {measured.minus_reference} ms",
                flush=True,
            )
        rows.append(row)
    measured = [r for r in rows if r["measured"]]
    fastest = min(measured, key=lambda r: r["step_ms"]["median"])
    return {
        "seed": seed,
        "world_size": world_size,
        "plans": rows,
        "fastest": fastest["plan"],
        "errors": errors([rank for r in measured for rank in r["ranks"]]),
    }


def _unfitted(calibration: Calibration, per_rank: list[list[Any]]) -> dict[str, str]:
    """The plan's (sharding type, kernel) groups the calibration has no fit of, each with what
    priced it: a fitted sibling's group, or torchrec's default."""
    groups = {shard.group for shards in per_rank for shard in shards} - set(calibration.coefficients)
    return {
        "/".join(group): "/".join(calibration.priced_as(group) or ("torchrec default",))
        for group in sorted(groups)
    }


# Each rank's estimates in the JSON, and the name its error goes by: torchrec's default, the fit
# with the kernel-call term (the calibration), the same fit without it (per shard only).
ESTIMATES = (
    ("torchrec_estimate_ms", "torchrec_default"),
    ("calibrated_estimate_ms", "calibrated"),
    ("per_shard_estimate_ms", "calibrated_per_shard"),
)


def errors(ranks: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """|estimate / measured - 1| over ranks holding a shard: median and worst, per estimator."""
    held = [r for r in ranks if r["shards"]]
    out = {}
    for key, name in ESTIMATES:
        if not held or key not in held[0]:
            continue
        values = [abs(r[key] / r["lookup_ms"] - 1) for r in held]
        out[name] = {"median": statistics.median(values), "worst": max(values), "ranks": len(values)}
    return out


def collective_latency(opts: argparse.Namespace) -> CollectiveLatency:
    """The calibration's `collective_ms`: each sharding type's collectives timed on real ranks
    (`measure_collective_ms`; why as many ranks as cores by default: its module's docstring)."""
    world_size = opts.collective_world_size
    if world_size is None:
        world_size = max(2, visible_gpus() if opts.device == "cuda" else os.cpu_count() or 1)
    latency = measure_collective_ms(world_size, opts.device)
    print(f"collective_ms on {world_size} ranks: {latency.collective_ms or latency.why}", flush=True)
    return latency


def main(argv: list[str]) -> int:
    opts = _parser().parse_args(argv)
    problem = _check(opts)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        opts.device = tbe_device(opts.device)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    opts.clock = CLOCKS[opts.device]
    if opts.cache_bytes is None:
        opts.cache_bytes = device_cache_bytes(opts.device)
    quiet_torchrec_logs()
    before, load = torch.get_num_threads(), os.getloadavg()  # a shared machine: how busy it was
    with Stopwatch() as watch:
        probe = {"before_training": speed_probe(opts)[0]}
        ranks, train_rows = training_set(opts)
        probe["after_training"], probe_ids = speed_probe(opts)
        calibration = fit(
            ranks, opts.device, machine_name(opts.device), terms=opts.terms, cache_bytes=opts.cache_bytes
        )
        # the same fit without the kernel-call term: the held-out error before it
        per_shard = fit(
            ranks,
            opts.device,
            machine_name(opts.device),
            terms=opts.terms,
            cache_bytes=opts.cache_bytes,
            kernel_calls=False,
        )
        latency = collective_latency(opts)
        calibration = replace(calibration, collective_ms=latency.collective_ms)
        fit_abs = [abs(e) for e in calibration.fit_errors]
        print(
            f"fit on {len(ranks)} ranks: |error| median {statistics.median(fit_abs):.3f}, worst "
            f"{max(fit_abs):.3f}; kernel_call_ms {calibration.kernel_call_ms:.3f}",
            flush=True,
        )
        worlds = [
            heldout_world(calibration, seed, world_size, opts, per_shard) for seed, world_size in opts.heldout
        ]
        probe["after_heldout"] = speed_probe(opts)[0]
    print(f"speed probe ({probe_ids} ids, {opts.clock} time): {probe} ms", flush=True)
    heldout = errors([rank for w in worlds for p in w["plans"] if p["measured"] for rank in p["ranks"]])
    for name, e in heldout.items():
        print(
            f"held out, {name}: per-rank |error| median {e['median']:.3f}, worst {e['worst']:.3f} "
            f"over {e['ranks']} ranks",
            flush=True,
        )
    floor = rank_repeat_gap(rank_repeat_gaps(worlds))
    if floor is not None:
        print(f"the same ranks measured twice: |gap| median {floor['median']:.3f} over {floor['ranks']}")
    payload = {
        "device": opts.device,
        "machine": machine_name(opts.device),
        "clock": opts.clock,
        "threads": opts.threads,
        "torch_threads_before": before,
        "load_average_before": list(load),
        "model": {"tables": opts.tables, "max_rows": opts.max_rows},
        "batch_size": opts.batch_size,
        "warmup": opts.warmup,
        "repeats": opts.repeats,
        "skipped_plans": list(SKIPPED),
        "train": {
            "seeds": opts.train_seeds,
            "world_sizes": opts.train_world_sizes,
            "plans": train_rows,
            "ranks": len(ranks),
        },
        "collectives": asdict(latency),  # how collective_ms was measured, or why it was not
        "calibration": calibration.to_json(),
        "calibration_per_shard": per_shard.to_json(),  # the same fit without the kernel-call term
        "heldout_errors": heldout,
        # one fixed rank timed three times: a change between them is the machine's speed (`speed_probe`)
        "speed_probe": {"ms": probe, "ids": probe_ids, "tables": PROBE_TABLES, "seed": PROBE_SEED},
        "rank_repeat_gap": floor,  # one placement measured twice, rank by rank: the noise under the errors
        "heldout": worlds,
        "bench_s": watch.wall_s,
    }
    path = write_results("calibrate", payload, opts.out)
    print(f"wrote {path} in {watch.wall_s:.0f} s")
    return 0

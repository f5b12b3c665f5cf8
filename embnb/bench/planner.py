"""Planning time and plan quality at scale: `python -m embnb.bench planner`.

Plans random models (`make_model`: --tables) on GPU topologies (--world-sizes) whose HBM holds
--hbm-fraction of the tables' fp32 rows, with torchrec's EmbeddingShardingPlanner and, in turn, this
DP proposer, torchrec's DynamicProgrammingProposer and torchrec's default proposers, each under the same
time limit (checked by torchrec's planner between proposals) over torchrec's enumeration. Options are
enumerated --enumerate-repeats times by torchrec's EmbeddingEnumerator and embnb's
DistinctShardEnumerator (medians and ranges; their options checked equal). Each proposer's perf
rating (slowest rank) and planning time are recorded for the performance page to compare; this DP
plans --repeats times (its times: the median run's, every run's in `plan_s_runs`), each peer once.

End to end, for embnb: `create_planner(topology, batch_size, constraints, storage_reservation="fixed")
.plan(module, sharders)` as a user calls it (every proposer here plans under
FixedPercentageStorageReservation(0.15)), --repeats times from a fresh module; for torchrec's proposers,
torchrec's enumeration (median) plus their planning time. Plan quality (`quality_study`: random small
instances, HBM that binds): each proposer's rating over the brute-force optimum, as the worst ratio,
the share within 2% and the instances without a plan. `--tables` with no value skips the scale part;
`--quality-instances 0` the quality part.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import time
from dataclasses import replace

import numpy as np
import pandas as pd

from embnb import planner
from embnb.bench.results import add_out_argument, quiet_torchrec_logs, spread, write_results
from embnb.lab.planner.comparison import Planning, compare_proposers, default_proposers
from embnb.lab.planner.models import Enumerated, enumerate_options, fused_table_gb, make_model
from embnb.lab.planner.planning import records, time_end_to_end
from embnb.lab.planner.quality import quality_study
from embnb.planner.enumerator import same_options
from embnb.timing import machine_name

PEERS = ("torchrec DP", "torchrec default")
OURS = "embnb DP"
SHOWN = ["perf_rating", "plan_s", "proposer_s", "partitioner_s", "proposals", "end_to_end_s", "timed_out"]


def bench_one(num_tables: int, world_size: int, opts: argparse.Namespace) -> dict:
    """One model on one topology: both enumerators timed, then each proposer planning torchrec's
    options (`compare_proposers`' columns) and create_planner end to end."""
    model = make_model(num_tables, opts.seed)
    hbm_cap_gb = fused_table_gb(model.tables) / world_size * opts.hbm_fraction
    per_host = opts.devices_per_host
    local = per_host if per_host and per_host < world_size else None
    topology = planner.make_topology(world_size, "cuda", hbm_cap_gb=hbm_cap_gb, local_world_size=local)
    enumerated, enumerate_runs = _enumerate(model, topology, opts, "torchrec")
    ours_enumerated, ours_enumerate_runs = _enumerate(model, topology, opts, "embnb")
    alike = same_options(enumerated.options, ours_enumerated.options)
    del ours_enumerated  # the proposers plan over torchrec's options
    factories = default_proposers()
    planning = Planning(opts.batch_size, model.constraints, timeout_s=opts.timeout_s)
    # this DP plans --repeats times (it takes seconds where the peers take minutes), each peer once
    ours = compare_proposers(
        enumerated, topology, replace(planning, repeats=opts.repeats), {OURS: factories[OURS]}
    )
    peers = compare_proposers(enumerated, topology, planning, {name: factories[name] for name in PEERS})
    num_options = len(enumerated.options)
    del enumerated
    proposers = records(pd.concat([ours, peers]).drop(columns=["plan_s_min", "plan_s_max"]))
    # What a user waits for from model to plan, measured as a user calls it: create_planner(...).plan,
    # under the reservation every proposer here plans under (compare_proposers')
    end_to_end = time_end_to_end(
        model.tables,
        topology,
        opts.batch_size,
        model.constraints,
        repeats=opts.repeats,
        storage_reservation="fixed",
    )
    proposers[OURS].update(
        end_to_end_s=end_to_end.median_s,
        end_to_end_s_runs=end_to_end.seconds,
        end_to_end_rating=end_to_end.rating,
        end_to_end_same_rating_every_run=end_to_end.same_rating_every_run,
    )
    # torchrec's planner with torchrec's enumerator: its enumeration's median plus its planning
    for name in PEERS:
        proposers[name]["end_to_end_s"] = statistics.median(enumerate_runs) + proposers[name]["plan_s"]
    return {
        "num_tables": num_tables,
        "world_size": world_size,
        "local_world_size": local or world_size,
        "hosts": world_size // (local or world_size),
        "hbm_cap_gb": hbm_cap_gb,
        "num_options": num_options,
        "enumerate_s": statistics.median(enumerate_runs),
        "enumerate_s_runs": enumerate_runs,  # torchrec's
        "enumerate_embnb_s": statistics.median(ours_enumerate_runs),  # embnb's DistinctShardEnumerator
        "enumerate_embnb_s_runs": ours_enumerate_runs,
        "enumerate_same_options": alike,
        "proposers": proposers,
    }


def _enumerate(model, topology, opts: argparse.Namespace, enumerator: str) -> tuple[Enumerated, list[float]]:
    """The first of --enumerate-repeats enumerations, and each one's seconds."""
    first, seconds = None, []
    for _ in range(opts.enumerate_repeats):
        gc.collect()  # each run starts from a heap without the last run's garbage
        run = enumerate_options(
            model.tables, topology, opts.batch_size, model.constraints, enumerator=enumerator
        )
        first, seconds = run if first is None else first, [*seconds, run.seconds]
    return first, seconds


def quality(opts: argparse.Namespace) -> list[dict]:
    """Per table count and proposer (`quality_study`): the instances planned, those GridSearch
    skipped (past torchrec's MAX_PROPOSALS), the worst rating over brute force's best among those
    with a plan, the share within 2% and the instances without a plan."""
    frames = []
    for num_tables in opts.quality_tables:
        study = quality_study(opts.quality_instances, opts.seed, num_tables, opts.batch_size)
        summary = study.groupby("proposer", sort=False).ratio.agg(
            instances="count",
            skipped=lambda ratios: ratios.isna().sum(),
            worst_ratio=lambda ratios: ratios[np.isfinite(ratios)].max(),
            within_2pct=lambda ratios: (ratios.dropna() <= 1.02).mean(),
            no_plan=lambda ratios: np.isinf(ratios).sum(),
        )
        frames.append(summary.assign(num_tables=num_tables))
    return records(pd.concat(frames).reset_index(), "records")


def _print(row: dict) -> None:
    hosts = row["hosts"]
    same = "same options" if row["enumerate_same_options"] else "OPTIONS DIFFER"
    print(
        f"{row['num_tables']} tables x {row['world_size']} devices ({hosts} host{'s' * (hosts > 1)}): "
        f"{row['num_options']} options enumerated by torchrec in {spread(row['enumerate_s_runs'], 1)}, "
        f"by embnb in {spread(row['enumerate_embnb_s_runs'], 2)}, {same}"
    )
    print(pd.DataFrame(row["proposers"]).T[SHOWN].to_string(), flush=True)


def _options(argv: list[str]) -> argparse.Namespace:
    """The command line, checked."""
    parser = argparse.ArgumentParser(prog="python -m embnb.bench planner", description=__doc__.split("\n")[0])
    add, ints = parser.add_argument, {"type": int, "nargs": "+"}
    add("--tables", type=int, nargs="*", default=[50, 200, 800])
    add("--world-sizes", **ints, default=[8, 64])
    add("--hbm-fraction", type=float, default=0.5, help="HBM per device, a fraction of the tables' fp32 rows")
    add("--timeout-s", type=float, default=120, help="planning time limit per proposer")
    add("--repeats", type=int, default=5, help="plans with embnb DP per row (median and range reported)")
    add("--enumerate-repeats", type=int, default=3, help="enumerations per enumerator and row")
    add("--devices-per-host", type=int, default=None, help="torchrec's local_world_size (default: one host)")
    add("--batch-size", type=int, default=512)
    add("--seed", type=int, default=0)
    add("--quality-instances", type=int, default=50, help="random small instances per table count (0: skip)")
    add("--quality-tables", **ints, default=[3, 4], help="their table counts (brute force: 16^tables plans)")
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    for name in ("tables", "world_sizes", "quality_tables"):
        if any(v < 1 for v in getattr(opts, name)):
            parser.error(f"--{name.replace('_', '-')} must all be >= 1, got {getattr(opts, name)}")
    for name, low in (("repeats", 1), ("enumerate_repeats", 1), ("quality_instances", 0)):
        if getattr(opts, name) < low:
            parser.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(opts, name)}")
    per_host = opts.devices_per_host
    if per_host is not None and (per_host < 1 or any(w % per_host for w in opts.world_sizes if w > per_host)):
        parser.error(f"--devices-per-host must be >= 1 and divide the larger world sizes, got {per_host}")
    if not 0 < opts.hbm_fraction:
        parser.error(f"--hbm-fraction must be > 0, got {opts.hbm_fraction}")
    return opts


def main(argv: list[str]) -> int:
    opts = _options(argv)
    quiet_torchrec_logs()
    start, rows = time.perf_counter(), []
    for world_size, num_tables in itertools.product(opts.world_sizes, opts.tables):
        rows.append(bench_one(num_tables, world_size, opts))
        _print(rows[-1])
    quality_rows = []
    if opts.quality_instances:
        print(
            f"ratings over brute force's best, {opts.quality_instances} instances per table count:",
            flush=True,
        )
        quality_rows = quality(opts)
        print(pd.DataFrame(quality_rows).to_string(index=False), flush=True)
    payload = {
        "benchmark": "planner",
        "machine": machine_name(),
        **{k: v for k, v in vars(opts).items() if k != "out"},  # the command line, as run
        "storage_reservation": (
            "FixedPercentageStorageReservation(0.15) for every proposer, end to end too "
            "(create_planner(storage_reservation='fixed'))"
        ),
        "rows": rows,
        "quality_vs_brute_force": quality_rows,
        "bench_s": time.perf_counter() - start,
    }
    print(f"wrote {write_results('planner', payload, opts.out)}")
    return 0

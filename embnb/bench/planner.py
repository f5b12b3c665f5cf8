"""Planning time and plan quality at scale: `python -m embnb.bench planner`.

Plans random models (`make_model`: --tables) on GPU topologies (--world-sizes) whose HBM holds
--hbm-fraction of the tables' fp32 rows, with torchrec's EmbeddingShardingPlanner and, in turn, this
DP proposer, torchrec's DynamicProgrammingProposer and torchrec's default proposers, each under the same
time limit (checked by torchrec's planner between proposals) over torchrec's enumeration. Options are
enumerated --enumerate-repeats times by torchrec's EmbeddingEnumerator and embnb's
DistinctShardEnumerator (medians and ranges; their options checked equal). Per peer, ratios against
this DP in the same run: perf rating (slowest rank; > 1: this DP's plan is faster) and planning time
(> 1: this DP plans faster); this DP plans --repeats times (its times: the median run's, `plan_s_runs`).

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
import math
import statistics
import time

import numpy as np

from embnb import planner
from embnb.bench.results import add_out_argument, quiet_torchrec_logs, spread, write_results
from embnb.lab.planner.comparison import Planning, compare_proposers, default_proposers
from embnb.lab.planner.models import Enumerated, enumerate_options, fused_table_gb, make_model
from embnb.lab.planner.planning import run_planner, time_end_to_end
from embnb.lab.planner.quality import quality_study
from embnb.planner.enumerator import same_options
from embnb.timing import machine_name

PEERS = ("torchrec DP", "torchrec default")
OURS = "embnb DP"


def bench_one(
    num_tables: int,
    world_size: int,
    hbm_fraction: float,
    timeout_s: float,
    seed: int,
    batch_size: int,
    repeats: int = 1,
    enumerate_repeats: int = 1,
    devices_per_host: int | None = None,
) -> dict:
    model = make_model(num_tables, seed)
    hbm_cap_gb = fused_table_gb(model.tables) / world_size * hbm_fraction
    local = devices_per_host if devices_per_host and devices_per_host < world_size else None
    topology = planner.make_topology(world_size, "cuda", hbm_cap_gb=hbm_cap_gb, local_world_size=local)
    enumerated, enumerate_runs = _enumerate(model, topology, batch_size, "torchrec", enumerate_repeats)
    ours_enumerated, ours_enumerate_runs = _enumerate(model, topology, batch_size, "embnb", enumerate_repeats)
    alike = same_options(enumerated.options, ours_enumerated.options)
    del ours_enumerated  # the proposers plan over torchrec's options
    proposers = {k: v for k, v in default_proposers().items() if k in (OURS, *PEERS)}
    table = compare_proposers(
        enumerated, topology, Planning(batch_size, model.constraints, timeout_s=timeout_s), proposers
    )
    ours = table.loc[OURS]
    row = {
        "num_tables": num_tables,
        "world_size": world_size,
        "local_world_size": local or world_size,
        "hosts": world_size // (local or world_size),
        "hbm_cap_gb": hbm_cap_gb,
        "num_options": len(enumerated.options),
        "enumerate_s": statistics.median(enumerate_runs),
        "enumerate_s_runs": enumerate_runs,  # torchrec's
        "enumerate_embnb_s": statistics.median(ours_enumerate_runs),  # embnb's DistinctShardEnumerator
        "enumerate_embnb_s_runs": ours_enumerate_runs,
        "enumerate_same_options": alike,
        "proposers": {
            name: {
                "perf_rating": None if math.isnan(r.perf_rating) else float(r.perf_rating),
                "plan_s": float(r.plan_s),
                "proposer_s": float(r.proposer_s),
                "partitioner_s": float(r.partitioner_s),
                "proposals": int(r.proposals),
                "timed_out": bool(r.timed_out),
                "note": r.note,
            }
            for name, r in table.iterrows()
        },
    }
    row["enumerate_speedup"] = row["enumerate_s"] / row["enumerate_embnb_s"]
    plan_s = _repeat_ours(
        row["proposers"][OURS], repeats, proposers[OURS], enumerated, topology, batch_size, model
    )
    del enumerated
    # What a user waits for from model to plan, measured as a user calls it: create_planner(...).plan,
    # under the reservation every proposer here plans under (compare_proposers')
    end_to_end = time_end_to_end(
        model.tables, topology, batch_size, model.constraints, repeats=repeats, storage_reservation="fixed"
    )
    row["proposers"][OURS].update(
        end_to_end_s=end_to_end.median_s,
        end_to_end_s_runs=end_to_end.seconds,
        end_to_end_rating=end_to_end.rating,
        end_to_end_same_rating_every_run=end_to_end.same_rating_every_run,
    )
    for name in PEERS:
        result, entry = table.loc[name], row["proposers"][name]
        entry["rating_vs_embnb"] = (
            float(result.perf_rating / ours.perf_rating) if result.feasible and ours.feasible else None
        )
        entry["time_vs_embnb"] = float(result.plan_s / plan_s)
        # torchrec's planner with torchrec's enumerator: its enumeration's median plus its planning.
        entry["end_to_end_s"] = row["enumerate_s"] + float(result.plan_s)
        entry["end_to_end_vs_embnb"] = entry["end_to_end_s"] / row["proposers"][OURS]["end_to_end_s"]
    return row


def _enumerate(
    model, topology, batch_size: int, enumerator: str, repeats: int
) -> tuple[Enumerated, list[float]]:
    """The first of `repeats` enumerations, and each one's seconds."""
    first, seconds = None, []
    for _ in range(repeats):
        gc.collect()  # each run starts from a heap without the last run's garbage
        run = enumerate_options(model.tables, topology, batch_size, model.constraints, enumerator=enumerator)
        first, seconds = run if first is None else first, [*seconds, run.seconds]
    return first, seconds


def _repeat_ours(entry: dict, repeats: int, make_proposer, enumerated, topology, batch_size, model) -> float:
    """Plan with this DP `repeats` times in all (it takes seconds where the
    peers take minutes): the entry's times become the median run's, with
    every run's planning time beside them. Returns the median time."""
    runs = [
        run_planner(make_proposer(), enumerated, topology, batch_size, constraints=model.constraints)
        for _ in range(repeats - 1)
    ]
    times = [entry["plan_s"], *(run.seconds for run in runs)]
    ratings = [
        entry["perf_rating"],
        *(None if math.isnan(run.perf_rating) else run.perf_rating for run in runs),
    ]
    median = sorted(range(repeats), key=times.__getitem__)[(repeats - 1) // 2]
    if median:
        run = runs[median - 1]
        entry.update(plan_s=run.seconds, proposer_s=run.proposer_s, partitioner_s=run.partitioner_s)
    entry["plan_s_runs"] = times
    entry["same_rating_every_run"] = len(set(ratings)) == 1
    return entry["plan_s"]


def quality(num_instances: int, table_counts: list[int], seed: int, batch_size: int) -> list[dict]:
    rows = []
    for num_tables in table_counts:
        study = quality_study(num_instances, seed=seed, num_tables=num_tables, batch_size=batch_size)
        for name, ratios in study.groupby("proposer", sort=False).ratio:
            skipped = int(ratios.isna().sum())  # GridSearch past torchrec's MAX_PROPOSALS
            ratios = ratios.dropna()
            found = ratios[np.isfinite(ratios)]
            rows.append(
                {
                    "num_tables": num_tables,
                    "proposer": name,
                    "instances": len(ratios),
                    "skipped": skipped,
                    "worst_ratio": float(found.max()) if len(found) else None,
                    "within_2pct": float((ratios <= 1.02).mean()) if len(ratios) else None,
                    "no_plan": int(np.isinf(ratios).sum()),
                }
            )
    return rows


def _quality_line(row: dict) -> str:
    head = f"{row['num_tables']} tables, {row['proposer']:<12}"
    if not row["instances"]:
        return f"{head} skipped on all {row['skipped']} (torchrec's limit on combinations)"
    worst = "n/a" if row["worst_ratio"] is None else f"{row['worst_ratio']:.3f}x"
    return (
        f"{head} worst {worst:>8} of brute force, within 2% on {row['within_2pct']:6.1%} "
        f"of {row['instances']}, no plan on {row['no_plan']}"
    )


def _line(row: dict) -> str:
    ours = row["proposers"][OURS]
    parts = [
        f"{row['num_tables']:4d} tables x {row['world_size']:2d} devices "
        f"({row['hosts']} host{'s' * (row['hosts'] > 1)}): enumerate "
        f"{spread(row['enumerate_s_runs'], 1)} (embnb's {spread(row['enumerate_embnb_s_runs'], 2)}, "
        f"{row['enumerate_speedup']:.1f}x, "
        f"{'same options' if row['enumerate_same_options'] else 'OPTIONS DIFFER'}) "
        f"| {OURS} {_rating(ours['perf_rating'])} in {spread(ours['plan_s_runs'], 2)}"
        f"{'' if ours['same_rating_every_run'] else ', RATINGS DIFFER'}"
        f" ({_breakdown(ours)}), end to end {spread(ours['end_to_end_s_runs'], 2)}"
        f"{'' if ours['end_to_end_rating'] == ours['perf_rating'] else ' RATED OTHERWISE'}"
    ]
    for name in PEERS:
        peer = row["proposers"][name]
        ratio = peer["rating_vs_embnb"]
        parts.append(
            f"{name} {_rating(peer['perf_rating'])} ({'n/a' if ratio is None else f'{ratio:.2f}x'})"
            f" in {peer['plan_s']:6.1f} s ({_breakdown(peer)}), {peer['end_to_end_s']:.1f} s end to end"
            f"{' TIMED OUT' if peer['timed_out'] else ''}"
        )
    return " | ".join(parts)


def _breakdown(entry: dict) -> str:
    return (
        f"proposer {entry['proposer_s']:.2f} s, partitioner {entry['partitioner_s']:.2f} s, "
        f"{entry['proposals']} proposals"
    )


def _rating(value: float | None) -> str:
    return "no plan" if value is None else f"{value:9.3f} ms"


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
    for name in ("repeats", "enumerate_repeats"):
        if getattr(opts, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(opts, name)}")
    if opts.devices_per_host is not None and (
        opts.devices_per_host < 1
        or any(w % opts.devices_per_host for w in opts.world_sizes if w > opts.devices_per_host)
    ):
        parser.error(
            f"--devices-per-host must be >= 1 and divide the larger world sizes, got {opts.devices_per_host}"
        )
    if opts.quality_instances < 0:
        parser.error(f"--quality-instances must be >= 0, got {opts.quality_instances}")
    if not 0 < opts.hbm_fraction:
        parser.error(f"--hbm-fraction must be > 0, got {opts.hbm_fraction}")
    return opts


def main(argv: list[str]) -> int:
    opts = _options(argv)
    quiet_torchrec_logs()
    start, rows = time.perf_counter(), []
    for world_size, num_tables in itertools.product(opts.world_sizes, opts.tables):
        rows.append(
            bench_one(
                num_tables,
                world_size,
                opts.hbm_fraction,
                opts.timeout_s,
                opts.seed,
                opts.batch_size,
                opts.repeats,
                opts.enumerate_repeats,
                opts.devices_per_host,
            )
        )
        print(_line(rows[-1]), flush=True)
    quality_rows = []
    if opts.quality_instances:
        print(f"plan quality on {opts.quality_instances} random instances per table count:", flush=True)
        quality_rows = quality(opts.quality_instances, opts.quality_tables, opts.seed, opts.batch_size)
        for row in quality_rows:
            print(_quality_line(row), flush=True)
    payload = {
        "benchmark": "planner",
        "machine": machine_name(),
        "hbm_fraction": opts.hbm_fraction,
        "timeout_s": opts.timeout_s,
        "batch_size": opts.batch_size,
        "devices_per_host": opts.devices_per_host,
        "storage_reservation": (
            "FixedPercentageStorageReservation(0.15) for every proposer, end to end too "
            "(create_planner(storage_reservation='fixed'))"
        ),
        "seed": opts.seed,
        "rating_vs_embnb": "peer's perf rating / embnb DP's (> 1: embnb's plan is faster)",
        "time_vs_embnb": "peer's planning seconds / embnb DP's (> 1: embnb plans faster)",
        "rows": rows,
        "quality_vs_brute_force": quality_rows,
        "bench_s": time.perf_counter() - start,
    }
    print(f"wrote {write_results('planner', payload, opts.out)}")
    return 0

"""Planning time and plan quality at scale: `python -m embnb.bench planner`; and what the planner
benches share (`bounded` options, `write_rows`).

Random models (`make_model`) on GPU topologies whose HBM holds --hbm-fraction of the tables' fp32
rows: torchrec's enumeration timed beside embnb's DistinctShardEnumerator (their options checked
equal), then planned in torchrec's planner by embnb's DP (--repeats times), torchrec's DP and
torchrec's default proposers (once each) under one time limit, and by `create_planner(...).plan` end
to end as a user calls it, all under FixedPercentageStorageReservation(0.15). Plan quality: each
proposer's rating over brute force's best on random small instances (`quality_summary`).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pandas as pd

from embnb import planner
from embnb.bench.results import add_out_argument, quiet_torchrec_logs, spread, write_results
from embnb.lab.planner.comparison import (
    Planning,
    compare_proposers,
    default_proposers,
    quality_study,
    quality_summary,
)
from embnb.lab.planner.models import Enumerated, enumerate_options, fused_table_gb, make_model
from embnb.lab.planner.planning import records, time_end_to_end
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
        end_to_end_s=statistics.median(end_to_end.seconds),
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
        run = enumerate_options(model.tables, topology, opts.batch_size, model.constraints, enumerator)
        first, seconds = run if first is None else first, [*seconds, run.seconds]
    return first, seconds


def quality(opts: argparse.Namespace) -> list[dict]:
    """Per table count and proposer, `quality_summary` of a `quality_study`."""
    frames = [
        quality_summary(quality_study(opts.quality_instances, opts.seed, tables, opts.batch_size)).assign(
            num_tables=tables
        )
        for tables in opts.quality_tables
    ]
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


def bounded(kind: type, low: float, low_open: bool = False) -> Callable[[str], Any]:
    """An argparse type: the option's text as `kind` (int or float), refused below `low` (and at it
    when `low_open`) with a message naming the bound and the value."""

    def parse(text: str) -> Any:
        value = kind(text)
        if not (value > low if low_open else value >= low):  # NaN too
            raise argparse.ArgumentTypeError(f"must be {'>' if low_open else '>='} {low}, got {value}")
        return value

    parse.__name__ = kind.__name__  # argparse names it in "invalid int value: 'x'"
    return parse


def write_rows(name: str, opts: argparse.Namespace, rows: list[dict], start: float, **fields: Any) -> int:
    """Write a bench's results (`write_results`): its name, the machine, the command line as run
    (but --out), `fields`, its `rows` and its seconds since `start`; print where; exit code 0."""
    payload = {
        "benchmark": name,
        "machine": machine_name(),
        **{k: v for k, v in vars(opts).items() if k != "out"},
        **fields,
        "rows": rows,
        "bench_s": time.perf_counter() - start,
    }
    print(f"wrote {write_results(name, payload, opts.out)}")
    return 0


def _options(argv: list[str]) -> argparse.Namespace:
    """The command line, checked."""
    parser = argparse.ArgumentParser(prog="python -m embnb.bench planner", description=__doc__.split("\n")[0])
    add, count, counts = parser.add_argument, bounded(int, 1), {"type": bounded(int, 1), "nargs": "+"}
    add("--tables", type=count, nargs="*", default=[50, 200, 800])
    add("--world-sizes", **counts, default=[8, 64])
    share = bounded(float, 0, low_open=True)
    add("--hbm-fraction", type=share, default=0.5, help="HBM per device / the tables' fp32 rows per device")
    add("--timeout-s", type=float, default=120, help="planning time limit per proposer")
    add("--repeats", type=count, default=5, help="plans with embnb DP per row (median and range reported)")
    add("--enumerate-repeats", type=count, default=3, help="enumerations per enumerator and row")
    add(
        "--devices-per-host", type=count, default=None, help="torchrec's local_world_size (default: one host)"
    )
    add("--batch-size", type=int, default=512)
    add("--seed", type=int, default=0)
    instances = bounded(int, 0)
    add("--quality-instances", type=instances, default=50, help="small instances per table count (0: skip)")
    add("--quality-tables", **counts, default=[3, 4], help="their table counts (16^tables plans each)")
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    per_host = opts.devices_per_host
    if per_host is not None and any(w % per_host for w in opts.world_sizes if w > per_host):
        parser.error(f"--devices-per-host must divide the larger world sizes, got {per_host}")
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
    reservation = "FixedPercentageStorageReservation(0.15) for every proposer, end to end too"
    return write_rows(
        "planner",
        opts,
        rows,
        start,
        storage_reservation=f"{reservation} (create_planner(storage_reservation='fixed'))",
        quality_vs_brute_force=quality_rows,
    )

"""What each piece of embnb's DP proposer buys, on the planner bench's
models: `python -m embnb.bench ablation`.

For each model (`embnb.planner.make_model`, random tables) on a GPU topology
whose HBM holds `--hbm-fraction` of the tables' fp32 rows spread evenly,
the rungs of `embnb.planner.LADDER` plan torchrec's enumerated options in
torchrec's planner, each `--repeats` times: the rating, the plans
considered, the proposals torchrec's partitioner placed, and planning
seconds (median and range; the enumeration, shared, is reported apart).

    python -m embnb.bench ablation [--tables 50 200] [--world-sizes 8]
        [--hbm-fraction 0.5] [--repeats 3] [--timeout-s 120] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import time

from embnb import planner
from embnb.bench.results import add_out_argument, quiet_torchrec_logs, write_results
from embnb.lab.planner.ablation import LADDER, ablation_table
from embnb.lab.planner.comparison import Planning
from embnb.lab.planner.models import enumerate_options, fused_table_gb, make_model
from embnb.lab.planner.planning import records
from embnb.timing import machine_name


def ablate(num_tables: int, world_size: int, opts: argparse.Namespace) -> dict:
    model = make_model(num_tables, seed=0)
    hbm_cap_gb = fused_table_gb(model.tables) / world_size * opts.hbm_fraction
    topology = planner.make_topology(world_size, "cuda", hbm_cap_gb=hbm_cap_gb)
    enumerated = enumerate_options(model.tables, topology, 512, model.constraints)
    planning = Planning(512, model.constraints, timeout_s=opts.timeout_s, repeats=opts.repeats)
    table = ablation_table(enumerated, topology, planning)
    print(f"{num_tables} tables x {world_size} devices ({hbm_cap_gb:.3g} GiB HBM each):\n{table}", flush=True)
    return {
        "num_tables": num_tables,
        "world_size": world_size,
        "hbm_cap_gb": hbm_cap_gb,
        "enumerate_s": enumerated.seconds,
        "rungs": records(table),  # by rung; a rating of None: no plan
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench ablation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--tables", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8])
    parser.add_argument(
        "--hbm-fraction", type=float, default=0.5, help="HBM per device / fp32 rows per device"
    )
    parser.add_argument("--repeats", type=int, default=3, help="planning runs per rung (median and range)")
    parser.add_argument("--timeout-s", type=float, default=120, help="planning time limit per run")
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    for name, values in (("--tables", opts.tables), ("--world-sizes", opts.world_sizes)):
        if any(v < 1 for v in values):
            parser.error(f"{name} must all be >= 1, got {values}")
    if opts.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {opts.repeats}")
    if not opts.hbm_fraction > 0 or not opts.timeout_s > 0:
        parser.error(f"--hbm-fraction and --timeout-s must be > 0, got {opts.hbm_fraction}, {opts.timeout_s}")
    quiet_torchrec_logs()
    start, rows = time.perf_counter(), []
    for world_size, num_tables in itertools.product(opts.world_sizes, opts.tables):
        rows.append(ablate(num_tables, world_size, opts))
    payload = {
        "benchmark": "ablation",
        "machine": machine_name(),
        **{k: v for k, v in vars(opts).items() if k != "out"},  # the command line, as run
        "ladder": {rung: dict(arguments) for rung, arguments in LADDER.items()},
        "rows": rows,
        "bench_s": time.perf_counter() - start,
    }
    print(f"wrote {write_results('ablation', payload, opts.out)}")
    return 0

"""What each piece of embnb's DP proposer buys, on the planner bench's models: `python -m embnb.bench
ablation`. Each rung of `embnb.lab.planner.comparison.LADDER` plans torchrec's enumerated options of a
random model (`make_model`) in torchrec's planner, --repeats times (`ablation_table`), on a GPU
topology whose HBM holds --hbm-fraction of the tables' fp32 rows; the shared enumeration apart.
"""

from __future__ import annotations

import argparse
import itertools
import time

from embnb import planner
from embnb.bench.planner import bounded, write_rows
from embnb.bench.results import add_out_argument, quiet_torchrec_logs
from embnb.lab.planner.comparison import LADDER, Planning, ablation_table
from embnb.lab.planner.models import enumerate_options, fused_table_gb, make_model
from embnb.lab.planner.planning import records


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
    add, counts, positive = (
        parser.add_argument,
        {"type": bounded(int, 1), "nargs": "+"},
        bounded(float, 0, True),
    )
    add("--tables", **counts, default=[50, 200])
    add("--world-sizes", **counts, default=[8])
    add(
        "--hbm-fraction", type=positive, default=0.5, help="HBM per device / the tables' fp32 rows per device"
    )
    add("--repeats", type=bounded(int, 1), default=3, help="planning runs per rung (median and range)")
    add("--timeout-s", type=positive, default=120, help="planning time limit per run")
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    quiet_torchrec_logs()
    start, rows = time.perf_counter(), []
    for world_size, num_tables in itertools.product(opts.world_sizes, opts.tables):
        rows.append(ablate(num_tables, world_size, opts))
    ladder = {rung: dict(arguments) for rung, arguments in LADDER.items()}
    return write_rows("ablation", opts, rows, start, ladder=ladder)

"""From the model to the plan in a fresh process: `python -m embnb.bench end_to_end`.

A training script plans once, in a process that has only imported its
libraries and built its model. This bench times exactly that:
`--processes` new Python processes per case, each building the planner
bench's model (`make_model(tables, seed=0)`, HBM for half its fp32 rows)
and timing one `create_planner(topology, 512, constraints=...).plan(module,
sharders)` (imports timed apart). Beside it, the same call repeated in this
process after those runs (`embnb.planner.study.time_end_to_end`, the garbage
of the run before collected first), as the planner bench measures it.

    python -m embnb.bench end_to_end [--cases 200x8 800x64] [--processes 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from embnb import planner
from embnb.bench.timing import add_out_argument, quiet_torchrec_logs, spread, write_results
from embnb.planner.models import fused_table_gb, make_model
from embnb.planner.study import time_end_to_end
from embnb.timing import machine_name

BATCH_SIZE = 512
HBM_FRACTION = 0.5  # as the planner bench's default

# One plan in a new process; prints {"import_s", "plan_s", "rating"} as JSON.
_ONE_PLAN = """
import json, logging, sys, time
start = time.perf_counter()
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from embnb import planner
from embnb.planner.models import fused_table_gb, make_model
import_s = time.perf_counter() - start
logging.getLogger("torchrec").setLevel(logging.ERROR)
logging.getLogger().setLevel(logging.ERROR)
num_tables, world_size, batch_size = (int(arg) for arg in sys.argv[1:4])
hbm_fraction = float(sys.argv[4])
model = make_model(num_tables, seed=0)
topology = planner.make_topology(
    world_size, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / world_size * hbm_fraction
)
module = EmbeddingBagCollection(tables=model.tables, device=torch.device("meta"))
chosen = planner.create_planner(topology, batch_size, constraints=model.constraints)
start = time.perf_counter()
chosen.plan(module, [EmbeddingBagCollectionSharder()])
plan_s = time.perf_counter() - start
print(json.dumps({"import_s": import_s, "plan_s": plan_s, "rating": chosen._proposers[0].best_rating}))
"""


def _case(text: str) -> tuple[int, int]:
    """'800x64' -> (800, 64)."""
    try:
        tables, devices = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a case is TABLESxDEVICES, e.g. 800x64; got {text!r}") from None
    if tables < 1 or devices < 1:
        raise argparse.ArgumentTypeError(f"tables and devices must be >= 1, got {text!r}")
    return tables, devices


def bench_case(num_tables: int, world_size: int, processes: int) -> dict:
    fresh = []
    for _ in range(processes):
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _ONE_PLAN,
                str(num_tables),
                str(world_size),
                str(BATCH_SIZE),
                str(HBM_FRACTION),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode:
            raise RuntimeError(f"the planning process failed ({done.returncode}): {done.stderr[-2000:]}")
        fresh.append(json.loads(done.stdout.strip().splitlines()[-1]))
    model = make_model(num_tables, seed=0)
    topology = planner.make_topology(
        world_size, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / world_size * HBM_FRACTION
    )
    warm = time_end_to_end(model.tables, topology, BATCH_SIZE, model.constraints, repeats=processes)
    plan_runs = [run["plan_s"] for run in fresh]
    return {
        "num_tables": num_tables,
        "world_size": world_size,
        "fresh_process_s": statistics.median(plan_runs),
        "fresh_process_s_runs": plan_runs,
        "import_s_runs": [run["import_s"] for run in fresh],
        "fresh_ratings": [run["rating"] for run in fresh],
        "in_process_s": warm.median_s,
        "in_process_s_runs": warm.seconds,
        "in_process_rating": warm.rating,
        "same_rating_everywhere": len({*(run["rating"] for run in fresh), warm.rating}) == 1,
    }


def _line(row: dict) -> str:
    return (
        f"{row['num_tables']:4d} tables x {row['world_size']:2d} devices: one plan in a fresh process "
        f"{spread(row['fresh_process_s_runs'], 2)} (imports {spread(row['import_s_runs'], 2)}), "
        f"repeated in this process {spread(row['in_process_s_runs'], 2)}, "
        f"rating {row['in_process_rating']:.3f} ms"
        f"{'' if row['same_rating_everywhere'] else ', RATINGS DIFFER'}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench end_to_end", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--cases", type=_case, nargs="+", default=[(200, 8), (800, 64)], help="TABLESxDEVICES"
    )
    parser.add_argument(
        "--processes", type=int, default=5, help="fresh processes per case (and runs in this one)"
    )
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    if opts.processes < 1:
        parser.error(f"--processes must be >= 1, got {opts.processes}")
    quiet_torchrec_logs()
    start, rows = time.perf_counter(), []
    for num_tables, world_size in opts.cases:
        rows.append(bench_case(num_tables, world_size, opts.processes))
        print(_line(rows[-1]), flush=True)
    payload = {
        "benchmark": "end_to_end",
        "machine": machine_name(),
        "batch_size": BATCH_SIZE,
        "hbm_fraction": HBM_FRACTION,
        "processes": opts.processes,
        "rows": rows,
        "bench_s": time.perf_counter() - start,
    }
    print(f"wrote {write_results('end_to_end', payload, opts.out)}")
    return 0

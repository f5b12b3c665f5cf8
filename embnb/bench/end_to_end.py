"""From the model to the plan in a fresh process: `python -m embnb.bench end_to_end`.

A training script plans once, in a process that has only imported its libraries and built its model.
Per case: `--processes` new Python processes, each building the planner bench's model and timing one
`create_planner(topology, 512, constraints=...).plan(module, sharders)` (imports timed apart; peak RSS
beside it); the same call repeated in this process (`time_end_to_end`); and, in one more fresh
process, torchrec's EmbeddingShardingPlanner with its DynamicProgrammingProposer and enumerator, cut
at `--torchrec-dp-timeout-s` between proposals (its enumeration is not cut: it is stopped
`ENUMERATION_GRACE_S` past the limit, or once its resident memory passes `--torchrec-dp-memory-gib`).

A case is TABLESxDEVICES[/PER_HOST][:RESERVATION][@HBM] (`_case`). On 1,024 devices half the rows in
HBM leave no plan (docs/planner.md, "No plan at 1,024 devices"): that case holds all its rows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import pandas as pd

from embnb import planner
from embnb.bench.planner import bounded, write_rows
from embnb.bench.results import add_out_argument, quiet_torchrec_logs
from embnb.lab.planner.models import fused_table_gb, make_model
from embnb.lab.planner.planning import time_end_to_end

BATCH_SIZE = 512
ENUMERATION_GRACE_S = 300  # torchrec's planner past its limit (its enumeration) before it is stopped
HBM_FRACTION = 0.5  # as the planner bench's default, where a case names none
MEMORY_POLL_S = 0.5  # how often torchrec's planner's resident memory is read
SHOWN = ["num_tables", "world_size", "hosts", "fresh_process_s", "in_process_s", "in_process_rating"]
SHOWN += ["same_rating_everywhere", "torchrec_dp.plan_s", "torchrec_dp.rating", "torchrec_dp.timed_out"]
SHOWN += ["torchrec_dp.stopped_after_s", "torchrec_dp.stopped_for_memory_gib"]  # printed per case
# "heuristical" also reserves dense parameters and KJTs, which leaves the largest models no plan
RESERVATIONS = {
    "heuristical": "torchrec's default, HeuristicalStorageReservation(0.15), for both",
    "fixed": "FixedPercentageStorageReservation(0.15), for both",
}
_CASE = re.compile(rf"(\d+)x(\d+)(?:/(\d+))?(?::({'|'.join(RESERVATIONS)}))?(?:@(\d*\.?\d+))?")  # see _case

# One plan in a new process, by embnb's create_planner or (a timeout given) torchrec's planner with its
# DP proposer; prints {"import_s", "plan_s", "rating", "proposals", "timed_out", "peak_rss_gib"} as JSON.
_ONE_PLAN = """
import json, logging, math, resource, sys, time, warnings
start = time.perf_counter()
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.proposers import DynamicProgrammingProposer
from torchrec.distributed.planner.types import PlannerError
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from embnb import planner
from embnb._torchrec_private import best_plan, num_proposals
from embnb.planner.factory import make_reservation
from embnb.lab.planner.models import fused_table_gb, make_model
import_s = time.perf_counter() - start
logging.getLogger("torchrec").setLevel(logging.ERROR)
logging.getLogger().setLevel(logging.ERROR)
warnings.simplefilter("ignore", FutureWarning)  # HeuristicalStorageReservation's, on every planner
num_tables, world_size, per_host, batch_size = (int(arg) for arg in sys.argv[1:5])
hbm_fraction, timeout_s, reservation = float(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
model = make_model(num_tables, seed=0)
topology = planner.make_topology(
    world_size, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / world_size * hbm_fraction,
    local_world_size=per_host or None,
)
module = EmbeddingBagCollection(tables=model.tables, device=torch.device("meta"))
if timeout_s:  # torchrec's planner, its DP proposer and enumerator
    chosen = EmbeddingShardingPlanner(
        topology=topology, batch_size=batch_size, constraints=model.constraints, debug=False,
        proposer=[DynamicProgrammingProposer(hbm_bins_per_device=100)],
        storage_reservation=make_reservation(reservation), timeout_seconds=max(1, math.ceil(timeout_s)),
    )
else:
    chosen = planner.create_planner(
        topology, batch_size, constraints=model.constraints, storage_reservation=reservation
    )
start = time.perf_counter()
try:
    chosen.plan(module, [EmbeddingBagCollectionSharder()])
except PlannerError:
    pass
plan_s = time.perf_counter() - start
best = best_plan(chosen)
rating = NoopPerfModel(topology).rate(best) if best else math.inf
print(json.dumps({
    "import_s": import_s, "plan_s": plan_s, "rating": rating, "proposals": num_proposals(chosen),
    "timed_out": bool(timeout_s) and plan_s >= math.ceil(timeout_s),
    "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
}))
"""


def _case(text: str) -> tuple[int, int, int | None, str | None, float]:
    """'800x64' -> (800, 64, None, None, HBM_FRACTION): one host; '800x64/8' -> (800, 64, 8, None,
    HBM_FRACTION): hosts of 8 devices; '800x64/8:fixed' -> (800, 64, 8, 'fixed', HBM_FRACTION): under
    that reservation; '800x64/8:fixed@1' -> (800, 64, 8, 'fixed', 1.0): HBM for all the rows."""
    match = _CASE.fullmatch(text.lower())
    tables, devices, per_host, reservation, hbm = match.groups() if match else [None] * 5
    hbm_fraction = HBM_FRACTION if hbm is None else float(hbm)
    if match is None or min(int(tables), int(devices), int(per_host or 1)) < 1 or not hbm_fraction > 0:
        raise argparse.ArgumentTypeError(
            f"a case is TABLESxDEVICES[/PER_HOST][:heuristical|:fixed][@HBM] with each count >= 1 and "
            f"HBM > 0, e.g. 800x64 or 800x64/8:fixed@1; got {text!r}"
        )
    if per_host and int(devices) % int(per_host):
        raise argparse.ArgumentTypeError(f"PER_HOST must divide the devices, got {text!r}")
    return int(tables), int(devices), int(per_host) if per_host else None, reservation, hbm_fraction


def _plan_in_a_new_process(
    shape: list, reservation: str, timeout_s: float = 0, memory_gib: float = math.inf
) -> dict:
    """One plan in a fresh process of `shape` (tables, devices, devices per host or 0, batch size,
    HBM fraction): torchrec's DP when `timeout_s`, else create_planner. torchrec's DP is stopped
    once its resident memory passes `memory_gib` (its enumerator keeps a deep copy of every option,
    one Shard per device each for row-wise and data-parallel ones)."""
    args = [*shape, timeout_s, reservation]
    limit_s = timeout_s + ENUMERATION_GRACE_S if timeout_s else 3600
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # no pipe to fill
        process = subprocess.Popen([sys.executable, "-c", _ONE_PLAN, *map(str, args)], stdout=out, stderr=err)
        start, stopped = time.perf_counter(), None
        while process.poll() is None:
            elapsed = time.perf_counter() - start
            if elapsed >= limit_s:
                stopped = {"stopped_after_s": limit_s}
            elif timeout_s and _rss_gib(process.pid) > memory_gib:
                stopped = {"stopped_after_s": elapsed, "stopped_for_memory_gib": memory_gib}
            if stopped is not None:
                process.kill()
                process.wait()
                break
            time.sleep(MEMORY_POLL_S)
        output, errors = (out.seek(0), out.read())[1], (err.seek(0), err.read())[1]
    if stopped is not None:
        if not timeout_s:
            raise RuntimeError(f"create_planner ran past {limit_s} s")
        return {
            "plan_s": stopped["stopped_after_s"],
            "rating": math.inf,
            "timed_out": "stopped_for_memory_gib" not in stopped,  # a memory stop is no time-out
            **dict.fromkeys(["proposals", "import_s", "peak_rss_gib"]),  # not measured: stopped
            **stopped,
        }
    if process.returncode:
        raise RuntimeError(f"the planning process failed ({process.returncode}): {errors[-2000:]}")
    return json.loads(output.strip().splitlines()[-1])


def _rss_gib(pid: int) -> float:
    """A running process's resident memory (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0


def bench_case(case: tuple, opts: argparse.Namespace) -> dict:
    """One case (`_case`'s tuple; no reservation: --storage-reservation): create_planner in
    --processes fresh processes and as often here, and torchrec's DP in one more fresh process."""
    num_tables, world_size, local, reservation, hbm_fraction = case
    reservation = reservation or opts.storage_reservation
    shape = [num_tables, world_size, local or 0, BATCH_SIZE, hbm_fraction]
    fresh = [_plan_in_a_new_process(shape, reservation) for _ in range(opts.processes)]
    model = make_model(num_tables, seed=0)
    hbm_cap_gb = fused_table_gb(model.tables) / world_size * hbm_fraction
    topology = planner.make_topology(world_size, "cuda", hbm_cap_gb=hbm_cap_gb, local_world_size=local)
    warm = time_end_to_end(
        model.tables,
        topology,
        BATCH_SIZE,
        model.constraints,
        repeats=opts.processes,
        storage_reservation=reservation,
    )
    plan_runs, hosts = [run["plan_s"] for run in fresh], world_size // (local or world_size)
    peer = opts.torchrec_dp_timeout_s and _plan_in_a_new_process(
        shape, reservation, opts.torchrec_dp_timeout_s, opts.torchrec_dp_memory_gib
    )
    return {
        "num_tables": num_tables,
        "world_size": world_size,
        "local_world_size": local or world_size,
        "hosts": f"{hosts} host{'s' * (hosts > 1)} of {local or world_size}",
        "storage_reservation": RESERVATIONS[reservation],
        "hbm_fraction": hbm_fraction,
        "fresh_process_s": statistics.median(plan_runs),
        "fresh_process_s_runs": plan_runs,
        "import_s_runs": [run["import_s"] for run in fresh],
        "fresh_ratings": [run["rating"] for run in fresh],
        "fresh_proposals": [run["proposals"] for run in fresh],
        "fresh_peak_rss_gib_runs": [run["peak_rss_gib"] for run in fresh],
        "in_process_s": statistics.median(warm.seconds),
        "in_process_s_runs": warm.seconds,
        "in_process_rating": warm.rating,
        "same_rating_everywhere": len({*(run["rating"] for run in fresh), warm.rating}) == 1,
        "torchrec_dp": peer or None,  # torchrec's planner, DP proposer and enumerator, in a fresh process
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench end_to_end", description=__doc__.split("\n")[0]
    )
    half = HBM_FRACTION
    parser.add_argument(
        "--cases",
        type=_case,
        nargs="+",
        default=[
            (200, 8, None, None, half),
            (800, 64, None, None, half),
            (800, 64, 8, None, half),
            (5000, 128, 8, "fixed", half),
            (1000, 512, 8, "fixed", half),  # torchrec's KJT reservation: no plan
            (5000, 512, 8, "fixed", half),  # 64 hosts
            (5000, 1024, 8, "fixed", 1.0),  # 128 hosts: half the rows in HBM leaves no plan
        ],
        help="TABLESxDEVICES or TABLESxDEVICES/PER_HOST, then :heuristical or :fixed, then @HBM (the "
        f"fraction of the tables' fp32 rows each device's HBM holds, spread evenly; default {half})",
    )
    add = parser.add_argument
    timeout_help = "torchrec's planner with its DP proposer beside each case, cut here (0: skip)"
    add("--torchrec-dp-timeout-s", type=bounded(float, 0), default=300, help=timeout_help)
    memory_help = "torchrec's planner is stopped once its resident memory passes this"
    add("--torchrec-dp-memory-gib", type=bounded(float, 0, low_open=True), default=8, help=memory_help)
    reservation_help = "what both planners reserve where a case names none"
    add("--storage-reservation", choices=list(RESERVATIONS), default="heuristical", help=reservation_help)
    add("--processes", type=bounded(int, 1), default=5, help="fresh processes per case (and runs here)")
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    quiet_torchrec_logs()
    start, rows = time.perf_counter(), []
    for case in opts.cases:
        rows.append(bench_case(case, opts))
        print(pd.json_normalize(rows[-1]).reindex(columns=SHOWN).to_string(index=False), flush=True)
    fields = {"batch_size": BATCH_SIZE, "hbm_fraction": HBM_FRACTION}
    return write_rows(
        "end_to_end", opts, rows, start, **fields, storage_reservation=RESERVATIONS[opts.storage_reservation]
    )

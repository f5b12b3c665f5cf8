"""`python -m embnb.bench routing`: notebook 01's routings at scale (issue #70, item 5): does the busiest
rank's time follow its ids, its distinct rows, or neither?

One row-wise table of --rows rows of --dim fp32 columns (default on a GPU 20 M x 128, 9.5 GiB; on a CPU
2**20 rows) over W = --world-size ranks, replayed one rank after another on one device with FBGEMM's
fused forward and backward, as appendix 01a's section 7 does on a CPU (`embnb.lab.rowwise.routed_loads`:
its id streams, routings and layouts); no collective runs. Per (stream, routing), first issue #70's
acceptance check (`embnb.scaling`) on the busiest rank (the most ids at the sweep's largest batch) at
--batch-size x each of --sweep-factors bags of --bag-size ids: fixed + per-byte x the bytes of table rows
it reads (`RankWork.bytes_read`), its GB/s beside the copy bandwidth measured in the same run. A case
with no batch whose fixed share is at most --max-fixed-share says "overhead-bound: not compared" and
measures no ranks. Else, at the chosen batch, every rank's lookups in --repeats interleaved rounds after
one warm-up (CUDA events on a GPU; the thread's CPU time at one thread on a CPU), with each rank's ids
and distinct rows, and the answer (`follows`).

--deadline-s starts no case after that many seconds (`cut_by_deadline`). The results,
routing-DATE-MACHINE.json with a one-line `summary`, are written after each case, so a run cut from
outside keeps what it measured.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
from typing import Any

import torch

from embnb.bench.results import (
    add_out_argument,
    add_sweep_options,
    check_sweep_options,
    sweep_text,
    tbe_device,
    write_results,
)
from embnb.lab.rowwise.routed_loads import CASES, ROUTINGS, TABLE, case_ids, layout_batch
from embnb.rowwise import TableLayout
from embnb.scaling import copy_bandwidth, measure_scaling, sweep_batches, sweep_clock
from embnb.steptime import GlobalBatch
from embnb.steptime.kernels import DEFAULT_OPTIMIZER
from embnb.steptime.measure import StepOptions, lookup_steps
from embnb.steptime.work import RankWork, routing_work
from embnb.timing import interleaved_phases, machine_name

__all__ = ["FOLLOWS", "pearson", "follows", "main"]

ROWS = {"cuda": 20_000_000, "cpu": 1 << 20}  # --rows' default per device type
FOLLOWS = 0.8  # r**2 from which a quantity explains the ranks' time (`follows`)


def pearson(x: list[float], y: list[float]) -> float | None:
    """Pearson's r of two sequences of one length (`statistics.correlation`); None where either is
    constant (no correlation is defined)."""
    if len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return statistics.correlation(x, y)


def follows(seconds: list[float], ids: list[int], distinct_rows: list[int]) -> dict[str, Any]:
    """One case's answer from its ranks' median seconds, ids and distinct rows (one value per rank each):
    Pearson's r of the time with each (None where either side is constant), and which explains it. A
    quantity does where r > 0 and r**2 >= FOLLOWS; none: "neither"; one: it ("ids" or "distinct rows");
    both: the one whose unexplained share 1 - r**2 is at most half the other's, else "not told apart"
    (the ranks' ids and distinct rows rise together, so these ranks cannot separate them)."""
    r = {"ids": pearson(seconds, ids), "distinct rows": pearson(seconds, distinct_rows)}
    unexplained = {k: 1 - v**2 for k, v in r.items() if v is not None and v > 0 and v**2 >= FOLLOWS}
    answer = "neither" if not unexplained else next(iter(unexplained))
    if len(unexplained) == 2:
        (first, low), (_, high) = sorted(unexplained.items(), key=lambda item: item[1])
        answer = first if low <= high / 2 and low < high else "not told apart"
    return {"pearson_time_ids": r["ids"], "pearson_time_distinct_rows": r["distinct rows"], "follows": answer}


def rank_work(batch: GlobalBatch, layout: TableLayout, dim: int, rank: int) -> RankWork:
    """Rank `rank`'s lookups of a `layout_batch`: torchrec's contiguous blocks over the layout's storage
    rows, so each rank looks up the local rows the routed sharder's input distribution sends it."""
    rows, block = {TABLE: layout.storage_rows}, {TABLE: layout.block_size}
    return routing_work(batch, "continuous", rows, {TABLE: dim}, rank, block)


def measure_case(stream: str, routing: str, opts: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    """One (stream, routing): the acceptance check, then every rank at the chosen batch (module
    docstring), or no ranks where it is overhead-bound."""
    w, device = opts.world_size, opts.device
    layout = TableLayout(opts.rows, w, routing)
    batches = {}
    for b in sweep_batches(opts.batch_size, opts.sweep_factors):
        ids = case_ids(stream, w * b * opts.bag_size, opts.rows, opts.stride, opts.zipf_alpha, seed=0)
        batches[b] = layout_batch(ids, layout, opts.bag_size)
    slots = torch.cat([ids[0] for ids in batches[max(batches)].ids])
    busiest = int(torch.bincount(slots // layout.block_size, minlength=w).argmax())
    works = [rank_work(batch, layout, opts.dim, busiest) for batch in batches.values()]
    steps = dict(zip(batches, lookup_steps(works, StepOptions(device=device))))
    bytes_read = [work.bytes_read for work in works]
    check = measure_scaling(steps, bytes_read, "bytes", opts.repeats, device, opts.max_fixed_share, bandwidth)
    case = {"stream": stream, "routing": routing, "busiest_rank": busiest}
    case |= {"acceptance": check.as_dict() | {"num_ids": [work.num_ids for work in works]}}
    case |= {"chosen_batch": check.chosen_batch, "verdict": check.verdict, "ranks": []}
    print(f"{stream:>9} {routing:<18} rank {busiest}: {sweep_text(case['acceptance'])}", flush=True)
    if check.chosen_batch is None:
        return case
    del steps  # the sweep's TBE: free before every rank's is built
    works = [rank_work(batches[check.chosen_batch], layout, opts.dim, r) for r in range(w)]
    calls = {str(r): lookup_steps([work], StepOptions(device=device))[0] for r, work in enumerate(works)}
    times, _ = interleaved_phases(calls, opts.repeats, 1, device, threads=torch.get_num_threads())
    for work in works:
        seconds = [t.value(sweep_clock(device)) for t in times[str(work.rank)]]
        distinct = int(work.groups[0].ids.unique().numel())
        case["ranks"].append(
            {"rank": work.rank, "ids": work.num_ids, "distinct_rows": distinct, "bytes_read": work.bytes_read}
            | {"seconds": seconds, "median_s": statistics.median(seconds)}
        )
    columns = [[rank[key] for rank in case["ranks"]] for key in ("median_s", "ids", "distinct_rows")]
    case |= follows(*columns) | {"slowest_rank": columns[0].index(max(columns[0]))}
    r = ", ".join(
        "-" if v is None else f"{v:.2f}"
        for v in (case["pearson_time_ids"], case["pearson_time_distinct_rows"])
    )
    print(f"{'':>28} at {check.chosen_batch}: {case['follows']} (r with ids, distinct rows: {r})", flush=True)
    return case


def _summary(opts: argparse.Namespace, cases: list[dict[str, Any]]) -> str:
    gib = opts.rows * opts.dim * 4 / 2**30
    said = "".join(f"; {c['stream']}/{c['routing']}: {c.get('follows', 'overhead-bound')}" for c in cases)
    return f"{opts.rows:,} rows x {opts.dim} fp32 ({gib:.1f} GiB), W = {opts.world_size}{said}"


def _options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench routing", description=__doc__.splitlines()[0]
    )
    add = parser.add_argument
    add("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    add("--rows", type=int, default=None, help=f"the table's rows (default {ROWS})")
    add("--dim", type=int, default=128, help="the table's columns (fp32)")
    add("--world-size", type=int, default=8, help="W: ranks replayed one after another")
    add("--streams", nargs="+", choices=CASES, default=list(CASES))
    add("--routings", nargs="+", choices=ROUTINGS, default=list(ROUTINGS))
    add("--zipf-alpha", type=float, default=1.05, help="the frequency stream's Zipf exponent")
    add("--stride", type=int, default=8, help="the strided stream's stride")
    add("--bag-size", type=int, default=16, help="ids per bag")
    add("--batch-size", type=int, default=2048, help="bags per rank: the sweep's base batch")
    add("--repeats", type=int, default=3, help="interleaved rounds, after one warm-up")
    add("--deadline-s", type=float, default=600.0, help="start no case after this")
    add_sweep_options(parser, "--batch-size", "bytes")
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    check_sweep_options(parser, opts)
    for name, value in vars(opts).items():  # every count at least 1
        if type(value) is int and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if opts.world_size < 2 or opts.zipf_alpha <= 0 or opts.deadline_s <= 0:
        got = f"{opts.world_size}, {opts.zipf_alpha} and {opts.deadline_s}"
        parser.error(f"--world-size must be >= 2, --zipf-alpha and --deadline-s > 0; got {got}")
    try:
        opts.device = tbe_device(opts.device)
    except ValueError as error:
        parser.error(str(error))
    opts.rows = opts.rows or ROWS[opts.device]
    if not opts.world_size <= opts.rows or opts.stride > opts.rows:
        parser.error(f"--rows must be >= --world-size and --stride, got {opts.rows}")
    return opts


def main(argv: list[str]) -> int:
    opts = _options(argv)
    threads = torch.get_num_threads()
    if opts.device == "cpu":
        torch.set_num_threads(1)  # the CPU clock is the thread's: one intra-op thread
    started, cases, cut = time.perf_counter(), [], []

    def write() -> pathlib.Path:
        payload = {
            "device": opts.device,
            "machine": machine_name(opts.device),
            "summary": _summary(opts, cases),
            "options": {k: v for k, v in vars(opts).items() if k != "out"},
            "seed": 0,
            "clock": sweep_clock(opts.device),
            "threads": torch.get_num_threads(),
            "optimizer": DEFAULT_OPTIMIZER,
            "copy_bandwidth_bytes_per_s": bandwidth,
            "cases": cases,
            "cut_by_deadline": cut,
            "seconds": time.perf_counter() - started,
        }
        return write_results("routing", payload, opts.out)

    try:
        bandwidth = copy_bandwidth(opts.device)
        print(f"{_summary(opts, [])}, copy bandwidth {bandwidth / 1e9:.3g} GB/s", flush=True)
        for stream in opts.streams:
            for routing in opts.routings:
                if time.perf_counter() - started > opts.deadline_s:
                    cut.append({"stream": stream, "routing": routing})
                    continue
                cases.append(measure_case(stream, routing, opts, bandwidth))
                write()
        print(f"wrote {write()}: {_summary(opts, cases)}")
    finally:
        torch.set_num_threads(threads)
    return 0

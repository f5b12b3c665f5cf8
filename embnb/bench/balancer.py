"""`python -m embnb.bench balancer`: KK speed and balance, and overlapped training.

1. Partitioning: time and gap to max(mean, largest item) of our Python and native KK, KK + swaps,
   LPT and PyPI `numberpartitioning`'s karmarkar_karp and greedy on Zipf(1.5) lengths; speed-ups
   are ratios to numberpartitioning.karmarkar_karp on the same input in the same run.
2. GIL: the main thread's Python speed while KK runs in a thread (native releases the GIL).
3. Training on real ranks: every mode and design (`bench_training`), interleaved repeats.
4. Exchanges: all-gather vs all-to-all on real ranks, and the bytes a rank receives up to 64 ranks.
5. Rank by rank (appendix 04a's `embnb.lab.balancing.measured`), only at the W where issue #70's
   acceptance check (`acceptance`) passes for every distribution, else "overhead-bound: not compared".

Parts 1 and 2 run on the CPU whatever --device says. Writes benchmarks/results/balancer-DATE-MACHINE.json
after each part: a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numberpartitioning
import pandas as pd
import torch

from embnb.balancing import partition as balancer
from embnb.balancing.kjt_alltoall import compare_exchanges
from embnb.balancing.lengths import LengthDistribution
from embnb.balancing.training import TrainConfig, timed_steps
from embnb.balancing.workloads import imbalance
from embnb.bench.hstu import check_options, critical_rank_check
from embnb.bench.results import (
    add_out_argument,
    add_sweep_options,
    quiet_torchrec_logs,
    sweep_text,
    write_results,
)
from embnb.cuda import loader
from embnb.data import zipf_lengths
from embnb.dist import device_plan, launch
from embnb.lab.balancing import measured
from embnb.lab.balancing.experiment import exchange_bytes_by_world_size, exchange_records, run_training
from embnb.scaling import (
    NOT_COMPARED,
    TRAINING_FLOPS_PER_FORWARD,
    sweep_batches,
    sweep_clock,
)
from embnb.steptime.kernels import SequenceDense
from embnb.timing import machine_name, median_seconds, paired_ratio

PEER = "numberpartitioning_kk"


def partitioners(lengths: list[float], num_parts: int, native: bool) -> dict[str, Callable[[], Any]]:
    ints = [int(x) for x in lengths]
    runs: dict[str, Callable[[], Any]] = {
        "python_kk": lambda: balancer.balance(lengths, num_parts, "karmarkar_karp", native=False),
        "python_kk_swap": lambda: balancer.balance(lengths, num_parts, "kk_swap", native=False),
        "greedy_lpt": lambda: balancer.balance(lengths, num_parts, "greedy_lpt", native=False),
        "python_kk_free_size": lambda: balancer.balance(
            lengths, num_parts, "karmarkar_karp", native=False, equal_size=False
        ),
        PEER: lambda: numberpartitioning.karmarkar_karp(ints, num_parts, return_indices=True).partition,
        "numberpartitioning_greedy": lambda: (
            numberpartitioning.greedy(ints, num_parts, return_indices=True).partition
        ),
    }
    if native:
        runs["native_kk"] = lambda: balancer.balance(lengths, num_parts, "karmarkar_karp", native=True)
        runs["default"] = lambda: balancer.balance(lengths, num_parts, "kk_swap", native=True)
        runs["native_kk_free_size"] = lambda: balancer.balance(
            lengths, num_parts, "karmarkar_karp", native=True, equal_size=False
        )
    return runs


def bench_partitioning(
    sample_counts: list[int], part_counts: list[int], budget_s: float, native: bool
) -> list[dict[str, Any]]:
    rows = []
    for num_samples, num_parts in itertools.product(sample_counts, part_counts):
        lengths = zipf_lengths(num_samples, 1.5, seed=num_samples).tolist()
        timed = {}
        for name, fn in partitioners(lengths, num_parts, native).items():
            gap = imbalance(lengths, [sorted(p) for p in fn()])["gap_to_lower_bound"]
            timed[name] = (median_seconds(fn, warmup=0, budget_s=budget_s), gap)
        rows += [
            {
                "num_samples": num_samples,
                "num_parts": num_parts,
                "method": name,
                "seconds": seconds,
                "gap_to_lower_bound": gap,
                "equal_size": "free_size" not in name and not name.startswith("numberpartitioning"),
                "speedup_vs_numberpartitioning_kk": timed[PEER][0] / seconds,
            }
            for name, (seconds, gap) in timed.items()
        ]
        shown = pd.DataFrame(rows[-len(timed) :]).set_index(["num_samples", "num_parts", "method"])
        print(shown.to_string(), flush=True)
    return rows


def bench_gil(native: bool, seconds: float = 1.0) -> dict[str, float]:
    """Main-thread loop iterations per second while a thread runs KK + swaps on 16384 samples into 64
    parts over and over, relative to no thread. The native op runs without the GIL; on a machine with
    idle cores its thread then costs the main thread nothing (on a busy one it still competes for one)."""
    lengths = zipf_lengths(16384, 1.5, seed=0).to(torch.float64)
    as_list = lengths.tolist()

    def rate(work: Callable[[], Any] | None) -> float:
        stop = threading.Event()

        def worker() -> None:
            while not stop.is_set():
                work()

        thread = threading.Thread(target=worker) if work else None
        if thread:
            thread.start()
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            count += 1
        stop.set()
        if thread:
            thread.join()
        return count / (time.perf_counter() - start)

    idle = rate(None)
    result = {"python_kk_swap": rate(lambda: balancer.kk_swap(as_list, 64)) / idle}
    if native:
        op = torch.ops.embnb.karmarkar_karp  # the op itself: no Python around it
        result["native_kk_swap"] = rate(lambda: op(lengths, 64, True, True)) / idle
    return result


def bench_training(
    world_size: int, steps: int, batch_size: int, max_length: int, repeats: int, device: str
) -> dict[str, Any]:
    """No balancing, the shuffle on the loop (sync), in a worker (overlap; with the all-gather or the
    all-to-all exchange) and recsys-examples' caller-thread design, on the same batches, interleaved
    repeats over the same steady-state steps (`training.timed_steps`): step time, speed-up over no
    balancing beside what the slowest rank's FLOPs predict, paired differences, phase breakdown."""
    base = TrainConfig(steps=steps, batch_size=batch_size, max_length=max_length)
    runs = {
        "no balancing": base.replace(mode="none"),
        "sync": base.replace(mode="sync", native_kk=True),
        "overlap": base.replace(mode="overlap", native_kk=True),
        "overlap, all-to-all": base.replace(mode="overlap", native_kk=True, exchange="alltoall"),
        # recsys-examples' design: the collectives on the loop's thread, KK alone in the worker
        "overlap, caller thread": base.replace(mode="overlap", native_kk=True, shuffle_group="caller"),
    }
    trained = run_training(runs, world_size, device=device, repeats=repeats)
    # the bench reports medians over repeats: each run's median per-repeat ratio to no balancing
    reference_ms = trained.step_ms("no balancing")
    ideal = trained.flops_speedups("no balancing")
    rows = []
    for label, summary in trained.summaries().items():
        ms = trained.step_ms(label)
        rows.append(
            {
                "label": label,
                **summary,
                "step_ms": {"median": statistics.median(ms), "low": min(ms), "high": max(ms), "repeats": ms},
                "speedup_vs_no_balancing": paired_ratio(reference_ms, ms).as_dict(),
                "flops_ideal_speedup": ideal[label],
            }
        )
    shown = r"^(step_ms|speedup_vs_no_balancing)\.(median|low|high)$|flops_ideal|shuffle_seconds|hidden"
    print(pd.json_normalize(rows).set_index("label").filter(regex=shown).round(3).to_string(), flush=True)
    difference = trained.difference("overlap", "sync")
    designs = trained.difference("overlap, caller thread", "overlap")
    print(f"  overlap - sync, ms/step: {difference}", flush=True)
    print(f"  caller thread - worker, ms/step: {designs}", flush=True)
    return {
        "world_size": world_size,
        "backend": device_plan(device, world_size).backend,
        "timed_steps": list(timed_steps(steps)),
        "runs": rows,
        "overlap_minus_sync_ms": difference.as_dict(),
        "caller_minus_worker_ms": designs.as_dict(),
        "phase_ms": trained.phase_breakdown().to_dict(orient="records"),
    }


def bench_exchanges(opts: argparse.Namespace) -> dict[str, Any]:
    """Both exchanges on real ranks, one launch per W (time, identical batches: `compare_exchanges`),
    and their bytes per rank up to 64 ranks, printed as they finish."""
    print(f"exchanges on {opts.exchange_world_size} ranks ({opts.device}) ...", flush=True)
    fn = functools.partial(compare_exchanges, batch_size=opts.batch_size, repeats=opts.repeats)
    rows = exchange_records({w: launch(fn, w, device=opts.device) for w in opts.exchange_world_size})
    print(pd.DataFrame(rows).round(3).to_string(index=False), flush=True)
    counted = exchange_bytes_by_world_size(opts.bytes_world_size, opts.batch_size)
    print("  bytes received per rank (max):", counted, flush=True)
    return {
        "batch_size": opts.batch_size,
        "measured": rows,
        "identical": all(row["identical"] for row in rows),
        "bytes_per_rank": {str(w): b for w, b in counted.items()},
    }


def acceptance(
    distributions: dict[str, LengthDistribution], config: measured.StepConfig, opts: argparse.Namespace
) -> dict[str, Any]:
    """Every (distribution, W)'s check (`hstu.critical_rank_check`, its lengths drawn as
    `measured.measure_balanced_steps` draws them, at one thread on a CPU); the W at which all
    distributions pass, and the batch they are compared at (the largest chosen: every compared case
    passes there, its fixed share falling with the batch), or `NOT_COMPARED`."""
    model = SequenceDense(config.width, config.hidden).to(config.device)

    def step_of(lengths: list[int], batch: int) -> Callable[[], None]:
        return measured.dense_rank_step(model, lengths, config.width, config.device)

    batch_sizes = sweep_batches(config.local_batch_size, opts.sweep_factors)
    cases, compared, chosen, threads = [], [], [], torch.get_num_threads()
    if torch.device(config.device).type == "cpu":
        torch.set_num_threads(1)  # the CPU clock is the thread's: one intra-op thread, as measured's
    try:
        for w in config.world_sizes:
            checks = {}
            for name, spec in distributions.items():
                batches = {
                    b: spec.draw(w * b, config.max_length, config.seed * 1009 + w).tolist()
                    for b in batch_sizes
                }
                checks[name] = critical_rank_check(
                    batches, w, config.flops, step_of, config.repeats, config.device, opts.max_fixed_share
                )
                cases.append({"distribution": name, "world_size": w} | checks[name].as_dict())
                print(f"  W={w} {name}: {sweep_text(cases[-1])}: {checks[name].verdict}", flush=True)
            if all(c.chosen_batch is not None for c in checks.values()):
                compared.append(w)
                chosen += [c.chosen_batch for c in checks.values()]
    finally:
        torch.set_num_threads(threads)
    batch = max(chosen) if chosen else None
    return {
        "sweep_factors": opts.sweep_factors,
        "max_fixed_share": opts.max_fixed_share,
        "work": f"{TRAINING_FLOPS_PER_FORWARD} x sequence_dense_flops of the cut's heaviest rank",
        "cases": cases,
        "compared_world_sizes": compared,
        "samples_per_rank": batch,
        "verdict": NOT_COMPARED if batch is None else f"compared at batch {batch}",
    }


def bench_rank_by_rank(opts: argparse.Namespace, save: Callable[[str, Any], None]) -> None:
    """Sections 4-6 of appendix 04a at the bench's sizes, printed as they finish, after the
    acceptance check, each `save`d: the check ("rank_by_rank_acceptance"), then the results
    ("rank_by_rank"; left None where nothing passed)."""
    distributions = {
        "zipf": LengthDistribution("zipf", alpha=1.5),
        "lognormal": LengthDistribution("lognormal", median=128, sigma=1.0),
    }
    clock = {"thread": "thread CPU time", "device": "CUDA events"}[sweep_clock(opts.device)]
    print(
        f"rank by rank at W={opts.measured_world_size}, {opts.measured_batch_size} samples per rank "
        f"x {opts.sweep_factors} (the acceptance check), on {machine_name(opts.device)} ({clock}) ...",
        flush=True,
    )
    config = measured.StepConfig(
        opts.measured_world_size,
        opts.measured_batch_size,
        opts.measured_max_length,
        opts.measured_width,
        repeats=opts.measured_repeats,
        device=opts.device,
    )
    check = acceptance(distributions, config, opts)
    save("rank_by_rank_acceptance", check)
    if check["samples_per_rank"] is None:
        print(f"  {NOT_COMPARED}: no W passed at every distribution", flush=True)
        return
    config = dataclasses.replace(
        config, world_sizes=check["compared_world_sizes"], local_batch_size=check["samples_per_rank"]
    )
    print(f"  compared at W={config.world_sizes}, {config.local_batch_size} samples per rank", flush=True)
    steps = measured.measure_balanced_steps(distributions, config)
    table = steps.speedups()
    shown = ["distribution", "world_size", "measured", "flop_model", "bound"]
    print(table[table["method"] == "kk_swap"][shown].to_string(index=False), flush=True)
    capped = [
        measured.measure_capped(steps, name, opts.cap_world_size, opts.cap_over_mean)
        for name in distributions
        if opts.cap_world_size in config.world_sizes
    ]
    if capped:
        print(pd.concat([run.table() for run in capped]).round(3).to_string(), flush=True)
    latency_ms = measured.measure_latency_ms(2, device=opts.device)  # the link model's alpha, measured
    print(f"  link latency (one-float64 all-gather, 2 ranks): {latency_ms:.3f} ms", flush=True)
    shares = {name: measured.worker_shares(steps, name, latency_ms=latency_ms) for name in distributions}
    shown = ["world_size", "shuffle_ms", "compute_ms_measured", "hidden_share_computed"]
    print(pd.concat(shares, names=["distribution"])[shown].round(3).to_string(), flush=True)
    save("rank_by_rank", measured.results(steps, capped, shares))


def _options(argv: list[str]) -> argparse.Namespace:
    """The command line, checked (`hstu.check_options`): --cap-world-size one of the measured ones
    (None: skip)."""
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench balancer", description=__doc__.splitlines()[0]
    )
    add, ints = parser.add_argument, {"type": int, "nargs": "+"}
    add("--samples", **ints, default=[256, 1024, 4096, 16384])
    add("--parts", **ints, default=[8, 64])
    add("--budget", type=float, default=0.4, help="seconds of timing per method and size")
    add("--world-size", **ints, default=[2], help="one training run per value (2: a core per rank)")
    add("--steps", type=int, default=12, help="steps per run; the first and last are not timed")
    add("--batch-size", type=int, default=64, help="samples per rank per step")
    add("--max-length", type=int, default=2048)
    add("--repeats", type=int, default=10, help="interleaved repeats of each training run")
    add("--device", default="cpu", choices=["auto", "cpu", "cuda"], help="where ranks train")
    add("--no-train", action="store_true", help="skip the multi-rank training part")
    add("--exchange-world-size", type=int, nargs="*", default=[2, 4], help="ranks of exchanges (none: skip)")
    add("--bytes-world-size", **ints, default=[2, 4, 8, 16, 32, 64], help="ranks bytes are computed for")
    add("--measured-world-size", type=int, nargs="*", default=[8, 16, 64], help="rank by rank (none: skip)")
    add("--measured-batch-size", type=int, default=32, help="samples per rank, rank by rank")
    add("--measured-max-length", type=int, default=2048, help="longest sequence, rank by rank")
    add("--measured-width", type=int, default=32, help="width of the measured model, rank by rank")
    add("--measured-repeats", type=int, default=3, help="timed repeats per rank")
    add(
        "--cap-world-size",
        type=int,
        default=16,
        help="ranks of the memory-capped balance: one of --measured-world-size (0: skip it)",
    )
    add("--cap-over-mean", type=float, default=1.02, help="token cap / mean tokens per rank")
    add_sweep_options(parser, "--measured-batch-size", "flops")
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    check_options(parser, opts, may_be_zero="cap_world_size")  # 0: no capped balance
    if opts.measured_width % 4:  # SequenceDense's 4 attention heads
        parser.error(f"--measured-width must be a multiple of 4, got {opts.measured_width}")
    if opts.cap_world_size == 0 or not opts.measured_world_size:
        opts.cap_world_size = None
    elif opts.cap_world_size not in opts.measured_world_size:
        parser.error(
            f"--cap-world-size must be one of --measured-world-size {opts.measured_world_size} "
            f"(or 0: skip the capped balance), got {opts.cap_world_size}"
        )
    return opts


def main(argv: list[str]) -> int:
    opts = _options(argv)
    quiet_torchrec_logs()  # and torch.fx's log on every rank that builds a KeyedJaggedTensor
    native = loader.available()
    if not native:
        print(f"native KK unavailable: {loader.failure()}", file=sys.stderr)
    payload: dict[str, Any] = {
        "machine": machine_name(opts.device),
        "device": opts.device,
        "host": machine_name("cpu"),
        "torch": torch.__version__,
        "native_kk": native,
        "peer": "numberpartitioning.karmarkar_karp " + numberpartitioning.__version__,
        "training_config": {
            k: getattr(opts, k) for k in ("steps", "batch_size", "max_length", "repeats", "device")
        }
        | {"model": {k: getattr(TrainConfig(), k) for k in ("embedding_dim", "ffn_dim", "num_heads")}},
        "training": [],
        "exchanges": None,
        "rank_by_rank": None,
        "rank_by_rank_acceptance": None,
    }

    def save(key: str, value: Any) -> None:
        """Each part written as it ends: a run cut short keeps what it measured."""
        payload[key] = value
        write_results("balancer", payload, opts.out)

    print("partitioning (Zipf(1.5) lengths, max 8192):", flush=True)
    save("partitioning", bench_partitioning(opts.samples, opts.parts, opts.budget, native))
    save("gil_main_thread_speed", bench_gil(native))
    print(
        "main-thread Python speed while KK runs in a thread (1 = unaffected):",
        {k: round(v, 2) for k, v in payload["gil_main_thread_speed"].items()},
        flush=True,
    )
    for world_size in [] if opts.no_train else opts.world_size:
        print(f"training on {world_size} ranks ({opts.device}), {opts.repeats} repeats ...", flush=True)
        trained = bench_training(
            world_size, opts.steps, opts.batch_size, opts.max_length, opts.repeats, opts.device
        )
        save("training", [*payload["training"], trained])
    if opts.exchange_world_size:
        save("exchanges", bench_exchanges(opts))
    if opts.measured_world_size:
        bench_rank_by_rank(opts, save)
    print(f"wrote {write_results('balancer', payload, opts.out)}")
    return 0

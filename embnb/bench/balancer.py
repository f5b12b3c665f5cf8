"""`python -m embnb.bench balancer`: KK speed and balance, and overlapped training.

1. Partitioning: for each (samples, parts) of Zipf(1.5) lengths, the time and
   the gap to the lower bound max(mean, largest item) of: our Python KK, the
   native KK, the default balancer (native KK + swaps), equal-count LPT, and
   the PyPI `numberpartitioning` package's `karmarkar_karp` and `greedy`.
   numberpartitioning has no equal-count mode, so our KK also runs with
   `equal_size=False` next to it. Speed-ups are ratios to
   numberpartitioning.karmarkar_karp on the same input in the same run.
2. GIL: how fast the main thread's Python runs while KK runs in a thread
   (native releases the GIL, Python holds it), relative to no KK at all.
3. Training: step time of a small sequence model on 2 ranks (one core each
   on a 2-core machine, so the slowest rank sets the step) with no
   balancing, balancing without overlap, and balancing overlapped (native
   and Python KK), each repeated, interleaved; the speed-up over no
   balancing per repeat (median and range), and the share of KK time hidden.

Writes benchmarks/results/balancer-DATE-MACHINE.json.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numberpartitioning
import torch

from embnb.balancing import partition as balancer
from embnb.balancing.experiment import run_training
from embnb.balancing.training import TrainConfig
from embnb.balancing.workloads import imbalance
from embnb.bench.timing import write_results
from embnb.data import zipf_lengths
from embnb.dist import device_plan
from embnb.native import loader
from embnb.timing import Ratio, machine_name, median_seconds

PEER = "numberpartitioning_kk"


def partitioners(lengths: list[float], num_parts: int, native: bool) -> dict[str, Callable[[], Any]]:
    ints = [int(x) for x in lengths]
    runs: dict[str, Callable[[], Any]] = {
        "python_kk": lambda: balancer.balance(lengths, num_parts, "karmarkar_karp", "python"),
        "python_kk_swap": lambda: balancer.balance(lengths, num_parts, "kk_swap", "python"),
        "greedy_lpt": lambda: balancer.balance(lengths, num_parts, "greedy_lpt", "python"),
        "python_kk_free_size": lambda: balancer.balance(
            lengths, num_parts, "karmarkar_karp", "python", False
        ),
        PEER: lambda: numberpartitioning.karmarkar_karp(ints, num_parts, return_indices=True).partition,
        "numberpartitioning_greedy": lambda: (
            numberpartitioning.greedy(ints, num_parts, return_indices=True).partition
        ),
    }
    if native:
        runs["native_kk"] = lambda: balancer.balance(lengths, num_parts, "karmarkar_karp", "native")
        runs["default"] = lambda: balancer.balance(lengths, num_parts, "kk_swap", "native")
        runs["native_kk_free_size"] = lambda: balancer.balance(
            lengths, num_parts, "karmarkar_karp", "native", False
        )
    return runs


def bench_partitioning(
    sample_counts: list[int], part_counts: list[int], budget_s: float, native: bool
) -> list[dict[str, Any]]:
    rows = []
    for num_samples in sample_counts:
        lengths = zipf_lengths(num_samples, 1.5, seed=num_samples).tolist()
        for num_parts in part_counts:
            for name, fn in partitioners(lengths, num_parts, native).items():
                parts = fn()
                seconds = median_seconds(fn, warmup=0, budget_s=budget_s)
                gaps = imbalance(lengths, [sorted(p) for p in parts])
                rows.append(
                    {
                        "num_samples": num_samples,
                        "num_parts": num_parts,
                        "method": name,
                        "seconds": seconds,
                        "gap_to_lower_bound": gaps["gap_to_lower_bound"],
                        "equal_size": "free_size" not in name and not name.startswith("numberpartitioning"),
                    }
                )
                print(
                    f"  {num_samples:>6} into {num_parts:>3}  {name:<26} {seconds * 1e3:10.3f} ms  "
                    f"gap {gaps['gap_to_lower_bound']:8.3%}",
                    flush=True,
                )
            peer = next(
                r["seconds"]
                for r in rows
                if r["num_samples"] == num_samples and r["num_parts"] == num_parts and r["method"] == PEER
            )
            for r in rows:
                if r["num_samples"] == num_samples and r["num_parts"] == num_parts:
                    r["speedup_vs_numberpartitioning_kk"] = peer / r["seconds"]
    return rows


def bench_gil(native: bool, seconds: float = 1.0) -> dict[str, float]:
    """Main-thread loop iterations per second while a thread runs KK + swaps
    on 16384 samples into 64 parts over and over, relative to no thread.
    The native op runs without the GIL; on a machine with idle cores its
    thread then costs the main thread nothing (on a busy one it still
    competes for a core)."""
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
) -> list[dict[str, Any]]:
    base = TrainConfig(steps=steps, batch_size=batch_size, max_length=max_length)
    runs = {
        "no balancing": base.replace(mode="none"),
        "balancing, no overlap": base.replace(mode="sync", kk_backend="native"),
        "balancing overlapped (native KK)": base.replace(mode="overlap", kk_backend="native"),
        "balancing overlapped (Python KK)": base.replace(mode="overlap", kk_backend="python"),
    }
    trained = run_training(runs, world_size, device=device, repeats=repeats)
    speedups = trained.speedups("no balancing")
    return [
        {"label": label, **summary.as_dict(), "speedup_vs_no_balancing": speedups[label].as_dict()}
        for label, summary in trained.summaries().items()
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench balancer", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--samples", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--parts", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--budget", type=float, default=0.4, help="seconds of timing per method and size")
    parser.add_argument(
        "--world-size",
        type=int,
        nargs="+",
        default=[2],
        help="one training run per value (2: one core per rank on a 2-core machine)",
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats of each training run")
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"], help="where ranks train")
    parser.add_argument("--no-train", action="store_true", help="skip the multi-rank training part")
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="results folder (default benchmarks/results)"
    )
    opts = parser.parse_args(argv)
    for name, values in (
        ("--world-size", opts.world_size),
        ("--steps", [opts.steps]),
        ("--repeats", [opts.repeats]),
        ("--batch-size", [opts.batch_size]),
        ("--max-length", [opts.max_length]),
    ):
        if any(v < 1 for v in values):
            parser.error(f"{name} must be >= 1, got {values if len(values) > 1 else values[0]}")
    native = loader.available()
    if not native:
        print(f"native KK unavailable: {loader.failure()}", file=sys.stderr)
    print("partitioning (Zipf(1.5) lengths, max 8192):", flush=True)
    partitioning = bench_partitioning(opts.samples, opts.parts, opts.budget, native)
    gil = bench_gil(native)
    print(
        "main-thread Python speed while KK runs in a thread (1 = unaffected):",
        {k: round(v, 2) for k, v in gil.items()},
        flush=True,
    )
    training = []
    for world_size in [] if opts.no_train else opts.world_size:
        print(f"training on {world_size} ranks ({opts.device}), {opts.repeats} repeats ...", flush=True)
        rows = bench_training(
            world_size, opts.steps, opts.batch_size, opts.max_length, opts.repeats, opts.device
        )
        for r in rows:
            hidden = "" if r["hidden_fraction"] is None else f"  hidden {r['hidden_fraction']:.1%}"
            print(
                f"  {r['label']:<34} {r['step_seconds'] * 1e3:8.1f} ms/step  "
                f"speed-up {Ratio(**r['speedup_vs_no_balancing'])}  "
                f"FLOPs max/mean {r['flops_max_over_mean']:.3f}  KK {r['kk_seconds'] * 1e3:.3f} ms{hidden}",
                flush=True,
            )
        training.append(
            {"world_size": world_size, "backend": device_plan(opts.device, world_size).backend, "runs": rows}
        )
    payload = {
        "machine": machine_name(),
        "native_kk": native,
        "peer": "numberpartitioning.karmarkar_karp " + numberpartitioning.__version__,
        "partitioning": partitioning,
        "gil_main_thread_speed": gil,
        "training": training,
        "training_config": {
            "steps": opts.steps,
            "batch_size": opts.batch_size,
            "max_length": opts.max_length,
            "repeats": opts.repeats,
            "device": opts.device,
            "model": {k: getattr(TrainConfig(), k) for k in ("embedding_dim", "ffn_dim", "num_heads")},
        },
    }
    print(f"wrote {write_results('balancer', payload, opts.out)}")
    return 0

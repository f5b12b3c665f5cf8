"""`python -m embnb.bench hstu`: the balancer measured where recsys-examples measured it.

Each rank's training step (forward + backward of `embnb.balancing.hstu.HSTUModel` on its samples) for
the loader's cut, greedy LPT, KK and KK + swaps, each balancing `hstu_flops` (causal), ranks replayed
one by one on one device in interleaved repeats (a partition's step is its slowest rank; a speed-up is
the cut's step over the method's in the same repeat): at each --world-sizes W (then
--more-world-sizes, as --deadline-s allows) at --width, and a width sweep at --sweep-world-size. Each
(W, width) first passes issue #70's acceptance check (`critical_rank_check`), else records
"overhead-bound: not compared". On a GPU a rank's time is between CUDA events (bf16), its enqueue time
beside it; on a CPU, thread CPU time at one intra-op thread (float32). docs/balancing.md describes the
model and the bench; the results go to benchmarks/results/hstu-DATE-MACHINE.json after each unit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from embnb.balancing.hstu import (
    ATTENTION,
    HSTUModel,
    attention_kind,
    bucket_by_length,
    head_layout,
    hstu_flops,
    jagged_by_length,
)
from embnb.balancing.partition import balance
from embnb.balancing.workloads import equal_size_lower_bound
from embnb.bench.results import (
    add_out_argument,
    add_sweep_options,
    check_sweep_options,
    sweep_text,
    write_results,
)
from embnb.data import zipf_lengths
from embnb.dist import resolve_device
from embnb.scaling import (
    TRAINING_FLOPS_PER_FORWARD,
    ScalingCheck,
    measure_scaling,
    sweep_batches,
    sweep_clock,
)
from embnb.timing import Ratio, interleaved_phases, machine_name, paired_ratio

METHODS = ("contiguous", "greedy_lpt", "karmarkar_karp", "kk_swap")


def rank_step(
    model: HSTUModel, lengths: list[int], device: str, dtype: torch.dtype, seed: int, attention: str
):
    """A callable running one rank's forward and backward on samples of `lengths`, its attention
    "jagged" or "bucketed" (`attention_kind`)."""
    batch = (jagged_by_length if attention == "jagged" else bucket_by_length)(lengths).to(device)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randn(sum(lengths), model[0].width, generator=gen).to(device, dtype)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(tokens, batch).float().square().mean().backward()

    return step


def measure_world(
    model: HSTUModel, lengths: list[int], world_size: int, step_of, repeats: int, device: str
) -> dict[str, Any]:
    """Every method's partition of `lengths`, every rank (`step_of(its lengths, its rank)`, a callable
    running its step) timed in each repeat."""
    width, layers = model[0].width, len(model)
    flops = hstu_flops(lengths, width, layers).tolist()
    parts = {m: balance(flops, world_size, m) for m in METHODS}
    calls = {
        (m, r): step_of([lengths[i] for i in part], r) for m, p in parts.items() for r, part in enumerate(p)
    }
    clock, on_gpu = sweep_clock(device), torch.device(device).type == "cuda"
    # one warm-up each, then every method's every rank once per round, at the caller's thread count
    timed, _ = interleaved_phases(calls, repeats, 1, device, threads=torch.get_num_threads())
    rank_s = {m: [[t.value(clock) for t in timed[(m, r)]] for r in range(world_size)] for m in METHODS}
    enqueue_s = {m: [[t.enqueue_s for t in timed[(m, r)]] for r in range(world_size)] for m in METHODS}
    cut = [max(rank) for rank in zip(*rank_s["contiguous"])]  # per repeat, the slowest rank
    cut_flops = max(sum(flops[i] for i in p) for p in parts["contiguous"])
    runs = []
    for m in METHODS:
        step_s = [max(rank) for rank in zip(*rank_s[m])]
        rank_flops = [sum(flops[i] for i in part) for part in parts[m]]
        # rank_enqueue_ms_median: the launches' share on a GPU (a rank whose enqueue time nears its GPU
        # time is launch-bound); on a CPU the work itself, so left out
        runs.append(
            {
                "method": m,
                "step_ms": [1e3 * s for s in step_s],
                "step_ms_median": 1e3 * statistics.median(step_s),
                "speedup_vs_cut": paired_ratio(cut, step_s).as_dict(),
                "flop_model_speedup": cut_flops / max(rank_flops),
                "rank_ms_median": [1e3 * statistics.median(t) for t in rank_s[m]],
                "rank_enqueue_ms_median": [1e3 * statistics.median(t) for t in enqueue_s[m]]
                if on_gpu
                else None,
                "rank_flops": rank_flops,
                "rank_tokens": [sum(lengths[i] for i in part) for part in parts[m]],
            }
        )
    bound = equal_size_lower_bound(flops, world_size)
    return {
        "world_size": world_size,
        "width": width,
        "runs": runs,
        # the FLOP model's best case: the cut's largest rank over the equal-count lower bound
        "bound_speedup": cut_flops / bound,
        "longest_sample_sets_bound": bound > sum(flops) / world_size,  # not the mean: the longest sample
    }


def critical_rank_check(
    batches: dict[int, list[int]], world_size: int, flops_of, step_of, repeats: int, device: str, limit: float
) -> ScalingCheck:
    """Issue #70's acceptance check of one case (this bench's and `balancer`'s): for each samples per rank
    `b` of `batches` (b -> the global batch's lengths), the loader's cut's rank with the most FLOPs
    (`flops_of(lengths)`: a tensor, per sample), its step `step_of(its lengths, b)` timed at every b in
    interleaved rounds and fitted on its training FLOPs (`embnb.scaling.measure_scaling`, fixed share
    at most `limit`)."""
    steps, work = {}, []
    for b in sorted(batches):
        lengths = batches[b]
        flops = flops_of(lengths).tolist()
        critical = max(balance(flops, world_size, "contiguous"), key=lambda part: sum(flops[i] for i in part))
        steps[b] = step_of([lengths[i] for i in critical], b)
        work.append(TRAINING_FLOPS_PER_FORWARD * sum(flops[i] for i in critical))
    return measure_scaling(steps, work, "flops", repeats, device, limit)


def measure_unit(world_size: int, width: int, opts: argparse.Namespace, dtype: torch.dtype) -> dict[str, Any]:
    """One (W, width): the acceptance check, then the methods compared at the chosen batch, or not
    compared at all (`embnb.scaling.NOT_COMPARED`, or out of memory on the device: no runs)."""
    torch.manual_seed(width)
    model = HSTUModel(width, opts.layers).to(opts.device, dtype)
    batches = {
        b: zipf_lengths(world_size * b, opts.alpha, opts.max_length, seed=world_size * f).tolist()
        for f, b in zip(opts.sweep_factors, sweep_batches(opts.samples_per_rank, opts.sweep_factors))
    }
    empty, check = {"world_size": world_size, "width": width, "runs": []}, None

    def step_of(lengths: list[int], seed: int):
        return rank_step(model, lengths, opts.device, dtype, seed, opts.attention)

    try:  # the 16x batch may not fit the device: the unit says so and the next one still runs
        check = critical_rank_check(
            batches,
            world_size,
            lambda n: hstu_flops(n, width, opts.layers),
            step_of,
            opts.repeats,
            opts.device,
            opts.max_fixed_share,
        )
        chosen = check.chosen_batch
        world = empty
        if chosen is not None:
            world = measure_world(model, batches[chosen], world_size, step_of, opts.repeats, opts.device)
    except torch.cuda.OutOfMemoryError as error:
        torch.cuda.empty_cache()
        where = "in the sweep" if check is None else f"at batch {check.chosen_batch}"
        acceptance = None if check is None else check.as_dict()
        failed = {"verdict": f"out of memory {where}: not compared", "error": str(error)}
        return empty | failed | {"samples_per_rank": None, "acceptance": acceptance}
    return world | {"samples_per_rank": chosen, "verdict": check.verdict, "acceptance": check.as_dict()}


def _units(opts: argparse.Namespace) -> list[tuple[int, int]]:
    """(W, width) in the order run: --world-sizes, the sweep, then --more-world-sizes."""
    units = [(w, opts.width) for w in opts.world_sizes]
    units += [(opts.sweep_world_size, width) for width in opts.sweep_widths]
    units += [(w, opts.width) for w in opts.more_world_sizes]
    return list(dict.fromkeys(units))


def first_width_shortened(sweep: list[dict[str, Any]], method: str = "kk_swap") -> int | None:
    """The smallest width from which on `method`'s slowest repeat beat the cut (low speed-up > 1) at
    every larger width of the sweep, each compared (past the acceptance check); None if not even at
    the widest."""
    found = None
    for world in sorted(sweep, key=lambda w: -w["width"]):
        run = next((r for r in world["runs"] if r["method"] == method), None)
        if run is None or run["speedup_vs_cut"]["low"] <= 1:  # not compared (overhead-bound), or not beaten
            break
        found = world["width"]
    return found


def run(opts: argparse.Namespace, write: Any = None) -> dict[str, Any]:
    """Every (W, width) of `_units` until the deadline; `write(payload)` after each, so a run killed
    from outside still leaves what it measured."""
    device = opts.device
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    balance([1.0, 2.0], 2, "kk_swap")  # loads (or first builds) the native KK before the deadline's clock
    started = time.perf_counter()
    worlds: list[dict[str, Any]] = []
    cut: list[dict[str, int]] = []
    for world_size, width in _units(opts):
        if time.perf_counter() - started > opts.deadline_s:
            cut.append({"world_size": world_size, "width": width})
            continue
        world = measure_unit(world_size, width, opts, dtype)
        worlds.append(world)
        print(f"  W={world_size:>3} width {width:>5}: {_line(world)}", flush=True)
        if write is not None:
            write(_payload(opts, dtype, worlds, cut, started))
    if cut:
        print(f"  cut by the deadline ({opts.deadline_s:.0f} s): {cut}", flush=True)
    payload = _payload(opts, dtype, worlds, cut, started)
    print(
        f"  sweep at W={opts.sweep_world_size}, widths {payload['sweep_widths_measured']} measured (not "
        f"compared: {payload['not_compared']}): KK + swaps shortens the step from width "
        f"{payload['first_width_shortened']} on (None: from none)",
        flush=True,
    )
    return payload


def _line(world: dict[str, Any]) -> str:
    """What a (W, width) shows: its acceptance check, then the comparison if it passed."""
    if world["acceptance"] is None:
        return world["verdict"]
    if not world["runs"]:
        return f"{world['verdict']} ({sweep_text(world['acceptance'])})"
    line = ", ".join(
        f"{r['method']} {Ratio(**r['speedup_vs_cut'])} (FLOPs {r['flop_model_speedup']:.2f}x)"
        for r in world["runs"][1:]
    )
    step = world["runs"][0]["step_ms_median"]
    return (
        f"{sweep_text(world['acceptance'])}; at {world['samples_per_rank']}: cut {step:.2f} ms/step; {line}"
    )


def _payload(opts: argparse.Namespace, dtype: torch.dtype, worlds: list, cut: list, started: float) -> dict:
    device = opts.device
    sweep = [
        w for w in worlds if w["world_size"] == opts.sweep_world_size and w["width"] in opts.sweep_widths
    ]
    return {
        "machine": machine_name(device),
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "clock": "GPU time between CUDA events" if torch.device(device).type == "cuda" else "thread CPU time",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "config": {
            "layers": opts.layers,
            "width": opts.width,
            "heads": list(head_layout(opts.width)),
            "samples_per_rank": opts.samples_per_rank,  # the sweep's base batch
            "sweep_factors": opts.sweep_factors,
            "max_fixed_share": opts.max_fixed_share,
            "work": f"{TRAINING_FLOPS_PER_FORWARD} x hstu_flops(causal=True) of the cut's critical rank",
            "zipf_alpha": opts.alpha,
            "max_length": opts.max_length,
            "repeats": opts.repeats,
            "replay": "ranks one by one on one device",
            "workload": "hstu_flops(causal=True)",
            "attention": opts.attention,  # what ran: "jagged" (varlen_attn) or "bucketed" (padded SDPA)
        },
        "worlds": worlds,
        "not_compared": [
            {"world_size": w["world_size"], "width": w["width"]} for w in worlds if not w["runs"]
        ],
        "sweep_world_size": opts.sweep_world_size,
        "sweep_widths_measured": sorted(w["width"] for w in sweep),
        "first_width_shortened": first_width_shortened(sweep) if sweep else None,
        "cut_by_deadline": cut,
        "seconds": time.perf_counter() - started,
    }


def check_options(parser: argparse.ArgumentParser, opts: argparse.Namespace, may_be_zero: str = "") -> None:
    """What this bench and `balancer` check: every int option (each of a list) at least 1 but
    `may_be_zero`, the sweep's options, --device resolved ("auto": a GPU if any), by `parser.error`."""
    for name, value in vars(opts).items():
        if name != may_be_zero and any(
            type(v) is int and v < 1 for v in (value if isinstance(value, list) else [value])
        ):
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    check_sweep_options(parser, opts)
    try:
        opts.device = resolve_device(opts.device)
    except ValueError as error:  # --device cuda without a GPU
        parser.error(f"--device: {error}")


def _options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m embnb.bench hstu", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    add("--world-sizes", type=int, nargs="*", default=[2, 4], help="W at --width")
    add("--more-world-sizes", type=int, nargs="*", default=[], help="W run last, if time allows")
    add("--width", type=int, default=64, help="model width (recsys-examples: 1024)")
    add("--sweep-widths", type=int, nargs="*", default=[16, 32], help="widths of the sweep")
    add("--sweep-world-size", type=int, default=4, help="W of the width sweep")
    add("--layers", type=int, default=2, help="HSTU layers (recsys-examples: 8)")
    add("--samples-per-rank", type=int, default=4, help="the sweep's base batch (recsys-examples: 32)")
    add("--max-length", type=int, default=64, help="longest sequence (recsys-examples: 4096)")
    add("--alpha", type=float, default=1.2, help="Zipf exponent of the lengths")
    add("--repeats", type=int, default=3, help="timed repeats (one warm-up before)")
    add("--deadline-s", type=float, default=600.0, help="start nothing new after this")
    add("--attention", default="auto", choices=ATTENTION, help="auto: jagged on CUDA, else bucketed")
    add_sweep_options(parser, "--samples-per-rank", "flops")
    add_out_argument(parser)
    opts = parser.parse_args(argv)
    check_options(parser, opts)
    for width in [opts.width, *opts.sweep_widths]:
        try:
            head_layout(width)
        except ValueError as error:
            parser.error(f"--width/--sweep-widths: {error}")
    if opts.alpha <= 0 or opts.deadline_s <= 0:
        parser.error(f"--alpha and --deadline-s must be > 0, got {opts.alpha} and {opts.deadline_s}")
    try:
        opts.attention = attention_kind(opts.attention, opts.device)
    except ValueError as error:
        parser.error(f"--attention: {error}")
    return opts


def main(argv: list[str]) -> int:
    opts = _options(argv)
    print(
        f"HSTU-like model rank by rank on {machine_name(opts.device)}: width {opts.width}, "
        f"{opts.layers} layers, {opts.samples_per_rank} samples per rank x {opts.sweep_factors}, "
        f"Zipf({opts.alpha}) lengths up to {opts.max_length}, {opts.attention} attention",
        flush=True,
    )
    threads = torch.get_num_threads()
    if torch.device(opts.device).type == "cpu":
        torch.set_num_threads(1)  # the CPU clock is the thread's: one intra-op thread
    try:
        payload = run(opts, write=lambda partial: write_results("hstu", partial, opts.out))
    finally:
        torch.set_num_threads(threads)
    print(f"wrote {write_results('hstu', payload, opts.out)}")
    return 0

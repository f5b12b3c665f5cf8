"""Notebook 04's measured step at the world sizes that matter, rank by rank
(`embnb.steptime.measure_partition`): each rank runs forward and backward
of the dense sequence model (`steptime.kernels.SequenceDense`) on its own
samples, one rank after another on one device; the step is the slowest
rank. On a CPU the primary clock is per-thread CPU time at one intra-op
thread: it counts only the rank's own compute, so other processes on the
shared cores stretch the wall clock but not it. On a GPU (device="cuda":
every rank in turn on the one GPU) it is wall time with the GPU synchronized
at each phase's edges (`steptime.measure`): the thread's CPU time there
counts launches and waiting, not the GPU's work. Peak memory on a GPU is
`torch.cuda.max_memory_allocated`, its peak reset before each rank.

- `measure_balanced_steps`: each balancer's step against the loader's cut,
  beside the FLOP model's prediction and the lower bound;
- `measure_capped`: KK + swaps without a cap against every method under a
  per-rank token cap: tokens, FLOPs, measured step and peak memory per rank;
- `worker_shares`: what the background worker would hide at each W:
  the shuffle's phases (bytes counted, KK timed, times computed by an
  alpha-beta model: a latency per ring step plus the bytes at torchrec's
  bandwidths) against the measured compute.

    steps = measure_balanced_steps({"zipf": LengthDistribution()}, [8, 16], local_batch_size=8)
    steps.speedups()       # one row per (distribution, W, method)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from embnb._checks import check_int, check_number
from embnb.balancing.capped import CAPPED_METHODS, balance_capped, minimum_cap
from embnb.balancing.kjt_alltoall import exchange_bytes
from embnb.balancing.lengths import LengthDistribution
from embnb.balancing.partition import balance
from embnb.balancing.workloads import equal_size_lower_bound
from embnb.dist import resolve_device
from embnb.lab.balancing.cost_fit import with_explanations
from embnb.steptime import measure_partition
from embnb.steptime.memory import peak_memory_partition
from embnb.timing import median_seconds

__all__ = [
    "MEASURED_METHODS",
    "primary_clock",
    "EXCHANGE_ITEM_BYTES",
    "sequence_dense_flops",
    "RankStep",
    "BalancedSteps",
    "measure_balanced_steps",
    "CappedRun",
    "measure_capped",
    "worker_shares",
]

MEASURED_METHODS = ("contiguous", "greedy_lpt", "karmarkar_karp", "kk_swap")
# Bytes per id of each key a sample carries, as section 5's batch (`zipf_batch`):
# two keys of int64 ids, two of int64 ids with fp32 weights; a float64 label row
EXCHANGE_ITEM_BYTES, EXCHANGE_DENSE_BYTES = (8, 8, 12, 12), 8


def sequence_dense_flops(lengths: Any, width: int, hidden: Sequence[int]) -> torch.Tensor:
    """Forward FLOPs of `SequenceDense` per sample of L tokens (float64): the
    QKV projection 6*L*d^2, attention 4*L^2*d (scores and weights @ V, the
    causal mask not subtracted, as torch's FLOP counter counts it), and the
    MLP 2*L*(d*h1 + h1*h2 + ... + h_last*1). A multiply-add is 2 FLOPs."""
    check_int("width", width, low=1)
    length = torch.as_tensor(lengths, dtype=torch.float64)
    widths = [width, *hidden, 1]
    mlp = sum(a * b for a, b in zip(widths, widths[1:]))
    return 6 * length * width * width + 4 * length * length * width + 2 * length * mlp


def primary_clock(device: str) -> str:
    """The clock a step is read on (module docstring): "cpu" (thread CPU
    time) on a CPU, "wall" (synchronized) on a GPU."""
    return "wall" if torch.device(device).type == "cuda" else "cpu"


@dataclass(frozen=True)
class RankStep:
    """One partition measured rank by rank: per rank, its median compute
    (ms, thread CPU and wall), the range of its repeats (each clock), its
    tokens and its model FLOPs; `clock` names the one the step is read on."""

    cpu_ms: list[float]
    wall_ms: list[float]
    cpu_low_ms: list[float]
    cpu_high_ms: list[float]
    tokens: list[int]
    flops: list[float]
    wall_low_ms: list[float] = dataclasses.field(default_factory=list)
    wall_high_ms: list[float] = dataclasses.field(default_factory=list)
    clock: str = "cpu"
    distinct_lengths: list[int] = dataclasses.field(default_factory=list)  # kernel groups per rank

    @property
    def rank_ms(self) -> list[float]:
        """Each rank's median on `clock`."""
        return self.cpu_ms if self.clock == "cpu" else self.wall_ms

    @property
    def rank_range_ms(self) -> tuple[list[float], list[float]]:
        """Each rank's fastest and slowest repeat on `clock`."""
        if self.clock == "cpu":
            return self.cpu_low_ms, self.cpu_high_ms
        return self.wall_low_ms, self.wall_high_ms

    @property
    def step_ms(self) -> float:
        """The step: the slowest rank (on `clock`)."""
        return max(self.rank_ms)

    def cost_range(self, base: RankStep) -> tuple[float, float]:
        """This step over `base`'s, fastest over slowest and slowest over fastest
        repeat (a step's repeat range: the slowest rank's low and high)."""
        (low, high), (base_low, base_high) = self.rank_range_ms, base.rank_range_ms
        return max(low) / max(base_high), max(high) / max(base_low)


def _measure(parts_lengths: list[list[int]], flops_of, **options: Any) -> RankStep:
    times = measure_partition(parts_lengths, **options)
    computes = [r.compute for r in times.ranks]
    return RankStep(
        [1e3 * c.median_s("cpu") for c in computes],
        [1e3 * c.median_s("wall") for c in computes],
        [1e3 * c.range_s("cpu")[0] for c in computes],
        [1e3 * c.range_s("cpu")[1] for c in computes],
        [sum(p) for p in parts_lengths],
        [float(flops_of(p).sum()) for p in parts_lengths],
        [1e3 * c.range_s("wall")[0] for c in computes],
        [1e3 * c.range_s("wall")[1] for c in computes],
        primary_clock(options.get("device", "cpu")),
        [len(set(p)) for p in parts_lengths],
    )


def _partition(flops: list[float], num_parts: int, method: str) -> list[list[int]]:
    return balance(flops, num_parts, method)


@dataclass(frozen=True)
class BalancedSteps:
    """`measure_balanced_steps`' runs: (distribution, W, method) -> RankStep,
    and per (distribution, W) the batch's FLOPs bounds."""

    runs: dict[tuple[str, int, str], RankStep]
    bounds: dict[tuple[str, int], dict[str, float]]
    lengths: dict[tuple[str, int], list[int]]  # each global batch, in the loader's order
    config: dict[str, Any]

    def speedups(self) -> pd.DataFrame:
        """Per (distribution, W, method): measured speed-up over the loader's
        cut (its step over this one's), the FLOP model's (max FLOPs over max
        FLOPs), the bound's (the cut's max FLOPs over the equal-count lower
        bound), and whether the longest sample sets that bound."""
        rows = []
        for (name, w, method), run in self.runs.items():
            cut = self.runs[(name, w, "contiguous")]
            bound = self.bounds[(name, w)]
            rows.append(
                {
                    "distribution": name,
                    "world_size": w,
                    "method": method,
                    "step_ms": run.step_ms,
                    "measured": cut.step_ms / run.step_ms,
                    "flop_model": max(cut.flops) / max(run.flops),
                    "bound": max(cut.flops) / bound["lower_bound"],
                    "longest_sets_bound": bound["longest_sets_bound"],
                }
            )
        return pd.DataFrame(rows)

    def records(self) -> list[dict[str, Any]]:
        """Every run with its raw per-rank numbers (for the results JSON)."""
        return [
            {
                "distribution": name,
                "world_size": w,
                "method": m,
                **dataclasses.asdict(run),
                **self.bounds[(name, w)],
            }
            for (name, w, m), run in self.runs.items()
        ]


def _draw(spec: LengthDistribution, world_size: int, local_batch_size: int, max_length: int, seed: int):
    return spec.draw(world_size * local_batch_size, max_length, seed * 1009 + world_size).tolist()


def measure_balanced_steps(
    distributions: Mapping[str, LengthDistribution],
    world_sizes: Sequence[int],
    local_batch_size: int,
    max_length: int = 2048,
    width: int = 32,
    hidden: Sequence[int] = (64,),
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 0,
    progress: bool = False,
    device: str = "cpu",
) -> BalancedSteps:
    """Per distribution and W: one global batch of W * local_batch_size
    lengths, cut as the loader cuts it and balanced by each method on the
    model's FLOPs (`sequence_dense_flops`), every partition measured rank by
    rank at one thread on `device` ("cpu", "cuda" or "auto"; module docstring)."""
    check_int("local_batch_size", local_batch_size, low=1)
    device = resolve_device(device)
    options = {"width": width, "hidden": tuple(hidden), "warmup": warmup, "repeats": repeats, "threads": 1}
    options["device"] = device
    cases = [(name, spec, w) for name, spec in distributions.items() for w in world_sizes]
    if progress:
        from tqdm.auto import tqdm

        cases = tqdm(cases, desc="distribution x W", leave=False)
    runs, bounds, batches = {}, {}, {}
    for name, spec, w in cases:
        lengths = batches[(name, w)] = _draw(spec, w, local_batch_size, max_length, seed)
        flops = sequence_dense_flops(lengths, width, hidden).tolist()
        bound = equal_size_lower_bound(flops, w)
        bounds[(name, w)] = {"lower_bound": bound, "longest_sets_bound": max(flops) > sum(flops) / w}
        for method in MEASURED_METHODS:
            parts = _partition(flops, w, method)
            parts_lengths = [[lengths[i] for i in part] for part in parts]
            runs[(name, w, method)] = _measure(
                parts_lengths, lambda p: sequence_dense_flops(p, width, hidden), **options
            )
    config = {"local_batch_size": local_batch_size, "max_length": max_length, "seed": seed, **options}
    config["hidden"] = list(hidden)
    config["clock"] = primary_clock(device)
    return BalancedSteps(runs, bounds, batches, config)


@dataclass(frozen=True)
class CappedRun:
    """One distribution at one W: the cap (tokens per rank), and per run
    ("uncapped" KK + swaps, then each capped method) the measured step and
    each rank's peak activation bytes."""

    distribution: str
    world_size: int
    cap: float
    mean_tokens: float
    steps: dict[str, RankStep]
    peak_bytes: dict[str, list[int]]
    asked_over_mean: float | None = None  # the cap asked for, before it was raised to fit

    def cap_sentence(self) -> str:
        """What the cap was and what it did, from the numbers: raised or not,
        binding or not, its measured and FLOP-model cost, the peaks."""
        capped = list(CAPPED_METHODS)
        asked = self.asked_over_mean
        raised = asked is not None and self.cap > asked * self.mean_tokens * (1 + 1e-9)
        how = f"asked {asked:.2f}x, raised to fit an equal-count partition" if raised else "as asked"
        if not self.binds():
            did = (
                "it never binds: KK + swaps' uncapped partition already meets it, so the cap changed nothing"
            )
        else:
            cost = [self.cost(m) for m in capped]
            low, high = self.steps["kk_swap"].cost_range(self.steps["uncapped"])
            did = (
                f"it binds: KK + swaps under it cost {self.cost('kk_swap'):.2f}x measured "
                f"(repeats {low:.2f}-{high:.2f}x), "
                f"{self.flop_cost('kk_swap'):.3f}x by the FLOP model (every capped method: "
                f"{min(cost):.2f}x-{max(cost):.2f}x measured)"
            )
        peaks = [max(self.peak_bytes[m]) / 2**20 for m in capped]
        uncapped = max(self.peak_bytes["uncapped"]) / 2**20
        return (
            f"{self.distribution}, W={self.world_size}: "
            f"token cap {self.cap / self.mean_tokens:.2f}x the mean "
            f"({how}); {did}; largest peak memory {uncapped:.2f} MiB uncapped, "
            f"{min(peaks):.2f}-{max(peaks):.2f} MiB capped"
        )

    def cost(self, label: str) -> float:
        """A run's measured step over the uncapped one's (> 1: the cap costs time)."""
        return self.steps[label].step_ms / self.steps["uncapped"].step_ms

    def flop_cost(self, label: str) -> float:
        return max(self.steps[label].flops) / max(self.steps["uncapped"].flops)

    def binds(self) -> bool:
        """The uncapped partition holds more tokens on some rank than the cap."""
        return max(self.steps["uncapped"].tokens) > self.cap

    def memory_sentence(self) -> str:
        """Whether capping tokens lowered the largest measured peak memory, from the numbers."""
        uncapped = max(self.peak_bytes["uncapped"])
        lower = [label for label in CAPPED_METHODS if max(self.peak_bytes[label]) < uncapped]
        heaviest = max(range(self.world_size), key=self.peak_bytes["uncapped"].__getitem__)
        tokens = self.steps["uncapped"].tokens
        most = "the most" if tokens[heaviest] == max(tokens) else "not the most"
        return (
            f"{self.distribution}: the largest measured peak is {uncapped / 2**20:.2f} MiB uncapped, "
            f"on a rank holding {tokens[heaviest]} tokens ({most} of any rank); "
            f"under the cap it is lower for {', '.join(lower) or 'no method'}."
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "memory_sentence": self.memory_sentence(),
            "cap_sentence": self.cap_sentence(),
            "asked_over_mean": self.asked_over_mean,
            "distribution": self.distribution,
            "world_size": self.world_size,
            "cap": self.cap,
            "mean_tokens": self.mean_tokens,
            "binds": self.binds(),
            "runs": {label: dataclasses.asdict(step) for label, step in self.steps.items()},
            "peak_bytes": self.peak_bytes,
            "cost": {label: self.cost(label) for label in self.steps},
            "flop_cost": {label: self.flop_cost(label) for label in self.steps},
        }


def _capped_partitions(flops: list[float], lengths: list[int], world_size: int, cap: float) -> dict[str, Any]:
    """Every capped method's parts under `cap`, raised by 1% at a time while
    a method's repair finds no swap (a cap above every rank's tokens always
    fits); "cap" is the cap they all met."""
    while True:
        try:
            parts = {m: balance_capped(flops, lengths, world_size, cap, m) for m in CAPPED_METHODS}
            return {**parts, "cap": cap}
        except ValueError:
            cap *= 1.01


def measure_capped(
    steps: BalancedSteps, distribution: str, world_size: int, cap_over_mean: float
) -> CappedRun:
    """`distribution`'s global batch at `world_size` in `steps`: KK + swaps on
    the FLOPs without a cap (the run `steps` measured), then each of
    `CAPPED_METHODS` under a cap of `cap_over_mean` times the mean tokens
    per rank (raised to `capped.minimum_cap` where no partition fits under
    it, and 1% at a time where a method finds none), each measured rank
    by rank as `steps` measured (on its device), with each rank's peak
    activation memory (`steptime.memory`: on a GPU, max_memory_allocated
    with the peak reset per rank). A capped partition equal to the uncapped
    one reuses its measurement."""
    check_number("cap_over_mean", cap_over_mean, low=1)
    if (distribution, world_size) not in steps.lengths:
        raise ValueError(
            f"steps has no run of {distribution!r} at W={world_size}; runs: {sorted(steps.lengths)}"
        )
    config = steps.config
    width, hidden = config["width"], tuple(config["hidden"])
    device = config.get("device", "cpu")
    options = {k: config[k] for k in ("width", "hidden", "warmup", "repeats", "threads")}
    options["device"] = device
    lengths = steps.lengths[(distribution, world_size)]
    flops = sequence_dense_flops(lengths, width, hidden).tolist()
    mean = sum(lengths) / world_size
    cap = max(cap_over_mean * mean, minimum_cap(lengths, world_size))
    uncapped = balance(flops, world_size, "kk_swap")
    partitions = {"uncapped": uncapped, **_capped_partitions(flops, lengths, world_size, cap)}
    cap = partitions.pop("cap")
    measured, peaks = {}, {}
    for label, parts in partitions.items():
        parts_lengths = [[lengths[i] for i in part] for part in parts]
        same = sorted(map(sorted, parts)) == sorted(map(sorted, uncapped))
        if label == "uncapped" or same:
            measured[label] = steps.runs[(distribution, world_size, "kk_swap")]
            peaks[label] = peaks.get("uncapped") or peak_memory_partition(
                parts_lengths, width, hidden, device
            )
        else:
            measured[label] = _measure(
                parts_lengths, lambda p: sequence_dense_flops(p, width, hidden), **options
            )
            peaks[label] = peak_memory_partition(parts_lengths, width, hidden, device)
    return CappedRun(distribution, world_size, cap, mean, measured, peaks, cap_over_mean)


def _link_ms(world_size: int, kind: str, link_bytes: float, local_world_size: int) -> float:
    """ms to move `link_bytes` over one rank's link at torchrec's bandwidth
    for `kind` (`steptime.comms.LINK_MODEL`), hosts of `local_world_size`."""
    from torchrec.distributed.planner.types import BasicCommsBandwidths, CollectiveType

    bandwidth = BasicCommsBandwidths().get_bw(
        min(local_world_size, world_size), world_size, getattr(CollectiveType, kind)
    )
    return link_bytes / bandwidth  # bandwidth in bytes per ms


def worker_shares(
    steps: BalancedSteps, distribution: str, latency_ms: float, local_world_size: int = 8
) -> pd.DataFrame:
    """Per W of `steps`: the shuffle's phases for `distribution`'s batch
    (the workload all-gather's and the all-to-all exchange's bytes per rank,
    counted; KK + swaps timed here, natively where the extension loads;
    both collectives' ms computed by an alpha-beta link model: W - 1 ring
    steps of `latency_ms` each, plus the bytes at torchrec's bandwidths),
    the measured compute of the balanced step (KK + swaps, its clock), and
    the share of the shuffle a step that long would hide (computed:
    min(1, compute / shuffle))."""
    check_number("latency_ms", latency_ms, low=0)
    rows = []
    batch = steps.config["local_batch_size"]
    for w in sorted({w for name, w, _ in steps.runs if name == distribution}):
        lengths = steps.lengths[(distribution, w)]
        flops = sequence_dense_flops(lengths, steps.config["width"], steps.config["hidden"]).tolist()
        parts = balance(flops, w)
        kk_ms = 1e3 * median_seconds(lambda flops=flops, w=w: balance(flops, w), repeats=5)
        gather_bytes = w * batch * 8  # every rank's float64 workloads
        per_key = (
            torch.tensor(lengths, dtype=torch.int64)
            .view(w, batch, 1)
            .expand(w, batch, len(EXCHANGE_ITEM_BYTES))
        )
        moved = exchange_bytes(per_key, EXCHANGE_ITEM_BYTES, EXCHANGE_DENSE_BYTES, parts)["alltoall"]["max"]
        latency = (w - 1) * latency_ms  # a ring's W - 1 steps, each paying the link's latency
        gather_ms = latency + _link_ms(w, "ALL_GATHER", gather_bytes * (w - 1) / w, local_world_size)
        exchange_ms = latency + _link_ms(w, "ALL_TO_ALL", moved, local_world_size)
        shuffle_ms = gather_ms + kk_ms + exchange_ms
        compute_ms = steps.runs[(distribution, w, "kk_swap")].step_ms
        rows.append(
            {
                "world_size": w,
                "latency_ms": latency_ms,
                "gather_bytes": gather_bytes,
                "gather_ms_computed": gather_ms,
                "kk_ms_measured": kk_ms,
                "exchange_bytes": moved,
                "exchange_ms_computed": exchange_ms,
                "shuffle_ms": shuffle_ms,
                "compute_ms_measured": compute_ms,
                "hidden_share_computed": min(1.0, compute_ms / shuffle_ms),
            }
        )
    return pd.DataFrame(rows)


# recsys-examples' end-to-end benchmark, as its E2E_BENCHMARK.md states it at
# commit a84ae588 (PR #411, "benchmark: update HSTU benchmark fixes and docs")
RECSYS_E2E = {
    "source": "NVIDIA/recsys-examples a84ae5885bb891640133fd39ab1d4bb0681ac872, "
    "examples/hstu/training/benchmark/E2E_BENCHMARK.md (run of commit bc40d89c)",
    "baseline_tflops_per_gpu": 75.6,
    "shuffler_tflops_per_gpu": 115.8,
    "speedup": 1.53,
    "hardware": "2 nodes x 8 H100-SXM5-80GB (16 GPUs), bf16",
    "model": "HSTU, 8 layers, hidden 1024, 4 heads of 256, Triton attention, Adam; DynamicEmb tables",
    "lengths": "Zipf(1.2) jagged, max 4096, 32 samples per GPU",
    "max_length": 4096,
}


def speedup_sentences(table: pd.DataFrame) -> list[str]:
    """One sentence per distribution, from the numbers: at each W, KK +
    swaps' measured speed-up, the FLOP model's and the bound's, and where
    the longest sample sets the bound (and, where the table has
    `cost_fit`'s columns, what the fit predicts where measured passes the bound)."""
    sentences = []
    for name, rows in table[table["method"] == "kk_swap"].groupby("distribution", sort=False):
        parts = [
            f"W={r.world_size}: {r.measured:.2f}x measured, {r.flop_model:.2f}x by FLOPs, "
            f"bound {r.bound:.2f}x"
            + (" (set by the longest sample)" if r.longest_sets_bound else "")
            + (
                f" (above its FLOP bound; the per-rank cost fit predicts {r.fitted_model:.2f}x)"
                if getattr(r, "explanation", None)
                else ""
            )
            for r in rows.itertuples()
        ]
        sentences.append(f"{name}, KK + swaps over the loader's cut: " + "; ".join(parts) + ".")
    return sentences


def results(
    steps: BalancedSteps, capped: Sequence[CappedRun], shares: Mapping[str, pd.DataFrame]
) -> dict[str, Any]:
    """The measured sections' part of notebook 04's results JSON: raw
    per-rank numbers with the derived ones, so a test can recompute them."""
    table, fit = with_explanations(steps)
    return {
        "measured_config": steps.config,
        "measured_batches": [
            {"distribution": name, "world_size": w, "lengths": lengths}
            for (name, w), lengths in steps.lengths.items()
        ],
        "measured_runs": steps.records(),
        "measured_speedups": table.to_dict(orient="records"),
        "measured_sentences": speedup_sentences(table),
        "rank_cost_fit": fit.records(),
        "capped": [run.as_dict() for run in capped],
        "worker_shares": {name: frame.to_dict(orient="records") for name, frame in shares.items()},
        "recsys_e2e": RECSYS_E2E,
    }

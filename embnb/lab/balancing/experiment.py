"""Notebook 04's experiments: balancers compared on Zipf batches, KK timed,
the FLOP model checked, and one launch that gathers KJTs and trains every
mode on real ranks; then the notebook's results JSON.

    table = comparison_table([1024], [8], seeds=[0])        # every method's gap
    runs = run_training({"no balancing": TrainConfig(mode="none"), ...}, 4)
    runs.summaries()["no balancing"].step_seconds
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch.utils.flop_counter import FlopCounterMode

from embnb._checks import check_int
from embnb.balancing.kjt_alltoall import batch_exchange_bytes, compare_exchanges, zipf_batch
from embnb.balancing.kjt_gather import compare_gathers
from embnb.balancing.partition import balance
from embnb.balancing.shuffle import EXCHANGES
from embnb.balancing.timeline import phase_seconds
from embnb.balancing.training import (
    AttentionBlock,
    RunSummary,
    TrainConfig,
    slowest_rank_seconds,
    summarize_repeats,
    timed_steps,
    train,
)
from embnb.balancing.workloads import attention_block_flops
from embnb.cuda import loader
from embnb.dist import device_plan, launch, launch_each
from embnb.lab.balancing import comparison as comparison_results
from embnb.lab.balancing.overlap import overlap_cost
from embnb.lab.balancing.reference import kk_equal_count
from embnb.metrics import max_over_mean
from embnb.timing import Difference, median_seconds, paired_difference

__all__ = [
    "tail_share",
    "kk_trace_table",
    "KKTiming",
    "time_kk",
    "flop_model_check",
    "flops_balance",
    "Speedup",
    "TrainingRuns",
    "run_training",
    "ExchangeRuns",
    "run_exchanges",
    "exchange_bytes_by_world_size",
    "RunLabels",
    "Setup",
    "WorkedExamples",
    "Measurements",
    "results",
]


def tail_share(lengths: torch.Tensor, fraction: float = 0.01) -> float:
    """Share of all tokens held by the longest `fraction` of the samples."""
    longest_first = lengths.sort(descending=True).values
    return (
        longest_first[: max(1, int(len(longest_first) * fraction))].sum().item() / longest_first.sum().item()
    )


def kk_trace_table(workloads: Sequence[float], num_parts: int) -> pd.DataFrame:
    """The merges of `reference.kk_equal_count` on `workloads`, one row per
    merge: the two states popped (their sets' sums, heaviest first, and
    spread) and the merged state."""
    trace: list = []
    kk_equal_count(list(workloads), num_parts, trace)

    def sets(state: list) -> str:
        return "  ".join(f"{sum_:g} {sorted(workloads[i] for i in items)}" for sum_, items in state)

    return pd.DataFrame(
        [
            {
                "first (widest spread)": sets(first),
                "second": sets(second),
                "merged": sets(merged),
                "merged spread": merged[0][0] - merged[-1][0],
            }
            for first, second, merged in trace
        ],
        index=pd.RangeIndex(1, len(trace) + 1, name="merge"),
    )


@dataclass(frozen=True)
class KKTiming:
    """Median seconds of one `balance` call per backend, and whether the
    native and Python backends gave the same partition."""

    python_s: float
    native_s: float | None  # None: the native op is unavailable (loader.failure() says why)
    same_partition: bool | None

    def as_dict(self) -> dict[str, float]:
        return {"python": self.python_s, **({"native": self.native_s} if self.native_s is not None else {})}


def time_kk(workloads: Sequence[float], num_parts: int) -> KKTiming:
    python_s = median_seconds(lambda: balance(workloads, num_parts, native=False), repeats=5)
    if not loader.available():
        return KKTiming(python_s, None, None)
    native_s = median_seconds(lambda: balance(workloads, num_parts, native=True), repeats=20)
    same = balance(workloads, num_parts, native=True) == balance(workloads, num_parts, native=False)
    return KKTiming(python_s, native_s, same)


def flop_model_check(
    embedding_dim: int, ffn_dim: int, lengths: Sequence[int] = (1, 7, 64)
) -> tuple[int, float]:
    """(FLOPs torch's counter sees in one AttentionBlock forward, what
    `attention_block_flops` says) for samples of `lengths`."""
    block = AttentionBlock(embedding_dim, ffn_dim, num_heads=2)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        block(torch.randn(sum(lengths), embedding_dim), list(lengths))
    return counter.get_total_flops(), attention_block_flops(
        list(lengths), embedding_dim, ffn_dim
    ).sum().item()


def flops_balance(lengths: torch.Tensor, flops: torch.Tensor, num_parts: int) -> dict[str, float]:
    """FLOPs max/mean per rank when balancing by length vs by the FLOP model."""
    flops_list = flops.tolist()
    ratios = {}
    for name, estimate in {"length": lengths, "attention FLOPs": flops}.items():
        parts = balance(estimate, num_parts)
        ratios[f"by {name}"] = max_over_mean([sum(flops_list[i] for i in part) for part in parts])
    return ratios


@dataclass(frozen=True)
class Speedup:
    """One run's speed-up over a reference: the reference's mean step time
    over this run's (both means over the same repeats, so `ratio` follows
    from the printed ms per step), and the range of the per-repeat ratios."""

    ratio: float
    low: float
    high: float
    repeats: int

    def __str__(self) -> str:
        return f"{self.ratio:.2f}x (repeats {self.low:.2f}-{self.high:.2f}, {self.repeats})"

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TrainingRuns:
    """One launch: the KJT gathers, then every training run, `repeats`
    times over, interleaved (run a, b, c, a, b, c, ...) so that a slow
    moment of the machine hits every run alike."""

    backend: str
    seconds: float
    gathers: list[dict[str, Any]]  # compare_gathers per rank; empty when not run
    per_repeat: dict[str, list[list[dict[str, Any]]]]  # label -> per repeat -> train() per rank

    def ranks(self, label: str) -> list[dict[str, Any]]:
        """The first repeat of run `label`: train() per rank."""
        return self.per_repeat[label][0]

    def collective_calls(self) -> dict[str, int]:
        return self.gathers[0]["calls"]

    def gathers_identical(self) -> bool:
        return all(g["identical"] for g in self.gathers)

    def gather_ms(self) -> dict[str, float]:
        return {k: 1e3 * max(g["seconds"][k] for g in self.gathers) for k in self.collective_calls()}

    def summaries(self) -> dict[str, RunSummary]:
        """Each run summarized over all its repeats (`summarize_repeats`):
        its step time is `mean_step_ms`, its shuffle time the sum of the
        shuffle's phases in `phase_breakdown`."""
        return {label: summarize_repeats(repeats) for label, repeats in self.per_repeat.items()}

    def step_ms(self, label: str) -> list[float]:
        """Per repeat: run `label`'s mean step time (ms) over its timed steps,
        each step at its slowest rank."""
        repeats = self.per_repeat[label]
        timed = len(timed_steps(len(repeats[0][0]["step_seconds"])))
        return [1e3 * slowest_rank_seconds(ranks) / timed for ranks in repeats]

    def mean_step_ms(self, label: str) -> float:
        """Run `label`'s step time: the mean of `step_ms` over repeats."""
        return statistics.fmean(self.step_ms(label))

    def difference(self, a: str, b: str) -> Difference:
        """Run a's step time minus run b's (ms per step), paired per repeat."""
        return paired_difference(self.step_ms(a), self.step_ms(b))

    def flops_speedups(self, reference: str) -> dict[str, float]:
        """The speed-up each run would get if step time were its slowest
        rank's FLOPs: the reference's summed per-step max FLOPs over this
        run's, over the timed steps (FLOPs are the same every repeat)."""

        def max_flops(label: str) -> float:
            ranks = self.ranks(label)
            steps = timed_steps(len(ranks[0]["step_flops"]))
            return sum(max(r["step_flops"][s] for r in ranks) for s in steps)

        return {label: max_flops(reference) / max_flops(label) for label in self.per_repeat}

    def phase_breakdown(self) -> pd.DataFrame:
        """One row per (run, thread, phase): ms per timed step, the mean over
        repeats of the mean over timed steps and ranks (means, so that the
        shuffle's phases add up to `summaries()`' shuffle time)."""
        rows = []
        for label, repeats in self.per_repeat.items():
            steps = timed_steps(len(repeats[0][0]["step_seconds"]))
            per_repeat = [
                phase_seconds((s for rank in ranks for s in rank["spans"]), steps, len(ranks))
                for ranks in repeats
            ]
            for key in dict.fromkeys(k for phases in per_repeat for k in phases):
                if key[1] == "step":
                    continue
                ms = statistics.fmean(1e3 * phases.get(key, 0.0) for phases in per_repeat)
                rows.append({"run": label, "thread": key[0], "phase": key[1], "ms": ms})
        return pd.DataFrame(rows, columns=["run", "thread", "phase", "ms"])

    def speedups(self, reference: str) -> dict[str, Speedup]:
        """Per run: the reference run's `mean_step_ms` over this run's, and
        the range of the per-repeat ratios (the same global batches in every
        run and repeat); > 1 means faster than `reference`."""
        if reference not in self.per_repeat:
            raise ValueError(f"reference {reference!r} is not a run; runs: {list(self.per_repeat)}")
        ref_ms = self.step_ms(reference)
        result = {}
        for label in self.per_repeat:
            ratios = [r / m for r, m in zip(ref_ms, self.step_ms(label))]
            mean_ratio = statistics.fmean(ref_ms) / self.mean_step_ms(label)
            result[label] = Speedup(mean_ratio, min(ratios), max(ratios), len(ratios))
        return result

    def same_weights(self, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
        """Whether every run trained rank 0 to the first run's weights."""
        first = self.ranks(next(iter(self.per_repeat)))[0]["weights"]
        return all(
            torch.allclose(repeat[0]["weights"], first, rtol=rtol, atol=atol)
            for repeats in self.per_repeat.values()
            for repeat in repeats
        )

    def spans(self, label: str) -> list[dict[str, Any]]:
        return [span for rank in self.ranks(label) for span in rank["spans"]]


def run_training(
    configs: Mapping[str, TrainConfig],
    world_size: int,
    gather_kwargs: Mapping[str, Any] | None = None,
    device: str = "auto",
    repeats: int = 1,
    timeout_s: float = 1800,
) -> TrainingRuns:
    """`compare_gathers` (unless `gather_kwargs` is None), then `train` once
    per config, `repeats` times over, in one launch (spawning ranks takes
    seconds each time)."""
    check_int("repeats", repeats, low=1)
    backend = device_plan(device, world_size).backend
    gather_calls = [] if gather_kwargs is None else [(_gathers, (dict(gather_kwargs),))]
    train_calls = [(train, (config,)) for _ in range(repeats) for config in configs.values()]
    start = time.perf_counter()
    outcomes = launch_each(gather_calls + train_calls, world_size, device=device, timeout_s=timeout_s)
    seconds = time.perf_counter() - start
    gathers = outcomes.pop(0) if gather_calls else []
    labels = list(configs)
    per_repeat = {label: outcomes[i :: len(labels)] for i, label in enumerate(labels)}
    return TrainingRuns(backend, seconds, gathers, per_repeat)


def _gathers(rank: int, world_size: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    return compare_gathers(rank, world_size, **kwargs)


@dataclass(frozen=True)
class ExchangeRuns:
    """`kjt_alltoall.compare_exchanges` per world size (one launch each)."""

    per_world_size: dict[int, list[dict[str, Any]]]  # world size -> per rank

    def identical(self) -> bool:
        return all(r["identical"] for ranks in self.per_world_size.values() for r in ranks)

    def ms(self) -> dict[int, dict[str, dict[str, float]]]:
        """World size -> exchange -> ms median, low, high, each the slowest rank's."""
        return {
            w: {
                name: {k: 1e3 * max(r["seconds"][name][k] for r in ranks) for k in ("median", "low", "high")}
                for name in EXCHANGES
            }
            for w, ranks in self.per_world_size.items()
        }

    def records(self) -> list[dict[str, Any]]:
        """One row per (world size, exchange): ms median, low, high (slowest
        rank) and, for the all-to-all, the most bytes a rank received."""
        rows = []
        for w, by_name in self.ms().items():
            for name, times in by_name.items():
                row = {"world_size": w, "exchange": name, **{f"ms_{k}": v for k, v in times.items()}}
                if name == "alltoall":
                    row["measured_bytes_max"] = max(r["alltoall_bytes"] for r in self.per_world_size[w])
                rows.append(row)
        return rows

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.records())


def run_exchanges(
    world_sizes: Sequence[int], device: str = "auto", timeout_s: float = 600, **kwargs: Any
) -> ExchangeRuns:
    """`compare_exchanges(**kwargs)` on each world size, one launch each."""
    return ExchangeRuns(
        {w: launch(_exchanges, w, kwargs, device=device, timeout_s=timeout_s) for w in world_sizes}
    )


def _exchanges(rank: int, world_size: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    return compare_exchanges(rank, world_size, **kwargs)


def exchange_bytes_by_world_size(
    world_sizes: Sequence[int], batch_size: int, seed: int = 0, **batch: Any
) -> dict[int, dict[str, float]]:
    """World size -> exchange -> the most bytes a rank receives, for the
    `zipf_batch` each of W ranks would have, balanced by KK: computed from
    sizes (`kjt_alltoall.exchange_bytes`), no ranks run."""
    result = {}
    for w in world_sizes:
        check_int("world_size", w, low=1)
        batches = [zipf_batch(r, batch_size, seed=seed, **batch) for r in range(w)]
        parts = balance(torch.cat([workloads for _, _, workloads in batches]), w)
        counted = batch_exchange_bytes([(kjts, dense) for kjts, dense, _ in batches], parts)
        result[w] = {name: counted[name]["max"] for name in EXCHANGES}
    return result


@dataclass(frozen=True)
class RunLabels:
    """Which of notebook 04's runs plays which part in its results."""

    unbalanced: str  # the reference of every speed-up
    sync: str  # balanced, shuffle on the training loop
    overlapped: str  # balanced, shuffle in the worker


@dataclass(frozen=True)
class Setup:
    """What notebook 04 ran: the training's shape and the length
    distributions of the comparison (name -> spec)."""

    world_size: int
    batch_size: int
    zipf_alpha: float  # the training's lengths are Zipf(zipf_alpha)
    steps: int
    distributions: Mapping[str, Any]


@dataclass(frozen=True)
class WorkedExamples:
    """The small cases notebook 04 works through before the real run."""

    kk_sums: dict[str, list[float]]  # part sums of the KK example, per method
    kk_bounds: dict[str, float]  # and its lower bounds
    max_over_mean: dict[str, float]  # the example batch's max/mean per method
    flop_model: tuple[int, float]  # (torch's FLOP counter, the formula)
    crossover_length: int  # where attention's FLOPs equal the rest
    longer_than_crossover: dict[str, float]  # share of samples past it, per distribution
    flops_max_over_mean: dict[str, dict[str, float]]
    kk_timing: KKTiming


@dataclass(frozen=True)
class Measurements:
    """What notebook 04 measured on real ranks, and which run is which."""

    comparison: pd.DataFrame  # comparison.comparison_table
    training: TrainingRuns
    exchanges: ExchangeRuns
    exchange_bytes: dict[int, dict[str, float]]  # world size -> bytes per exchange
    labels: RunLabels


def _summary_line(
    imbalance: dict[str, Any],
    runs: TrainingRuns,
    labels: RunLabels,
    exchange_bytes: dict[int, dict[str, float]],
) -> str:
    """One line of what was measured, for `make run`: the paired overlap -
    sync difference and what overlap cost first, the speed-ups after."""
    speedups = runs.speedups(labels.unbalanced)
    flops_ideal = runs.flops_speedups(labels.unbalanced)
    cost = overlap_cost(runs, labels.overlapped, labels.sync)
    largest = max(exchange_bytes)
    pct = comparison_results.percent

    def worst(name: str, method: str) -> str:
        return pct(imbalance[name]["tokens"][method]["max_gap_to_lower_bound"])

    gaps = "; ".join(
        f"{name} tokens, worst gap to bound: KK {worst(name, 'karmarkar_karp')}, "
        f"LPT {worst(name, 'greedy_lpt')}, KK+swaps {worst(name, 'kk_swap')}"
        for name in imbalance
    )
    return (
        f"real run ({runs.backend}): {cost.sentence()}; ms/step (mean of {cost.difference['repeats']}): "
        + ", ".join(f"{label} {runs.mean_step_ms(label):.1f}" for label in runs.per_repeat)
        + f"; {labels.sync} {speedups[labels.sync].ratio:.2f}x and {labels.overlapped} "
        f"{speedups[labels.overlapped].ratio:.2f}x over {labels.unbalanced} (FLOPs predict "
        f"{flops_ideal[labels.sync]:.2f}x); {gaps}; all-to-all receives "
        f"{exchange_bytes[largest]['alltoall'] / exchange_bytes[largest]['allgather']:.1%} of all-gather's "
        f"bytes at W={largest}"
    )


def results(setup: Setup, examples: WorkedExamples, measured: Measurements, seconds: float) -> dict[str, Any]:
    """Notebook 04's results JSON: its key numbers, for `make run` and the
    tests. Per length distribution where a number depends on it; the real
    run trains on Zipf(zipf_alpha) lengths."""
    runs, labels = measured.training, measured.labels
    compared = comparison_results.results(measured.comparison)
    summaries = runs.summaries()
    difference = runs.difference(labels.overlapped, labels.sync)
    return {
        "summary": _summary_line(compared["imbalance"], runs, labels, measured.exchange_bytes),
        "world_size": setup.world_size,
        "batch_size": setup.batch_size,
        "zipf_alpha": setup.zipf_alpha,
        "steps": setup.steps,
        "timed_steps": list(timed_steps(setup.steps)),
        "repeats": difference.repeats,
        "backend": runs.backend,
        "native_kk": examples.kk_timing.native_s is not None,
        "distributions": {name: dataclasses.asdict(spec) for name, spec in setup.distributions.items()},
        "kk_example_sums": examples.kk_sums,
        "kk_example_bounds": examples.kk_bounds,
        **compared,
        "example_max_over_mean": examples.max_over_mean,
        "flop_model_matches_counter": bool(examples.flop_model[0] == examples.flop_model[1]),
        "crossover_length": examples.crossover_length,
        "longer_than_crossover": examples.longer_than_crossover,
        "flops_max_over_mean": examples.flops_max_over_mean,
        "kk_seconds": examples.kk_timing.as_dict(),
        "collective_calls": runs.collective_calls(),
        "gathers_identical": runs.gathers_identical(),
        "gather_ms": runs.gather_ms(),
        "exchanges": measured.exchanges.records(),
        "exchanges_identical": measured.exchanges.identical(),
        "exchange_bytes": {str(w): b for w, b in measured.exchange_bytes.items()},
        "runs": [{"label": label, **s.as_dict()} for label, s in summaries.items()],
        "labels": dataclasses.asdict(labels),
        "step_ms": {label: runs.step_ms(label) for label in runs.per_repeat},
        "mean_step_ms": {label: runs.mean_step_ms(label) for label in runs.per_repeat},
        "step_speedup_vs": labels.unbalanced,
        "step_speedups": {label: s.as_dict() for label, s in runs.speedups(labels.unbalanced).items()},
        "flops_ideal_speedups": runs.flops_speedups(labels.unbalanced),
        "overlap_minus_sync_ms": difference.as_dict(),
        "overlap_cost": overlap_cost(runs, labels.overlapped, labels.sync).as_dict(),
        "phase_ms": runs.phase_breakdown().to_dict(orient="records"),
        "same_weights": runs.same_weights(),
        "hidden_fraction": summaries[labels.overlapped].hidden_fraction,
        "seconds": seconds,
    }

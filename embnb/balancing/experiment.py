"""Notebook 04's experiments: balancers compared on Zipf batches, KK timed,
the FLOP model checked, and one launch that gathers KJTs and trains every
mode on real ranks; then the notebook's results JSON.

    table = comparison_table([1024], [8], seeds=[0])        # every method's gap
    runs = run_training({"no balancing": TrainConfig(mode="none"), ...}, 4)
    runs.summaries()["no balancing"].step_seconds
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch.utils.flop_counter import FlopCounterMode

from embnb._checks import check_int
from embnb.balancing.kjt_gather import compare_gathers
from embnb.balancing.partition import METHODS, balance
from embnb.balancing.training import (
    AttentionBlock,
    RunSummary,
    TrainConfig,
    slowest_rank_seconds,
    summarize,
    train,
)
from embnb.balancing.workloads import attention_block_flops, compare_methods
from embnb.dist import device_plan, launch_each
from embnb.metrics import max_over_mean
from embnb.native import loader
from embnb.timing import Ratio, median_seconds, paired_ratio

__all__ = [
    "tail_share",
    "comparison_table",
    "KKTiming",
    "time_kk",
    "flop_model_check",
    "flops_balance",
    "TrainingRuns",
    "run_training",
    "results",
]


def tail_share(lengths: torch.Tensor, fraction: float = 0.01) -> float:
    """Share of all tokens held by the longest `fraction` of the samples."""
    longest_first = lengths.sort(descending=True).values
    return (
        longest_first[: max(1, int(len(longest_first) * fraction))].sum().item() / longest_first.sum().item()
    )


# workloads.compare_methods' parameters: it runs that over the grid, with a progress bar.
def comparison_table(
    sample_counts: Sequence[int],
    part_counts: Sequence[int],
    seeds: Sequence[int] = (0,),
    alpha: float = 1.5,
    max_length: int = 8192,
    progress: bool = False,
) -> pd.DataFrame:
    """`workloads.compare_methods` over every (samples, parts), one row per
    (num_samples, num_parts, seed, method); `progress` shows a tqdm bar."""
    grid = list(itertools.product(sample_counts, part_counts))
    if progress:
        from tqdm.auto import tqdm

        grid = tqdm(grid, desc="balancing")
    rows = [row for n, k in grid for row in compare_methods([n], [k], seeds, alpha, max_length)]
    return pd.DataFrame(rows)


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
    python_s = median_seconds(lambda: balance(workloads, num_parts, backend="python"), repeats=5)
    if not loader.available():
        return KKTiming(python_s, None, None)
    native_s = median_seconds(lambda: balance(workloads, num_parts, backend="native"), repeats=20)
    same = balance(workloads, num_parts, backend="native") == balance(workloads, num_parts, backend="python")
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
        """Each run's first repeat, summarized."""
        return {label: summarize(self.ranks(label)) for label in self.per_repeat}

    def speedups(self, reference: str) -> dict[str, Ratio]:
        """Per run: the reference run's time over this run's, each repeat's
        steps at their slowest rank (the same global batches in every run);
        > 1 means faster than `reference`."""
        if reference not in self.per_repeat:
            raise ValueError(f"reference {reference!r} is not a run; runs: {list(self.per_repeat)}")
        seconds = {
            label: [slowest_rank_seconds(ranks) for ranks in repeats]
            for label, repeats in self.per_repeat.items()
        }
        return {label: paired_ratio(seconds[reference], seconds[label]) for label in seconds}

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


def results(
    *,
    world_size: int,
    batch_size: int,
    zipf_alpha: float,
    steps: int,
    comparison: pd.DataFrame,
    example_max_over_mean: dict[str, float],
    flop_model: tuple[int, float],
    flops_max_over_mean: dict[str, float],
    kk_timing: KKTiming,
    runs: TrainingRuns,
    unbalanced_label: str,
    overlapped_label: str,
    seconds: float,
) -> dict[str, Any]:
    """Notebook 04's results JSON: its key numbers, for `make run` and the tests."""
    imbalance = {
        method: {
            "mean_gap_to_lower_bound": float(rows["gap_to_lower_bound"].mean()),
            "max_gap_to_lower_bound": float(rows["gap_to_lower_bound"].max()),
            "max_gap_to_equal_size_bound": float(rows["gap_to_equal_size_bound"].max()),
            "mean_max_over_mean": float(rows["max_over_mean"].mean()),
        }
        for method, rows in comparison.groupby("method")
    }
    summaries = runs.summaries()
    speedups = runs.speedups(unbalanced_label)
    hidden = summaries[overlapped_label].hidden_fraction
    calls = runs.collective_calls()
    gaps = {m: imbalance[m]["max_gap_to_lower_bound"] for m in METHODS if m in imbalance}
    summary = (
        f"max gap to bound: contiguous {gaps.get('contiguous', float('nan')):.1%}, "
        f"LPT {gaps.get('greedy_lpt', float('nan')):.2%}, "
        f"KK {gaps.get('karmarkar_karp', float('nan')):.2%}, "
        f"KK+swaps {gaps.get('kk_swap', float('nan')):.2%}; "
        f"{hidden:.0%} of KK hidden; step speed-up {speedups[overlapped_label]}; "
        f"KJT gather {calls['fused']} vs {calls['per_key']} collectives"
    )
    return {
        "summary": summary,
        "world_size": world_size,
        "batch_size": batch_size,
        "zipf_alpha": zipf_alpha,
        "steps": steps,
        "repeats": len(runs.per_repeat[unbalanced_label]),
        "backend": runs.backend,
        "native_kk": kk_timing.native_s is not None,
        "imbalance": imbalance,
        "imbalance_rows": comparison.to_dict(orient="records"),
        "example_max_over_mean": example_max_over_mean,
        "flop_model_matches_counter": bool(flop_model[0] == flop_model[1]),
        "flops_max_over_mean": flops_max_over_mean,
        "kk_seconds": kk_timing.as_dict(),
        "collective_calls": calls,
        "gathers_identical": runs.gathers_identical(),
        "gather_ms": runs.gather_ms(),
        "runs": [{"label": label, **s.as_dict()} for label, s in summaries.items()],
        "step_speedup_vs": unbalanced_label,
        "step_speedups": {label: ratio.as_dict() for label, ratio in speedups.items()},
        "same_weights": runs.same_weights(),
        "hidden_fraction": float(hidden),
        "seconds": seconds,
    }

"""Notebook 04's experiments: KK traced and timed, the FLOP model checked, one launch
that gathers KJTs and trains every mode on real ranks, the two exchanges.

    runs = run_training({"no balancing": TrainConfig(mode="none"), ...}, 4)
    runs.summaries()["no balancing"].step_seconds
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from embnb._checks import check_int
from embnb.balancing.kjt_alltoall import batch_exchange_bytes, compare_exchanges, zipf_batch
from embnb.balancing.kjt_gather import compare_gathers
from embnb.balancing.partition import balance
from embnb.balancing.shuffle import EXCHANGES
from embnb.balancing.timeline import SHUFFLE_PHASES, phase_seconds
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
from embnb.lab.balancing.reference import kk_equal_count
from embnb.metrics import max_over_mean
from embnb.timing import Difference, median_seconds, paired_difference

__all__ = ["TrainingRuns", "run_training", "ExchangeRuns", "run_exchanges", "exchange_bytes_by_world_size"]


def tail_share(lengths: torch.Tensor, fraction: float = 0.01) -> float:
    """Share of all tokens held by the longest `fraction` of the samples."""
    longest_first = lengths.sort(descending=True).values
    return (
        longest_first[: max(1, int(len(longest_first) * fraction))].sum().item() / longest_first.sum().item()
    )


def kk_trace_table(workloads: Sequence[float], num_parts: int) -> pd.DataFrame:
    """A row per merge of `reference.kk_equal_count`: the two states popped and the merged one."""
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
    """Median seconds of one `balance` call per backend; whether both gave one partition."""

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
    """(torch's FLOP counter on one AttentionBlock forward, `attention_block_flops`).

    Counted under the math attention backend: on torch 2.14 a 3-D CPU scaled_dot_product_attention
    runs a flash kernel that FlopCounterMode counts as 0 FLOPs."""
    block = AttentionBlock(embedding_dim, ffn_dim, num_heads=2)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
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
    """A reference's mean step time over a run's (so `ratio` follows from the printed ms per
    step), and the range of the per-repeat ratios."""

    ratio: float
    low: float
    high: float
    repeats: int

    def __str__(self) -> str:
        return f"{self.ratio:.2f}x (repeats {self.low:.2f}-{self.high:.2f}, {self.repeats})"


@dataclass(frozen=True)
class OverlapCost:
    """What overlapping the shuffle cost the step as well as what it hid: per run
    (overlapped, sync) the loop's forward, backward and wait and the shuffle's
    phases summed (either thread), ms per timed step and rank; and the paired step
    difference overlapped - sync first, since "never waited for" is a proxy (on a CPU
    the worker shares its rank's core, so the forward and the shuffle can grow)."""

    overlapped: str
    sync: str
    main_ms: dict[str, dict[str, float]]  # run -> loop phase -> ms
    shuffle_ms: dict[str, float]  # run -> the shuffle's phases, summed
    hidden_fraction: float  # of the overlapped shuffle, never waited for
    difference: dict[str, Any]  # timing.Difference.as_dict()


COMPUTE_PHASES = ("forward", "backward")


@dataclass(frozen=True)
class TrainingRuns:
    """One launch: the KJT gathers, then every training run `repeats` times, interleaved
    (a, b, c, a, b, c, ...) so that a slow moment of the machine hits every run alike."""

    backend: str
    seconds: float
    gathers: list[dict[str, Any]]  # compare_gathers per rank; empty when not run
    per_repeat: dict[str, list[list[dict[str, Any]]]]  # label -> per repeat -> train() per rank
    also: dict[str, list[Any]] = dataclasses.field(default_factory=dict)  # run_training's `also`, per rank

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
        """Each run over all its repeats (`summarize_repeats`)."""
        return {label: summarize_repeats(repeats) for label, repeats in self.per_repeat.items()}

    def step_ms(self, label: str) -> list[float]:
        """Per repeat: the mean step time (ms) over the timed steps, each at its slowest rank."""
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
        """The speed-up each run would get if a step took its slowest rank's FLOPs."""

        def max_flops(label: str) -> float:
            ranks = self.ranks(label)
            steps = timed_steps(len(ranks[0]["step_flops"]))
            return sum(max(r["step_flops"][s] for r in ranks) for s in steps)

        return {label: max_flops(reference) / max_flops(label) for label in self.per_repeat}

    def phase_breakdown(self) -> pd.DataFrame:
        """A row per (run, thread, phase): ms per timed step, the mean over repeats, steps and
        ranks (means, so that the shuffle's phases add up to `summaries()`' shuffle time)."""
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
        """Per run: its `Speedup` over `reference` (the same global batches in every run)."""
        if reference not in self.per_repeat:
            raise ValueError(f"reference {reference!r} is not a run; runs: {list(self.per_repeat)}")
        ref_ms = self.step_ms(reference)
        result = {}
        for label in self.per_repeat:
            ratios = [r / m for r, m in zip(ref_ms, self.step_ms(label))]
            mean_ratio = statistics.fmean(ref_ms) / self.mean_step_ms(label)
            result[label] = Speedup(mean_ratio, min(ratios), max(ratios), len(ratios))
        return result

    def table(self, reference: str) -> pd.DataFrame:
        """A row per run: ms per step (mean over repeats), the speed-up over `reference` with its
        repeats' range, what the slowest rank's FLOPs predict, the shuffle's ms and hidden share."""
        speedups, flops = self.speedups(reference), self.flops_speedups(reference)
        summaries = self.summaries()
        return pd.DataFrame(
            [
                {
                    "run": label,
                    "ms_per_step": self.mean_step_ms(label),
                    "speedup": speedups[label].ratio,
                    "speedup_low": speedups[label].low,
                    "speedup_high": speedups[label].high,
                    "flops_predict": flops[label],
                    "shuffle_ms": 1e3 * summaries[label].shuffle_seconds,
                    "hidden_fraction": summaries[label].hidden_fraction,
                }
                for label in self.per_repeat
            ]  # fmt: skip
        ).set_index("run")

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

    def overlap_cost(self, overlapped: str, sync: str) -> OverlapCost:
        """The two runs' loop phases and shuffle time (`phase_breakdown`), and their paired difference."""
        breakdown = self.phase_breakdown()
        main_ms, shuffle_ms = {}, {}
        for label in (overlapped, sync):
            rows = breakdown[breakdown["run"] == label]
            main = rows[rows["thread"] == "main"].set_index("phase")["ms"]
            main_ms[label] = {phase: float(main.get(phase, 0.0)) for phase in (*COMPUTE_PHASES, "wait")}
            shuffle_ms[label] = float(rows[rows["phase"].isin(SHUFFLE_PHASES)]["ms"].sum())
        hidden = self.summaries()[overlapped].hidden_fraction
        difference = self.difference(overlapped, sync).as_dict()
        return OverlapCost(overlapped, sync, main_ms, shuffle_ms, hidden, difference)


def run_training(
    configs: Mapping[str, TrainConfig],
    world_size: int,
    gather_kwargs: Mapping[str, Any] | None = None,
    device: str = "auto",
    repeats: int = 1,
    timeout_s: float = 1800,
    also: Mapping[str, tuple[Callable, tuple]] | None = None,
) -> TrainingRuns:
    """`compare_gathers` (unless `gather_kwargs` is None), then each of `also` (name ->
    (fn, args), called as fn(rank, world_size, *args); its per-rank results in
    `TrainingRuns.also`), then `train` per config, `repeats` times over, all in one
    launch (spawning ranks takes seconds each time)."""
    check_int("repeats", repeats, low=1)
    backend = device_plan(device, world_size).backend
    also = dict(also or {})
    calls = [] if gather_kwargs is None else [(_gathers, (dict(gather_kwargs),))]
    calls += list(also.values()) + [(train, (config,)) for _ in range(repeats) for config in configs.values()]
    start = time.perf_counter()
    outcomes = launch_each(calls, world_size, device=device, timeout_s=timeout_s)
    seconds = time.perf_counter() - start
    gathers = outcomes.pop(0) if gather_kwargs is not None else []
    also_results = {name: outcomes.pop(0) for name in also}
    labels = list(configs)
    per_repeat = {label: outcomes[i :: len(labels)] for i, label in enumerate(labels)}
    return TrainingRuns(backend, seconds, gathers, per_repeat, also_results)


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
        """A row per (W, exchange): `ms`, and for the all-to-all the most bytes a rank received."""
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
    world_sizes: Sequence[int],
    device: str = "auto",
    timeout_s: float = 600,
    ran: Mapping[int, list[dict[str, Any]]] | None = None,
    **kwargs: Any,
) -> ExchangeRuns:
    """`compare_exchanges(**kwargs)` on each world size, one launch each, but for those
    in `ran` (W -> per-rank results of `exchange_call(**kwargs)` in another launch)."""
    ran = ran or {}
    return ExchangeRuns(
        {
            w: ran[w] if w in ran else launch(_exchanges, w, kwargs, device=device, timeout_s=timeout_s)
            for w in world_sizes
        }
    )


def exchange_call(**kwargs: Any) -> tuple[Callable, tuple]:
    """`compare_exchanges(**kwargs)` as a call for `run_training`'s `also`."""
    return _exchanges, (kwargs,)


def _exchanges(rank: int, world_size: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    return compare_exchanges(rank, world_size, **kwargs)


def exchange_bytes_by_world_size(
    world_sizes: Sequence[int], batch_size: int, seed: int = 0, **batch: Any
) -> dict[int, dict[str, float]]:
    """W -> exchange -> the most bytes a rank receives for W ranks' `zipf_batch`es balanced by
    KK, computed from sizes (`kjt_alltoall.exchange_bytes`), no ranks run."""
    result = {}
    for w in world_sizes:
        check_int("world_size", w, low=1)
        batches = [zipf_batch(r, batch_size, seed=seed, **batch) for r in range(w)]
        parts = balance(torch.cat([workloads for _, _, workloads in batches]), w)
        counted = batch_exchange_bytes([(kjts, dense) for kjts, dense, _ in batches], parts)
        result[w] = {name: counted[name]["max"] for name in EXCHANGES}
    return result

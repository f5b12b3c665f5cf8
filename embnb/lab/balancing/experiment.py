"""Notebook 04's experiments (balancers compared, KK timed, the FLOP model
checked, one launch that gathers KJTs and trains every mode on real ranks)
and its results JSON, built from one dataclass per part of the page.

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
from embnb.lab.balancing import comparison as comparison_results
from embnb.lab.balancing import gpu_runs, measured
from embnb.lab.balancing.reference import kk_equal_count
from embnb.metrics import max_over_mean
from embnb.timing import Difference, median_seconds, paired_difference

__all__ = ["TrainingRuns", "run_training", "ExchangeRuns", "run_exchanges", "BalancerNotebook", "results"]


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

    def sentence(self) -> str:
        d, o, s = self.difference, self.overlapped, self.sync
        grew = ", ".join(
            f"{phase} {self.main_ms[s][phase]:.2f} -> {self.main_ms[o][phase]:.2f} ms"
            for phase in COMPUTE_PHASES
        )
        return (
            f"{o} - {s}: {d['mean']:+.2f} ms/step (95% CI {d['ci_low']:+.2f} to {d['ci_high']:+.2f}, "
            f"{'excludes' if d['excludes_zero'] else 'includes'} zero, {d['repeats']} repeats); what overlap "
            f"cost the loop ({s} -> {o}): {grew}; the shuffle took {self.shuffle_ms[o]:.2f} ms in the worker "
            f"against {self.shuffle_ms[s]:.2f} ms on the loop, and {self.hidden_fraction:.0%} of the "
            "worker's was never waited for"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "sentence": self.sentence()}


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


@dataclass(frozen=True)
class RunLabels:
    """Which of notebook 04's runs plays which part in its results."""

    unbalanced: str = "no balancing"  # the reference of every speed-up
    sync: str = "sync"  # balanced, shuffle on the training loop
    overlapped: str = "overlap"  # balanced, shuffle in the worker


@dataclass(frozen=True)
class Setup:
    """The real run's shape, and the comparison's length distributions (name -> spec)."""

    world_size: int
    batch_size: int
    zipf_alpha: float  # the real run's lengths are Zipf(zipf_alpha)
    steps: int
    distributions: Mapping[str, Any]


@dataclass(frozen=True)
class WorkedExamples:
    """Sections 2-4: the small cases worked through before the real run."""

    kk_example_sums: dict[str, list[float]]  # part sums of the KK example, per method
    kk_example_bounds: dict[str, float]  # and its lower bounds
    example_max_over_mean: dict[str, float]  # the example batch's max/mean per method
    flop_model: tuple[int, float]  # (torch's FLOP counter, the formula)
    crossover_length: int  # where attention's FLOPs equal the rest
    longer_than_crossover: dict[str, float]  # share of samples past it, per distribution
    flops_max_over_mean: dict[str, dict[str, float]]
    kk_timing: KKTiming
    crossover_by_width: pd.DataFrame  # comparison.crossover_by_width
    page_core: dict[str, bool]  # reference.page_core_agrees


@dataclass(frozen=True)
class Measurements:
    """Sections 3, 5-7: the comparison and what ran on real ranks."""

    comparison: pd.DataFrame  # comparison.comparison_table
    training: TrainingRuns
    exchanges: ExchangeRuns
    exchange_bytes: dict[int, dict[str, float]]  # world size -> bytes per exchange
    exchange_sentence: str  # gpu_runs.exchange_sentence
    labels: RunLabels = RunLabels()


@dataclass(frozen=True)
class RankByRank:
    """Sections 8-10: the step measured rank by rank, the caps, the worker's share, the GPU runs."""

    steps: Any  # measured.BalancedSteps
    capped: list[Any]  # measured.CappedRun per distribution
    cap_comparisons: list[Any]  # memory_cap.CapComparison per distribution
    worker_shares: dict[str, pd.DataFrame]
    gpu_speedups: pd.DataFrame  # gpu_runs.gpu_speedups
    gpu_exchanges: pd.DataFrame  # gpu_runs.gpu_exchanges
    gpu_hstu: pd.DataFrame  # gpu_runs.gpu_hstu


@dataclass(frozen=True)
class BalancerNotebook:
    """Everything notebook 04's results JSON reports, gathered section by section."""

    setup: Setup
    examples: WorkedExamples
    measured: Measurements
    rank_by_rank: RankByRank


def _summary(notebook: BalancerNotebook, imbalance: dict[str, Any], rank_by_rank: dict[str, Any]) -> str:
    """One line of what was measured, for `make run`: what contradicts the CPU headline (the
    GPU runs) first, then the paired overlap - sync difference and its cost, the speed-ups after."""
    runs, labels, counted = (
        notebook.measured.training,
        notebook.measured.labels,
        notebook.measured.exchange_bytes,
    )
    speedups, flops_ideal = runs.speedups(labels.unbalanced), runs.flops_speedups(labels.unbalanced)
    cost, largest, pct = (
        runs.overlap_cost(labels.overlapped, labels.sync),
        max(counted),
        comparison_results.percent,
    )

    def worst(name: str, method: str) -> str:
        return pct(imbalance[name]["tokens"][method]["max_gap_to_lower_bound"])

    gaps = "; ".join(
        f"{name} tokens, worst gap to bound: KK {worst(name, 'karmarkar_karp')}, "
        f"LPT {worst(name, 'greedy_lpt')}, KK+swaps {worst(name, 'kk_swap')}"
        for name in imbalance
    )
    steps = ", ".join(f"{label} {runs.mean_step_ms(label):.1f}" for label in runs.per_repeat)
    caps = [c["cap_sentence"] for c in rank_by_rank["capped"]]
    caps += [c.sentence() for c in notebook.rank_by_rank.cap_comparisons]
    ratio = counted[largest]["alltoall"] / counted[largest]["allgather"]
    parts = [
        gpu_runs.gpu_sentence(notebook.rank_by_rank.gpu_speedups),
        gpu_runs.hstu_sentence(notebook.rank_by_rank.gpu_hstu),
        f"real run ({runs.backend}): {cost.sentence()}",
        f"ms/step (mean of {cost.difference['repeats']}): {steps}",
        f"{labels.sync} {speedups[labels.sync].ratio:.2f}x and {labels.overlapped} "
        f"{speedups[labels.overlapped].ratio:.2f}x over {labels.unbalanced} "
        f"(FLOPs predict {flops_ideal[labels.sync]:.2f}x)",
        gaps,
        f"all-to-all receives {ratio:.1%} of all-gather's bytes at W={largest}",
        " ".join(rank_by_rank["measured_sentences"]) + " Caps: " + "; ".join(caps) + ".",
    ]
    return "; ".join(parts)


def results(notebook: BalancerNotebook, seconds: float) -> dict[str, Any]:
    """Notebook 04's results JSON: its key numbers, per length distribution where a
    number depends on it, and the raw ones a test recomputes them from."""
    setup, examples, section = notebook.setup, notebook.examples, notebook.measured
    runs, labels, rank_by_rank = section.training, section.labels, notebook.rank_by_rank
    compared = comparison_results.results(section.comparison)
    summaries = runs.summaries()
    measured_part = measured.results(rank_by_rank.steps, rank_by_rank.capped, rank_by_rank.worker_shares)
    derived = ("flop_model", "kk_timing", "crossover_by_width")  # recorded below, as what they show
    example_records = {
        f.name: getattr(examples, f.name) for f in dataclasses.fields(examples) if f.name not in derived
    }
    return {
        "summary": _summary(notebook, compared["imbalance"], measured_part),
        **dataclasses.asdict(setup),
        "timed_steps": list(timed_steps(setup.steps)),
        "repeats": len(runs.step_ms(labels.unbalanced)),
        "backend": runs.backend,
        "native_kk": examples.kk_timing.native_s is not None,
        **compared,
        **example_records,
        "flop_model_matches_counter": bool(examples.flop_model[0] == examples.flop_model[1]),
        "kk_seconds": examples.kk_timing.as_dict(),
        "crossover_by_width": examples.crossover_by_width.to_dict("records"),
        "collective_calls": runs.collective_calls(),
        "gathers_identical": runs.gathers_identical(),
        "gather_ms": runs.gather_ms(),
        "exchanges": section.exchanges.records(),
        "exchanges_identical": section.exchanges.identical(),
        "exchange_bytes": {str(w): b for w, b in section.exchange_bytes.items()},
        "exchange_sentence": section.exchange_sentence,
        "runs": [{"label": label, **s.as_dict()} for label, s in summaries.items()],
        "labels": dataclasses.asdict(labels),
        "step_ms": {label: runs.step_ms(label) for label in runs.per_repeat},
        "mean_step_ms": {label: runs.mean_step_ms(label) for label in runs.per_repeat},
        "step_speedup_vs": labels.unbalanced,
        "step_speedups": {k: dataclasses.asdict(s) for k, s in runs.speedups(labels.unbalanced).items()},
        "flops_ideal_speedups": runs.flops_speedups(labels.unbalanced),
        "overlap_minus_sync_ms": runs.difference(labels.overlapped, labels.sync).as_dict(),
        "overlap_cost": runs.overlap_cost(labels.overlapped, labels.sync).as_dict(),
        "phase_ms": runs.phase_breakdown().to_dict(orient="records"),
        "same_weights": runs.same_weights(),
        "hidden_fraction": summaries[labels.overlapped].hidden_fraction,
        **measured_part,
        "cap_comparisons": [c.as_dict() for c in rank_by_rank.cap_comparisons],
        "gpu_rank_by_rank": rank_by_rank.gpu_speedups.to_dict("records"),
        "gpu_exchanges": rank_by_rank.gpu_exchanges.to_dict("records"),
        "gpu_hstu": rank_by_rank.gpu_hstu.to_dict("records"),
        "seconds": seconds,
    }

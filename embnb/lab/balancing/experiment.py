"""Notebook 04's experiments and appendix 04a's: the FLOP model checked, KK timed, and on real ranks
one launch that trains every mode (`run_training(configs, 2).table("none")`), the two exchanges.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from embnb._checks import check_int
from embnb.balancing import training
from embnb.balancing.kjt_alltoall import batch_exchange_bytes, zipf_batch
from embnb.balancing.partition import balance
from embnb.balancing.shuffle import EXCHANGES
from embnb.balancing.timeline import SHUFFLE_PHASES, hidden_fraction, phase_seconds
from embnb.balancing.training import TrainConfig, timed_steps
from embnb.balancing.workloads import attention_block_flops
from embnb.cuda import loader
from embnb.dist import device_plan, launch_each
from embnb.metrics import max_over_mean
from embnb.timing import Difference, median_seconds, paired_difference

__all__ = ["TrainingRuns", "run_training", "exchange_bytes_by_world_size"]


def time_kk(workloads: Sequence[float], num_parts: int) -> dict[str, Any]:
    """Median seconds of one `balance` (KK + swaps) call per backend ("native_s" None where the op
    is unavailable: `loader.failure()` says why) and whether both gave one partition."""
    python_s = median_seconds(lambda: balance(workloads, num_parts, native=False), repeats=5)
    if not loader.available():
        return {"python_s": python_s, "native_s": None, "same_partition": None}
    native_s = median_seconds(lambda: balance(workloads, num_parts, native=True), repeats=20)
    same = balance(workloads, num_parts, native=True) == balance(workloads, num_parts, native=False)
    return {"python_s": python_s, "native_s": native_s, "same_partition": same}


def flop_model_check(embedding_dim: int, ffn_dim: int, lengths: Sequence[int] = (1, 7, 64)) -> tuple:
    """(torch's FLOP counter on one AttentionBlock forward, `attention_block_flops`). Counted under
    the math attention backend: on torch 2.14 a 3-D CPU scaled_dot_product_attention runs a flash
    kernel that FlopCounterMode counts as 0 FLOPs."""
    block = training.AttentionBlock(embedding_dim, ffn_dim, num_heads=2)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        block(torch.randn(sum(lengths), embedding_dim), list(lengths))
    formula = attention_block_flops(list(lengths), embedding_dim, ffn_dim).sum().item()
    return counter.get_total_flops(), formula


def flops_balance(lengths: torch.Tensor, flops: torch.Tensor, num_parts: int) -> dict[str, float]:
    """FLOPs max/mean per rank when KK + swaps balances the lengths, and when it balances the FLOPs."""
    estimates = {"by length": lengths, "by attention FLOPs": flops}
    return {
        k: max_over_mean([flops[part].sum().item() for part in balance(v, num_parts)])
        for k, v in estimates.items()
    }


@dataclass(frozen=True)
class TrainingRuns:
    """One launch: `run_training`'s `also`, then every training run `repeats` times, interleaved
    (a, b, c, a, b, c, ...) so that a slow moment of the machine hits every run alike."""

    backend: str
    per_repeat: dict[str, list[list[dict[str, Any]]]]  # label -> per repeat -> train() per rank
    also: dict[str, list[Any]] = field(default_factory=dict)  # run_training's `also`, per rank

    def gather_check(self) -> dict[str, Any]:
        """The fused gather against the per-key one (`also["gathers"]`): collective calls, identical
        KJTs, the slowest rank's ms."""
        gathers, calls = self.also["gathers"], self.also["gathers"][0]["calls"]
        ms = {k: 1e3 * max(g["seconds"][k] for g in gathers) for k in calls}
        return {"calls": calls, "identical": all(g["identical"] for g in gathers), "ms": ms}

    def summaries(self) -> dict[str, dict[str, Any]]:
        """Per run: its config's mode, native_kk, exchange and shuffle_group; the shuffle's seconds per
        timed step and rank (gather + KK + exchange in either thread, the mean over repeats: the sum of
        `phase_breakdown`'s), and the share of the shuffle's time the loop never waited for over every
        repeat (`timeline.hidden_fraction`; None without a shuffle)."""
        breakdown = self.phase_breakdown()
        shuffle_ms = breakdown[breakdown["phase"].isin(SHUFFLE_PHASES)].groupby("run")["ms"].sum()
        result = {}
        for label, repeats in self.per_repeat.items():
            spans = [
                dict(s, rank=(i, r["rank"]))
                for i, ranks in enumerate(repeats)
                for r in ranks
                for s in r["spans"]
            ]
            hidden = hidden_fraction(spans)
            config = {k: repeats[0][0][k] for k in ("mode", "native_kk", "exchange", "shuffle_group")}
            result[label] = config | {
                "shuffle_seconds": shuffle_ms.get(label, 0.0) / 1e3,
                "hidden_fraction": None if math.isnan(hidden) else hidden,
            }
        return result

    def step_ms(self, label: str) -> list[float]:
        """Per repeat: the mean step time (ms) over the timed steps, each at its slowest rank."""
        return [1e3 * statistics.fmean(training.slowest_rank(ranks)) for ranks in self.per_repeat[label]]

    def difference(self, a: str, b: str) -> Difference:
        """Run a's step time minus run b's (ms per step), paired per repeat."""
        return paired_difference(self.step_ms(a), self.step_ms(b))

    def flops_speedups(self, reference: str) -> dict[str, float]:
        """The speed-up each run would get if a step took its slowest rank's FLOPs (first repeat)."""
        flops = {k: sum(training.slowest_rank(r[0], "step_flops")) for k, r in self.per_repeat.items()}
        return {label: flops[reference] / f for label, f in flops.items()}

    def phase_breakdown(self) -> pd.DataFrame:
        """A row per (run, thread, phase): ms per timed step, the mean over repeats, steps and ranks
        (means, so that the shuffle's phases add up to `summaries()`' shuffle time)."""
        rows = []
        for label, repeats in self.per_repeat.items():
            steps = timed_steps(len(repeats[0][0]["step_seconds"]))
            spans = [[s for r in ranks for s in r["spans"]] for ranks in repeats]
            each = [phase_seconds(s, steps, len(ranks)) for s, ranks in zip(spans, repeats)]
            for key in dict.fromkeys(k for phases in each for k in phases if k[1] != "step"):
                ms = statistics.fmean(1e3 * phases.get(key, 0.0) for phases in each)
                rows.append({"run": label, "thread": key[0], "phase": key[1], "ms": ms})
        return pd.DataFrame(rows, columns=["run", "thread", "phase", "ms"])

    def table(self, reference: str) -> pd.DataFrame:
        """A row per run: ms per step (mean over repeats); the speed-up over `reference` (the ratio of
        the means) with the range of the per-repeat ratios; what the slowest rank's FLOPs predict; the
        shuffle's ms per step and the share of it the loop never waited for. Raises ValueError on an
        unknown `reference`."""
        if reference not in self.per_repeat:
            raise ValueError(f"reference {reference!r} is not a run; runs: {list(self.per_repeat)}")
        ms = pd.DataFrame({label: self.step_ms(label) for label in self.per_repeat})  # a row per repeat
        ratios = ms.rdiv(ms[reference], axis=0)  # per repeat, the reference's ms over each run's
        summaries = pd.DataFrame(self.summaries()).T
        return pd.DataFrame(
            {
                "ms_per_step": ms.mean(),
                "speedup": ms[reference].mean() / ms.mean(),
                "speedup_low": ratios.min(),
                "speedup_high": ratios.max(),
                "flops_predict": pd.Series(self.flops_speedups(reference)),
                "shuffle_ms": 1e3 * summaries["shuffle_seconds"].astype(float),
                "hidden_fraction": summaries["hidden_fraction"],
            }
        ).rename_axis("run")

    def same_weights(self, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
        """Whether every run trained rank 0 to the first run's weights."""
        first, runs = next(iter(self.per_repeat.values()))[0][0]["weights"], self.per_repeat.values()
        return all(torch.allclose(r[0]["weights"], first, rtol=rtol, atol=atol) for rs in runs for r in rs)

    def spans(self, label: str) -> list[dict[str, Any]]:
        """Every span of run `label`'s first repeat, all ranks (for `figures.timeline`)."""
        return [span for rank in self.per_repeat[label][0] for span in rank["spans"]]


def run_training(
    configs: Mapping[str, TrainConfig],
    world_size: int,
    device: str = "auto",
    repeats: int = 1,
    timeout_s: float = 1800,
    also: Mapping[str, Callable] | None = None,
) -> TrainingRuns:
    """Each of `also` (name -> fn, called as fn(rank, world_size): e.g. a `functools.partial` of
    `kjt_gather.compare_gathers`), then `train` per config, `repeats` times over, all in one launch
    (spawning ranks takes seconds each time). Raises ValueError on repeats < 1."""
    check_int("repeats", repeats, low=1)
    also = dict(also or {})
    calls = [(fn, ()) for fn in also.values()]
    calls += [(training.train, (c,)) for _ in range(repeats) for c in configs.values()]
    outcomes = launch_each(calls, world_size, device=device, timeout_s=timeout_s)
    also_results = {name: outcomes.pop(0) for name in also}
    per_repeat = {label: outcomes[i :: len(configs)] for i, label in enumerate(configs)}
    return TrainingRuns(device_plan(device, world_size).backend, per_repeat, also_results)


def exchange_records(per_world_size: Mapping[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """`kjt_alltoall.compare_exchanges`' per-rank results per W: a row per (W, exchange) with ms median,
    low and high (the slowest rank's), whether every rank received identical batches, and for the
    all-to-all the most bytes a rank received."""
    return [
        {"world_size": w, "exchange": name, "identical": all(r["identical"] for r in ranks)}
        | {f"ms_{k}": 1e3 * max(r["seconds"][name][k] for r in ranks) for k in ("median", "low", "high")}
        | ({"measured_bytes_max": max(r["alltoall_bytes"] for r in ranks)} if name == "alltoall" else {})
        for w, ranks in per_world_size.items()
        for name in EXCHANGES
    ]


def exchange_bytes_by_world_size(
    world_sizes: Sequence[int], batch_size: int, seed: int = 0, **batch: Any
) -> dict[int, dict[str, float]]:
    """W -> exchange -> the most bytes a rank receives for W ranks' `zipf_batch`es balanced by KK
    + swaps, counted from sizes (`kjt_alltoall.batch_exchange_bytes`), no ranks run."""
    result = {}
    for w in world_sizes:
        check_int("world_size", w, low=1)
        batches = [zipf_batch(r, batch_size, seed=seed, **batch) for r in range(w)]
        parts = balance(torch.cat([workloads for _, _, workloads in batches]), w)
        counted = batch_exchange_bytes([(kjts, dense) for kjts, dense, _ in batches], parts)
        result[w] = {name: counted[name]["max"] for name in EXCHANGES}
    return result

"""A cap on what sets a rank's peak memory: activation bytes, not tokens.

A rank's measured peak (`steptime.memory`) also holds what grows faster
than its tokens (attention works on a whole sample at once, and
`SequenceDense` runs the samples of one length together). So the cap here is
on **modelled activation bytes per rank**, each sample's
`per_token * L + per_token_squared * L**2`, fitted by non-negative least
squares (with a constant for what every step allocates, such as the
gradients) to peaks measured for single samples on the steps' device. A
rank's modelled bytes are its samples' sum, an estimate of what its forward
keeps for backward; `compare_caps` measures the real peaks beside the
uncapped and token-capped partitions of `measured.measure_capped`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from embnb._checks import check_number
from embnb.balancing.capped import balance_capped, minimum_cap, part_tokens
from embnb.balancing.partition import balance
from embnb.lab.balancing.measured import CappedRun, RankStep, StepConfig, same_parts, until_it_fits
from embnb.steptime.memory import peak_step_bytes

__all__ = ["ActivationModel", "CapComparison", "compare_caps"]

MIB = 2**20


@dataclass(frozen=True)
class ActivationModel:
    """Peak bytes of one sample of L tokens, fixed + per_token * L +
    per_token_squared * L**2, fitted to the measured peaks of single samples
    (`lengths`, `measured`) of `SequenceDense(width, hidden)` on `device`."""

    fixed: float
    per_token: float
    per_token_squared: float
    lengths: list[int]
    measured: list[int]
    device: str

    @classmethod
    def fit(cls, lengths: Sequence[int], width: int, hidden: Sequence[int], device: str) -> ActivationModel:
        if len(set(lengths)) < 3:
            raise ValueError(f"need at least 3 distinct lengths to fit 3 terms, got {sorted(set(lengths))}")
        measured = [peak_step_bytes([n], width, hidden, device) for n in lengths]
        x = np.asarray(lengths, dtype=float)
        design = np.stack([np.ones_like(x), x, x * x], axis=1)
        # non-negative terms: a sample never frees more than it allocates
        fixed, linear, square = nnls(design, np.asarray(measured, dtype=float))[0]
        return cls(float(fixed), float(linear), float(square), list(lengths), measured, device)

    def sample_bytes(self, lengths: Sequence[int]) -> list[float]:
        """Each sample's modelled activation bytes (the constant left out: every rank pays it once)."""
        return [self.per_token * n + self.per_token_squared * n * n for n in lengths]

    def max_relative_residual(self) -> float:
        """The fit's largest error on the lengths it was fitted to, relative to the measured peak."""
        predicted = [self.fixed + b for b in self.sample_bytes(self.lengths)]
        return max(abs(p - m) / m for p, m in zip(predicted, self.measured))


@dataclass(frozen=True)
class CapComparison:
    """One batch at one W: "uncapped" KK + swaps, KK + swaps under the
    "token cap" (from `measured.measure_capped`) and under the "bytes cap";
    per run the measured step, each rank's measured peak bytes and its
    modelled activation bytes."""

    distribution: str
    world_size: int
    model: ActivationModel
    token_cap: float  # tokens per rank (`measure_capped`'s)
    bytes_cap: float  # modelled activation bytes per rank
    mean_bytes: float
    steps: dict[str, RankStep]
    peak_bytes: dict[str, list[int]]
    modelled_bytes: dict[str, list[float]]

    def binds(self) -> bool:
        """The uncapped partition models more bytes on some rank than the cap."""
        return max(self.modelled_bytes["uncapped"]) > self.bytes_cap

    def cost(self, label: str) -> float:
        return self.steps[label].step_ms / self.steps["uncapped"].step_ms

    def cost_range(self, label: str) -> tuple[float, float]:
        """The cost's range from the repeats (`RankStep.cost_range`)."""
        return self.steps[label].cost_range(self.steps["uncapped"])

    def largest_peak_mib(self, label: str) -> float:
        return max(self.peak_bytes[label]) / MIB

    def rank_errors(self) -> list[float]:
        """Per rank of every run, (fixed + modelled bytes) over the measured
        peak, minus 1: how far the summed per-sample model is from the peak."""
        return [
            (self.model.fixed + modelled) / peak - 1
            for label in self.steps
            for modelled, peak in zip(self.modelled_bytes[label], self.peak_bytes[label])
        ]

    def as_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["runs"] = record.pop("steps")
        return {
            **record, "model_max_relative_residual": self.model.max_relative_residual(),
            "binds": self.binds(),
            "cost": {label: self.cost(label) for label in self.steps},
            "cost_range": {label: list(self.cost_range(label)) for label in self.steps},
            "largest_peak_mib": {label: self.largest_peak_mib(label) for label in self.steps},
            "rank_errors": self.rank_errors(),
        }  # fmt: skip


def compare_caps(
    lengths: Sequence[int],
    token_run: CappedRun,
    model: ActivationModel,
    config: StepConfig,
    cap_over_mean: float,
) -> CapComparison:
    """`lengths` (the batch `token_run` capped, loader order) balanced by FLOPs with KK +
    swaps under `cap_over_mean` times the mean modelled bytes per rank (raised to the
    least cap an equal-count partition fits under, then 1% at a time while the repair
    finds no swap), measured as `config` says. A partition already measured is reused."""
    check_number("cap_over_mean", cap_over_mean, low=1)
    world_size, flops = token_run.world_size, config.flops(lengths).tolist()
    sample_bytes = model.sample_bytes(lengths)
    mean = sum(sample_bytes) / world_size
    capped, cap = until_it_fits(
        lambda cap: balance_capped(flops, sample_bytes, world_size, cap, "kk_swap"),
        max(cap_over_mean * mean, minimum_cap(sample_bytes, world_size)),
    )
    partitions = {  # both measured by `measure_capped` (balance_capped is deterministic)
        "uncapped": balance(flops, world_size, "kk_swap"),
        "token cap": balance_capped(flops, lengths, world_size, token_run.cap, "kk_swap"),
    }
    steps = {"uncapped": token_run.steps["uncapped"], "token cap": token_run.steps["kk_swap"]}
    peaks = {"uncapped": token_run.peak_bytes["uncapped"], "token cap": token_run.peak_bytes["kk_swap"]}
    reuse = [label for label, parts in partitions.items() if same_parts(parts, capped)]
    if reuse:  # the same partition: its measurement, not a second draw of the clock's noise
        partitions["bytes cap"], steps["bytes cap"], peaks["bytes cap"] = (
            d[reuse[0]] for d in (partitions, steps, peaks)
        )
    else:
        partitions["bytes cap"] = capped
        steps["bytes cap"], peaks["bytes cap"] = (
            config.measure(lengths, capped),
            config.peaks(lengths, capped),
        )
    modelled = {label: part_tokens(sample_bytes, parts) for label, parts in partitions.items()}
    return CapComparison(
        token_run.distribution, world_size, model, token_run.cap, cap, mean, steps, peaks, modelled
    )


def cap_table(capped: Sequence[CappedRun], comparisons: Sequence[CapComparison]) -> pd.DataFrame:
    """A row per (distribution, cap, run): the cap over the mean, whether it binds, the largest
    tokens, the largest measured peak (MiB), the step's cost against the uncapped KK + swaps, and
    whether the peak fell below the uncapped one (only a binding cap can lower it)."""
    rows = [
        {"distribution": r.distribution, "cap": "tokens", "run": label,
         "cap_over_mean": r.cap / r.mean_tokens, "binds": r.binds(), "max_tokens": max(step.tokens),
         "peak_mib": max(r.peak_bytes[label]) / MIB,
         "cost": r.cost(label), "lowers_peak": r.binds() and r.lowers_peak(label)}
        for r in capped
        for label, step in r.steps.items()
        if label != "uncapped"
    ]  # fmt: skip
    rows += [
        {"distribution": c.distribution, "cap": cap, "run": label, "cap_over_mean": over_mean,
         "binds": binds, "max_tokens": max(c.steps[label].tokens), "peak_mib": c.largest_peak_mib(label),
         "cost": c.cost(label),
         "lowers_peak": binds and c.largest_peak_mib(label) < c.largest_peak_mib("uncapped")}
        for c in comparisons
        for cap, label, over_mean, binds in [
            ("none", "uncapped", None, False),
            ("modelled bytes", "bytes cap", c.bytes_cap / c.mean_bytes, c.binds()),
        ]
    ]  # fmt: skip
    return (
        pd.DataFrame(rows).set_index(["distribution", "cap", "run"]).sort_index(level=0, sort_remaining=False)
    )

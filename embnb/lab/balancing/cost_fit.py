"""Does a rank's time follow its work? Least squares over measured ranks.

`fit_rank_time(rows, features)` fits ms = sum(coefficient * feature) over
rows of per-rank numbers (each a dict with "ms" and the features). Two uses:

- `WORK` (GFLOPs and a constant per rank): the acceptance check. Where the
  constant (`fixed_share`: the fit's constant over the mean measured rank) is
  most of a rank's time, the step is bound by overhead (launches), not by the
  work a balancer moves, and a speed-up measured there says nothing about
  balancing;
- `WORK_AND_LENGTHS` (also distinct lengths and tokens: `SequenceDense` runs
  one group of kernels per distinct length): what a rank pays beside its
  FLOPs, which is why a measured speed-up can pass the FLOP model's bound.

    fit = fit_rank_time(rank_rows(steps), WORK)
    fit.fixed_share, fit.max_relative_residual
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["WORK", "WORK_AND_LENGTHS", "RankTimeFit", "fit_rank_time", "rank_rows"]

WORK = ("gflops", "per_rank")
WORK_AND_LENGTHS = ("gflops", "distinct_lengths", "tokens", "per_rank")


@dataclass(frozen=True)
class RankTimeFit:
    """Fitted ms per unit of each feature, over `ranks` ranks; r is the correlation of
    measured ms with GFLOPs; `fixed_share` the constant over the mean measured ms."""

    features: list[str]
    coefficients: dict[str, float]
    ranks: int
    r: float
    fixed_share: float
    max_relative_residual: float

    def predict(self, row: Mapping[str, float]) -> float:
        return sum(c * row[f] for f, c in self.coefficients.items())

    def asdict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fit_rank_time(rows: Sequence[Mapping[str, float]], features: Sequence[str] = WORK) -> RankTimeFit:
    """Least squares (the pseudo-inverse: columns may be collinear) of ms over `features`;
    "per_rank" is the constant 1. `rows`: per-rank dicts with "ms" and the other features."""
    if len(rows) < 2:
        raise ValueError(f"need at least 2 ranks to fit, got {len(rows)}")
    x = torch.tensor(
        [[1.0 if f == "per_rank" else float(r[f]) for f in features] for r in rows], dtype=torch.float64
    )
    y = torch.tensor([float(r["ms"]) for r in rows], dtype=torch.float64)
    beta = torch.linalg.pinv(x) @ y
    fitted = x @ beta
    gflops = torch.tensor([float(r["gflops"]) for r in rows], dtype=torch.float64)
    r = float(torch.corrcoef(torch.stack([gflops, y]))[0, 1]) if gflops.std() > 0 and y.std() > 0 else 0.0
    coefficients = dict(zip(features, beta.tolist()))
    return RankTimeFit(
        list(features),
        coefficients,
        len(rows),
        r,
        coefficients.get("per_rank", 0.0) / float(y.mean()),
        float(((y - fitted).abs() / y).max()),
    )


def rank_rows(runs: Mapping[Any, Any]) -> list[dict[str, float]]:
    """One row per rank of every `measured.RankStep` in `runs`: its ms on its clock and its work."""
    return [
        {"ms": ms, "gflops": f / 1e9, "distinct_lengths": n, "tokens": t, "per_rank": 1.0}
        for step in runs.values()
        for ms, f, n, t in zip(step.rank_ms, step.flops, step.distinct_lengths, step.tokens)
    ]

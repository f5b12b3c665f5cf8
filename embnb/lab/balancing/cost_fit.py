"""Does a rank's time follow its work? Least squares over measured ranks.

`fit_rank_time(rows, features)` fits ms = sum(coefficient * feature) over per-rank rows (dicts with
"ms" and the features). `WORK` (GFLOPs and a constant per rank) is the acceptance check of issue 70:
where the constant is most of a rank's time (`fixed_share`), the step is bound by fixed costs
(launches), not by the work a balancer moves, and a speed-up measured there says nothing about
balancing. `WORK_AND_LENGTHS` adds distinct lengths and tokens (`SequenceDense` runs one group of
kernels per distinct length): what a rank pays beside its FLOPs.

    fit = fit_rank_time(rank_rows(steps.runs), WORK)
    fit.fixed_share, fit.max_relative_residual
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["WORK", "WORK_AND_LENGTHS", "FIXED_SHARE_LIMIT", "RankTimeFit", "fit_rank_time", "rank_rows"]

WORK = ("gflops", "per_rank")
WORK_AND_LENGTHS = ("gflops", "distinct_lengths", "tokens", "per_rank")
FIXED_SHARE_LIMIT = 0.10  # issue 70's acceptance check for a dense block: the fixed part at most 10%


@dataclass(frozen=True)
class RankTimeFit:
    """Fitted ms per unit of each feature over `ranks` ranks; `r` the correlation of measured ms
    with GFLOPs; `fixed_share` the constant over the mean measured ms."""

    features: list[str]
    coefficients: dict[str, float]
    ranks: int
    r: float
    fixed_share: float
    max_relative_residual: float

    def predict(self, row: Mapping[str, float]) -> float:
        return sum(c * row[f] for f, c in self.coefficients.items())


def fit_rank_time(rows: Sequence[Mapping[str, float]], features: Sequence[str] = WORK) -> RankTimeFit:
    """Least squares (minimum norm: columns may be collinear) of ms over `features`; "per_rank" is
    the constant 1. Raises ValueError on fewer than 2 rows."""
    if len(rows) < 2:
        raise ValueError(f"need at least 2 ranks to fit, got {len(rows)}")
    x = np.array([[1.0 if f == "per_rank" else float(r[f]) for f in features] for r in rows])
    y, gflops = (np.array([float(r[k]) for r in rows]) for k in ("ms", "gflops"))
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    r = float(np.corrcoef(gflops, y)[0, 1]) if gflops.std() > 0 and y.std() > 0 else 0.0
    coefficients = dict(zip(features, beta.tolist()))
    fixed_share = coefficients.get("per_rank", 0.0) / float(y.mean())
    return RankTimeFit(
        list(features), coefficients, len(rows), r, fixed_share, float((abs(y - x @ beta) / y).max())
    )


def rank_rows(runs: Mapping[Any, Any]) -> list[dict[str, float]]:
    """One row per rank of every `measured.RankStep` in `runs`: its ms on its clock and its work."""
    return [
        {"ms": ms, "gflops": f / 1e9, "distinct_lengths": n, "tokens": t, "per_rank": 1.0}
        for step in runs.values()
        for ms, f, n, t in zip(step.rank_ms, step.flops, step.distinct_lengths, step.tokens)
    ]


def time_vs_work(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per source of `ranks` (rows of source, ms, gflops; one per measured rank): the `WORK` fit's
    fixed ms and ms per GFLOP, r, the fixed share of the mean rank, the achieved TFLOPS (all GFLOPs
    over all ms), and whether time follows work (fixed share at most `FIXED_SHARE_LIMIT`)."""
    rows = []
    for source, group in ranks.groupby("source", sort=False):
        fit = fit_rank_time(group.to_dict("records"), WORK)
        rows.append(
            {"source": source, "ranks": fit.ranks, "r": fit.r, "fixed_ms": fit.coefficients["per_rank"],
             "ms_per_gflop": fit.coefficients["gflops"], "fixed_share": fit.fixed_share,
             "tflops": group["gflops"].sum() / group["ms"].sum(),  # GFLOP per ms = TFLOP per s
             "time_follows_work": fit.fixed_share <= FIXED_SHARE_LIMIT}
        )  # fmt: skip
    return pd.DataFrame(rows).set_index("source")

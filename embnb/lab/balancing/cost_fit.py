"""Why a measured speed-up can pass the FLOP model's bound, fitted from the
measured ranks: `SequenceDense` runs one group of kernels per distinct length
in a rank's samples, so a rank's time has a per-length term (and a per-token
one: copies, the loss) that FLOPs do not count, and balancing FLOPs moves them.
`fit_rank_cost` fits ms = a * GFLOPs + b * distinct lengths + c * tokens + d
over every measured rank (least squares) and predicts each step as the slowest
fitted rank; `explain` says, for a speed-up above its bound, what the fit says.

    fit = fit_rank_cost(balanced_steps)
    fit.predicted_speedup("zipf", 16, "kk_swap")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

__all__ = ["FEATURES", "RankCostFit", "fit_rank_cost", "explain", "with_explanations"]

FEATURES = ("gflops", "distinct_lengths", "tokens", "per_rank")


def _features(step: Any) -> torch.Tensor:
    return torch.tensor(
        [[f / 1e9, n, t, 1.0] for f, n, t in zip(step.flops, step.distinct_lengths, step.tokens)],
        dtype=torch.float64,
    )


@dataclass(frozen=True)
class RankCostFit:
    """The fitted ms per unit of each of `FEATURES` and, per run
    (distribution, W, method), each rank's fitted ms."""

    coefficients: dict[str, float]
    fitted_ms: dict[tuple[str, int, str], list[float]]
    measured_ms: dict[tuple[str, int, str], list[float]]

    def predicted_speedup(self, distribution: str, world_size: int, method: str) -> float:
        """The cut's slowest fitted rank over `method`'s."""
        cut = self.fitted_ms[(distribution, world_size, "contiguous")]
        return max(cut) / max(self.fitted_ms[(distribution, world_size, method)])

    def max_abs_rank_residual(self) -> float:
        """The largest |measured - fitted| / measured over every rank."""
        return max(
            abs(m - f) / m
            for key, fitted in self.fitted_ms.items()
            for m, f in zip(self.measured_ms[key], fitted)
        )

    def records(self) -> dict[str, Any]:
        return {
            "features": list(FEATURES),
            "coefficients": self.coefficients,
            "max_abs_rank_residual": self.max_abs_rank_residual(),
            "runs": [
                {"distribution": n, "world_size": w, "method": m, "fitted_ms": fitted}
                for (n, w, m), fitted in self.fitted_ms.items()
            ],
        }


def fit_rank_cost(steps: Any) -> RankCostFit:
    """Least squares over every rank of every run of `steps` (`measured.BalancedSteps`)."""
    keys = list(steps.runs)
    x = torch.cat([_features(steps.runs[k]) for k in keys])
    y = torch.tensor([ms for k in keys for ms in steps.runs[k].rank_ms], dtype=torch.float64)
    # the pseudo-inverse: least squares even where columns are collinear
    # (one sample per rank: distinct lengths == 1 == the constant)
    beta = torch.linalg.pinv(x) @ y
    fitted = {k: (_features(steps.runs[k]) @ beta).tolist() for k in keys}
    measured = {k: list(steps.runs[k].rank_ms) for k in keys}
    return RankCostFit(dict(zip(FEATURES, beta.tolist())), fitted, measured)


def explain(fit: RankCostFit, steps: Any, row: Any) -> str | None:
    """For a row of `BalancedSteps.speedups()` whose measured speed-up passes its FLOP
    bound: why, from the fit, the slowest rank and the repeats' spread (else None)."""
    if row.measured <= row.bound:
        return None
    cut = steps.runs[(row.distribution, row.world_size, "contiguous")]
    ms = cut.rank_ms
    slowest = max(range(len(ms)), key=ms.__getitem__)
    heaviest = max(range(len(cut.flops)), key=cut.flops.__getitem__)
    c = fit.coefficients
    predicted = fit.predicted_speedup(row.distribution, row.world_size, row.method)
    low, high = cut.cost_range(steps.runs[(row.distribution, row.world_size, row.method)])
    verdict = (
        "so the fitted terms account for passing the bound"
        if predicted > row.bound
        else "so the fitted terms do not account for it, and neither does the FLOP model: what is left is "
        "the clock's spread or a cost neither models"
    )
    return (
        f"measured {row.measured:.2f}x (repeats {low:.2f}x-{high:.2f}x) "
        f"passes the FLOP bound {row.bound:.2f}x: "
        f"in the loader's cut the slowest measured rank ({slowest}, {cut.distinct_lengths[slowest]} distinct "
        f"lengths) is {'also' if slowest == heaviest else 'not'} the rank with the most FLOPs ({heaviest}, "
        f"{cut.distinct_lengths[heaviest]}); fitted over every measured rank, a rank costs "
        f"{c['distinct_lengths']:.3f} ms per distinct length and "
        f"{1e3 * c['tokens']:.2f} us per token besides "
        f"{c['gflops']:.2f} ms per GFLOP (largest rank residual {fit.max_abs_rank_residual():.0%}); that fit "
        f"predicts {predicted:.2f}x, {verdict}"
    )


def with_explanations(steps: Any) -> tuple[Any, RankCostFit]:
    """`steps.speedups()` with the fitted model's speed-up and `explain`'s text; and the fit."""
    fit = fit_rank_cost(steps)
    table = steps.speedups()
    table["fitted_model"] = [
        fit.predicted_speedup(r.distribution, r.world_size, r.method) for r in table.itertuples()
    ]
    # object dtype: None stays None (a string column would turn it into NaN)
    explanations = [explain(fit, steps, r) for r in table.itertuples()]
    table["explanation"] = pd.Series(explanations, index=table.index, dtype=object)
    return table, fit

"""How unevenly work is spread over ranks: the one place every technique
computes its imbalance (keys per rank, tokens per rank, plan load per rank).

    max_over_mean(counts)     # 1.0 is perfect, W is "all on one"
    spearman(measured, estimated)  # do two per-rank or per-plan orders agree?
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch


def max_over_mean(counts: torch.Tensor | Sequence[float]) -> float:
    """max(counts) / mean(counts) of a 1-D load: 1.0 when balanced, len(counts) when all load is on one
    rank. An empty load (no ranks, or every count 0) has no meaningful ratio: it raises ValueError
    rather than return nan or inf, so a broken experiment fails loudly instead of plotting a blank point.
    """
    tensor = torch.as_tensor(counts, dtype=torch.float64)
    if tensor.dim() != 1:
        raise ValueError(f"counts must be 1-D, got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        raise ValueError("counts is empty: no ranks to compare")
    mean = float(tensor.mean())
    if mean == 0.0:
        raise ValueError("mean of counts is 0 (no keys): the ratio is undefined")
    return float(tensor.max()) / mean


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (ties at their mean rank): scipy's `spearmanr` (the `notebooks`
    extra, imported here so that `import embnb` stays light); NaN when either side is constant."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"need two sequences of the same length >= 2, got {len(x)} and {len(y)}")
    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on a constant side, then returns NaN
        return float(spearmanr(x, y).statistic)

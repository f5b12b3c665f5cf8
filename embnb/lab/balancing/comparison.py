"""Notebook 04, section 3: every balancer on batches of each length
distribution, against the lower bound, summed up per distribution.

    table = comparison_table({"zipf": LengthDistribution()}, [1024], [8])
    imbalance_by_method(table)["zipf"]["tokens"]["kk_swap"]["max_gap_to_lower_bound"]
    kk_swap_vs_lpt(table)["zipf"]["tokens"]           # batches where each wins
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from embnb.balancing.lengths import LengthDistribution
from embnb.balancing.workloads import compare_methods, crossover_length

__all__ = [
    "comparison_table",
    "imbalance_by_method",
    "kk_swap_vs_lpt",
    "percent",
    "crossover_by_width",
]

BATCH_KEYS = ["distribution", "workload", "num_samples", "num_parts", "seed"]


def percent(share: float) -> str:
    """A share to two significant digits (0.88%, 0.0064%, 25%; gaps span five decades)."""
    if share == 0:
        return "0%"
    digits = max(0, 1 - int(f"{abs(share) * 100:e}".split("e")[1]))
    return f"{share * 100:.{digits}f}%"


def comparison_table(
    distributions: Mapping[str, LengthDistribution],
    sample_counts: Sequence[int],
    part_counts: Sequence[int],
    seeds: Sequence[int] = (0,),
    max_length: int = 8192,
    progress: bool = False,
    flops_dims: tuple[int, int] | None = None,
) -> pd.DataFrame:
    """`workloads.compare_methods` over every (distribution, samples, parts), a row per
    (..., seed, workload, method); `flops_dims` (embedding_dim, ffn_dim) adds FLOP workloads."""
    if not distributions:
        raise ValueError("distributions is empty: need at least one LengthDistribution")
    grid = list(itertools.product(distributions.items(), sample_counts, part_counts))
    if progress:
        from tqdm.auto import tqdm

        grid = tqdm(grid, desc="balancing")
    rows = [
        {"distribution": name, **row}
        for (name, spec), n, k in grid
        for row in compare_methods(
            [n], [k], seeds, max_length=max_length, flops_dims=flops_dims, distribution=spec
        )
    ]
    return pd.DataFrame(rows)


def imbalance_by_method(comparison: pd.DataFrame) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """distribution -> workload -> method -> gaps to both bounds (mean, worst), max/mean, and
    the share of batches whose longest sample sets the bound (per part count too)."""
    result: dict = {}
    for (name, workload, method), rows in comparison.groupby(
        ["distribution", "workload", "method"], sort=False
    ):
        by_parts = rows.groupby("num_parts")["largest_item_sets_bound"].mean()
        result.setdefault(name, {}).setdefault(workload, {})[method] = {
            "mean_gap_to_lower_bound": float(rows["gap_to_lower_bound"].mean()),
            "max_gap_to_lower_bound": float(rows["gap_to_lower_bound"].max()),
            "max_gap_to_equal_size_bound": float(rows["gap_to_equal_size_bound"].max()),
            "mean_max_over_mean": float(rows["max_over_mean"].mean()),
            "mean_bound_over_mean": float((rows["lower_bound"] / rows["mean_load"]).mean()),
            "share_longest_sets_bound": float(rows["largest_item_sets_bound"].mean()),
            "share_longest_sets_bound_by_parts": {str(k): float(v) for k, v in by_parts.items()},
        }
    return result


def kk_swap_vs_lpt(comparison: pd.DataFrame, rtol: float = 1e-12) -> dict[str, dict[str, dict[str, int]]]:
    """distribution -> workload -> in how many batches KK + swaps' largest part is lighter
    than greedy LPT's ("kk_swap"), equal within `rtol` ("equal") or heavier ("greedy_lpt")."""
    loads = comparison.pivot_table(index=BATCH_KEYS, columns="method", values="max_load", aggfunc="first")
    order = list(dict.fromkeys(comparison["distribution"]))  # as the table has them, not sorted
    counts: dict = {name: {} for name in order}
    for (name, workload, *_), row in loads.iterrows():
        kk, lpt = row["kk_swap"], row["greedy_lpt"]
        winner = (
            "equal" if abs(kk - lpt) <= rtol * max(kk, lpt) else ("kk_swap" if kk < lpt else "greedy_lpt")
        )
        tally = counts.setdefault(name, {}).setdefault(workload, {"kk_swap": 0, "equal": 0, "greedy_lpt": 0})
        tally[winner] += 1
    return counts


def results(comparison: pd.DataFrame) -> dict[str, Any]:
    """The comparison's part of notebook 04's results JSON."""
    return {
        "imbalance": imbalance_by_method(comparison),
        "kk_swap_vs_lpt": kk_swap_vs_lpt(comparison),
        "imbalance_rows": comparison.to_dict(orient="records"),
    }


def crossover_by_width(
    widths: Sequence[int], samples: Mapping[str, Any], ffn_over_width: int = 4
) -> pd.DataFrame:
    """Per width d (f = ffn_over_width * d): the length past which attention's FLOPs exceed
    the linear ones (`workloads.crossover_length`), and the share of each batch past it."""
    rows = []
    for d in widths:
        crossover = crossover_length(d, ffn_over_width * d)
        shares = {
            f"longer, {name}": float((torch.as_tensor(s) > crossover).double().mean())
            for name, s in samples.items()
        }
        rows.append({"width": d, "ffn_dim": ffn_over_width * d, "crossover_length": crossover, **shares})
    return pd.DataFrame(rows)

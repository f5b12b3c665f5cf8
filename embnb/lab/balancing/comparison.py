"""Notebook 04, sections 3-4: every balancer on seeded batches of each length distribution against
the lower bound max(mean, largest item), and where attention's FLOPs pass the linear ones.

    worst_gaps(comparison_table({"zipf": LengthDistribution()}, [1024], [8]))
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from embnb.balancing.lengths import LengthDistribution
from embnb.balancing.partition import METHODS, balance
from embnb.balancing.workloads import attention_block_flops, crossover_length, imbalance

__all__ = ["comparison_table", "worst_gaps", "kk_swap_vs_lpt", "percent", "crossover_by_width"]

CASE = ["distribution", "workload"]
BATCH = [*CASE, "num_samples", "num_parts", "seed"]


def percent(share: float) -> str:
    """A share to two significant digits (0.88%, 0.0064%, 26%, 149%; gaps span five decades)."""
    return f"{100 * share:.0f}%" if share >= 1 else f"{100 * share:.2g}%"


def comparison_table(
    distributions: Mapping[str, LengthDistribution],
    sample_counts: Sequence[int],
    part_counts: Sequence[int],
    seeds: Sequence[int] = (0,),
    max_length: int = 8192,
    flops_dims: tuple[int, int] | None = None,
) -> pd.DataFrame:
    """Every method of `partition.METHODS` (native where it has a native form and the op loads) on a
    seeded batch of each distribution's lengths per (samples, parts, seed): a row per (distribution,
    workload, samples, parts, seed, method) with `workloads.imbalance`'s numbers. Workloads: the
    tokens and, with `flops_dims` (embedding_dim, ffn_dim), `attention_block_flops`. Raises
    ValueError on no distribution."""
    if not distributions:
        raise ValueError("distributions is empty: need at least one LengthDistribution")
    rows = []
    for (name, spec), n, k, seed in itertools.product(
        distributions.items(), sample_counts, part_counts, seeds
    ):
        lengths = spec.draw(n, max_length, seed)
        estimates = {"tokens": lengths.tolist()}
        if flops_dims is not None:
            estimates["flops"] = attention_block_flops(lengths, *flops_dims).tolist()
        for (workload, weights), method in itertools.product(estimates.items(), METHODS):
            batch = dict(zip(BATCH, (name, workload, n, k, seed)), method=method)
            rows.append(batch | imbalance(weights, balance(weights, k, method)))
    return pd.DataFrame(rows)


def worst_gaps(table: pd.DataFrame) -> pd.DataFrame:
    """Per (distribution, workload): each method's worst gap to max(mean, largest item) over the
    batches (0.01: 1% above it), and the share of batches whose longest sample alone sets the bound."""
    worst = table.pivot_table(
        index=CASE, columns="method", values="gap_to_lower_bound", aggfunc="max", sort=False
    )
    longest = table[table["method"] == "kk_swap"].groupby(CASE, sort=False)["largest_item_sets_bound"].mean()
    return worst[[m for m in METHODS if m in worst]].assign(longest_sets_bound=longest)


def kk_swap_vs_lpt(table: pd.DataFrame, rtol: float = 1e-12) -> pd.DataFrame:
    """Per (distribution, workload): on how many batches KK + swaps' largest part is lighter than
    greedy LPT's ("kk_swap"), equal within `rtol` ("equal") or heavier ("greedy_lpt")."""
    loads = table.pivot_table(index=BATCH, columns="method", values="max_load", aggfunc="first", sort=False)
    kk, lpt = loads["kk_swap"], loads["greedy_lpt"]
    tie = (kk - lpt).abs() <= rtol * np.maximum(kk, lpt)
    winner = pd.Series(np.where(tie, "equal", np.where(kk < lpt, "kk_swap", "greedy_lpt")), index=loads.index)
    counts = winner.groupby(level=CASE, sort=False).value_counts().unstack(fill_value=0)
    return counts.reindex(columns=["kk_swap", "equal", "greedy_lpt"], fill_value=0)


def crossover_by_width(
    widths: Sequence[int], samples: Mapping[str, torch.Tensor], ffn_over_width: int = 4
) -> pd.DataFrame:
    """Per width d (f = ffn_over_width * d): the length past which attention's FLOPs exceed the
    linear ones (`workloads.crossover_length`), and the share of each batch of `samples` past it."""
    rows = []
    for d in widths:
        crossover = crossover_length(d, ffn_over_width * d)
        shares = {
            f"longer, {k}": float((torch.as_tensor(s) > crossover).double().mean())
            for k, s in samples.items()
        }
        rows.append({"width": d, "ffn_dim": ffn_over_width * d, "crossover_length": crossover, **shares})
    return pd.DataFrame(rows)

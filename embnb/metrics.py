"""Load measures for keys routed to ranks.

A routing function (see `embnb.rowwise.routing`) gives each key an owner rank; these
helpers count what each rank receives and summarize the imbalance:

    load = rank_load(keys, ranks, world_size)
    max_over_mean(load.key_counts)     # 1.0 is perfect, W is "all on one"
    spread_over_mean(load.key_counts)  # (max - min) / mean, 0.0 is perfect

An empty load (no ranks, or every count 0) has no meaningful ratio: both
summaries raise ValueError rather than return nan or inf, so a broken
experiment fails loudly instead of plotting a blank point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RankLoad:
    """What each rank receives; both tensors are int64 of length world_size."""

    key_counts: torch.Tensor  # every key, repeats included (lookup traffic)
    unique_counts: torch.Tensor  # distinct keys (rows the rank must hold)


def _as_1d_int64(values: torch.Tensor | Sequence[int], name: str) -> torch.Tensor:
    tensor = torch.as_tensor(values)
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
    if tensor.numel() and (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool):
        raise ValueError(f"{name} must hold integers, got dtype {tensor.dtype}")
    return tensor.to(torch.int64)


def rank_load(
    keys: torch.Tensor | Sequence[int],
    ranks: torch.Tensor | Sequence[int],
    world_size: int,
) -> RankLoad:
    """Count keys and distinct keys per rank; `ranks[i]` owns `keys[i]`.

    Ranks that receive nothing count 0. A key counts as distinct per rank, so
    if a (non-deterministic) router sent one key to two ranks, both count it.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    keys = _as_1d_int64(keys, "keys")
    ranks = _as_1d_int64(ranks, "ranks")
    if keys.numel() != ranks.numel():
        raise ValueError(f"keys and ranks differ in length: {keys.numel()} != {ranks.numel()}")
    bad = (ranks < 0) | (ranks >= world_size)
    if bool(bad.any()):
        value = int(ranks[bad][0])
        raise ValueError(f"rank {value} is outside [0, {world_size}) for world_size={world_size}")

    key_counts = torch.bincount(ranks, minlength=world_size)
    # Sort by (rank, key) with two stable sorts, then count run starts:
    # vectorized, and no (rank, key) packing that could overflow int64.
    by_key = torch.sort(keys, stable=True).indices
    order = by_key[torch.sort(ranks[by_key], stable=True).indices]
    sorted_keys, sorted_ranks = keys[order], ranks[order]
    run_start = torch.ones_like(sorted_keys, dtype=torch.bool)
    run_start[1:] = (sorted_keys[1:] != sorted_keys[:-1]) | (sorted_ranks[1:] != sorted_ranks[:-1])
    unique_counts = torch.bincount(sorted_ranks[run_start], minlength=world_size)
    return RankLoad(key_counts=key_counts, unique_counts=unique_counts)


def _mean_checked(counts: torch.Tensor | Sequence[float]) -> tuple[torch.Tensor, float]:
    tensor = torch.as_tensor(counts, dtype=torch.float64)
    if tensor.dim() != 1:
        raise ValueError(f"counts must be 1-D, got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        raise ValueError("counts is empty: no ranks to compare")
    mean = float(tensor.mean())
    if mean == 0.0:
        raise ValueError("mean of counts is 0 (no keys): the ratio is undefined")
    return tensor, mean


def max_over_mean(counts: torch.Tensor | Sequence[float]) -> float:
    """max(counts) / mean(counts): 1.0 when balanced, len(counts) when all
    load is on one rank. Raises ValueError if counts is empty or its mean is 0.
    """
    tensor, mean = _mean_checked(counts)
    return float(tensor.max()) / mean


def spread_over_mean(counts: torch.Tensor | Sequence[float]) -> float:
    """(max(counts) - min(counts)) / mean(counts): 0.0 when balanced.
    Raises ValueError if counts is empty or its mean is 0.
    """
    tensor, mean = _mean_checked(counts)
    return float(tensor.max() - tensor.min()) / mean

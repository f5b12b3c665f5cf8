"""What to balance (attention FLOPs: their quadratic term makes long samples cost more than their
share of tokens), and how far a partition is from the best possible (its bounds and `imbalance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from embnb._checks import check_int
from embnb.balancing.partition import as_workloads, check_partition, padded_weights

__all__ = [
    "lengths_tensor",
    "attention_block_flops",
    "crossover_length",
    "lower_bound",
    "equal_size_lower_bound",
    "imbalance",
]


def lengths_tensor(lengths: Any) -> torch.Tensor:
    """`lengths` as float64 for a FLOP formula; raises ValueError naming the first negative or
    non-finite one."""
    length = torch.as_tensor(lengths, dtype=torch.float64)
    bad = ((length < 0) | ~torch.isfinite(length)).flatten()
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"lengths must be finite and >= 0; lengths[{i}] = {length.flatten()[i].item()!r}")
    return length


def attention_block_flops(lengths: Any, embedding_dim: int, ffn_dim: int) -> torch.Tensor:
    """Forward FLOPs of one transformer block on each sample (float64).

    A sample of L tokens, model width d, feed-forward width f, with a
    multiply-add counted as 2 FLOPs (as torch.utils.flop_counter does):

        QKV projections       3 * 2*L*d*d  = 6*L*d^2
        scores Q @ K^T            2*L*L*d
        weights @ V               2*L*L*d
        output projection       2*L*d*d    = 2*L*d^2
        feed-forward (2 Linear) 2*2*L*d*f  = 4*L*d*f
        --------------------------------------------
        total  = L*(8*d^2 + 4*d*f) + 4*d*L^2

    The number of heads does not change the count. Biases, softmax and
    norms are O(L*d) and left out. The quadratic term is why a few long
    sequences cost far more than their share of tokens.
    """
    check_int("embedding_dim", embedding_dim, low=1)
    check_int("ffn_dim", ffn_dim, low=1)
    length = lengths_tensor(lengths)
    d, f = float(embedding_dim), float(ffn_dim)
    return length * (8 * d * d + 4 * d * f) + 4 * d * length * length


def crossover_length(embedding_dim: int, ffn_dim: int) -> int:
    """The length L where the quadratic attention term 4*d*L^2 of
    `attention_block_flops` equals the linear term L*(8*d^2 + 4*d*f):
    L = 2*d + f. Past it a sample's FLOPs grow faster than its tokens."""
    check_int("embedding_dim", embedding_dim, low=1)
    check_int("ffn_dim", ffn_dim, low=1)
    return 2 * embedding_dim + ffn_dim


# --- measuring a partition --------------------------------------------------


def lower_bound(workloads: Any, num_parts: int) -> float:
    """No partition's largest part is below max(mean part load, largest item)."""
    weights = as_workloads(workloads)
    num_parts = check_int("num_parts", num_parts, low=1)
    return max(sum(weights) / num_parts, max(weights))


def equal_size_lower_bound(workloads: Any, num_parts: int) -> float:
    """A tighter bound when part sizes may differ by at most one: the part
    that holds the largest item also holds ceil(n / num_parts) - 1 others,
    at least the smallest ones (zero-workload padding counts as smallest)."""
    weights = as_workloads(workloads)
    num_parts = check_int("num_parts", num_parts, low=1)
    padded = sorted(padded_weights(weights, num_parts, True))
    others = len(padded) // num_parts - 1
    return max(sum(weights) / num_parts, padded[-1] + sum(padded[:others]))


def imbalance(workloads: Any, parts: Sequence[Sequence[int]]) -> dict[str, float]:
    """Loads of a partition: max/mean, and the gap of the largest part to the
    lower bound max(mean, largest item) (0.02 means 2% above it). For parts
    whose sizes differ by at most one, also the gap to
    `equal_size_lower_bound`: what equal counts leave unavoidable."""
    weights = as_workloads(workloads)
    if not parts:
        raise ValueError("parts is empty: need at least one part")
    check_partition(parts, len(weights))
    loads = [sum(weights[i] for i in part) for part in parts]
    mean = sum(weights) / len(parts)
    bound = max(mean, max(weights))
    result = {
        "max_load": max(loads),
        "mean_load": mean,
        "lower_bound": bound,
        "max_over_mean": max(loads) / mean if mean > 0 else 1.0,
        "gap_to_lower_bound": max(loads) / bound - 1 if bound > 0 else 0.0,
        # the longest sample alone exceeds a fair share: no split can reach the mean
        "largest_item_sets_bound": max(weights) > mean,
    }
    sizes = [len(part) for part in parts]
    if max(sizes) - min(sizes) <= 1:
        eq_bound = equal_size_lower_bound(weights, len(parts))
        result["equal_size_lower_bound"] = eq_bound
        result["gap_to_equal_size_bound"] = max(loads) / eq_bound - 1 if eq_bound > 0 else 0.0
    return result

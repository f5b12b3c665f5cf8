"""Balance compute under a memory cap: equal-count parts by workload (FLOPs) with at most `cap`
tokens on every part.

A partition that balances FLOPs puts many short samples (many tokens, so much activation memory)
beside the rank that holds the longest one. Each method places the samples its own way (`greedy_lpt`:
into the lightest part with room in count and tokens; `karmarkar_karp`, `kk_swap`: the library's),
then the repair takes the part furthest over the cap and swaps one of its samples with a sample of
fewer tokens on a part that stays within the cap, the pair that leaves the larger of the two parts'
workloads least; every swap lowers the tokens over the cap, so it ends, or raises ValueError when no
swap is left. `kk_swap` then swaps as `refine_by_swaps` does, within the cap. Where the uncapped
partition already meets the cap, every method returns it unchanged: a cap changes a partition only
where it binds.

    parts = balance_capped(flops, tokens, num_parts=8, cap=1.2 * sum(tokens) / 8)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from embnb._checks import check_choice, check_int, check_number
from embnb.balancing.partition import (
    as_workloads,
    check_partition,
    karmarkar_karp,
    kk_swap,
    part_sizes,
)

__all__ = ["CAPPED_METHODS", "balance_capped", "part_tokens", "minimum_cap"]

CAPPED_METHODS = ("greedy_lpt", "karmarkar_karp", "kk_swap")
Parts = list[list[int]]


def part_tokens(tokens: Sequence[float], parts: Sequence[Sequence[int]]) -> list[float]:
    """Each part's tokens."""
    return [float(sum(tokens[i] for i in part)) for part in parts]


def minimum_cap(tokens: Any, num_parts: int) -> float:
    """No equal-count partition fits under a cap below this: the mean part's
    tokens, and the largest sample with the fewest tokens the other samples
    of its part can hold (every part holds at least floor(n / num_parts))."""
    values = as_workloads(tokens)
    check_int("num_parts", num_parts, low=1)
    others = sorted(values)[: max(len(values) // num_parts - 1, 0)]
    return max(sum(values) / num_parts, max(values) + sum(others))


def _capped_greedy(weights: list[float], tokens: list[float], num_parts: int, cap: float) -> Parts:
    # greedy_lpt's capacities; the lightest part with room in count and tokens
    num_items = len(weights)
    capacity = part_sizes(num_items, num_parts)
    loads, held = [0.0] * num_parts, [0.0] * num_parts
    parts: Parts = [[] for _ in range(num_parts)]
    for i in sorted(range(num_items), key=lambda i: (-weights[i], i)):
        open_parts = [p for p in range(num_parts) if len(parts[p]) < capacity[p]]
        fitting = [p for p in open_parts if held[p] + tokens[i] <= cap]
        # no part has room under the cap: the one with the most room; the repair fixes it
        p = (
            min(fitting, key=lambda p: (loads[p], p))
            if fitting
            else min(open_parts, key=lambda p: (held[p], p))
        )
        parts[p].append(i)
        loads[p] += weights[i]
        held[p] += tokens[i]
    return [sorted(part) for part in parts]


def _repair(w: np.ndarray, t: np.ndarray, parts: Parts, cap: float) -> Parts:
    """Swaps until no part holds more than `cap` tokens (module docstring)."""
    parts = [list(p) for p in parts]
    held = np.array([t[p].sum() for p in parts])
    loads = np.array([w[p].sum() for p in parts])
    while held.max() > cap:
        over = int(np.argmax(held))
        a_idx = np.array(parts[over])
        best = None
        for q in range(len(parts)):
            if q == over or not parts[q]:
                continue
            b_idx = np.array(parts[q])
            moved = t[a_idx][:, None] - t[b_idx][None, :]  # tokens leaving `over`
            fits = (moved > 0) & (held[q] + moved <= cap)
            if not fits.any():
                continue
            shift = w[a_idx][:, None] - w[b_idx][None, :]
            worse = np.maximum(loads[over] - shift, loads[q] + shift)
            worse = np.where(fits, worse, np.inf)
            a, b = np.unravel_index(int(np.argmin(worse)), worse.shape)
            key = (float(worse[a, b]), -float(moved[a, b]), q)
            if best is None or key < best[0]:
                best = (key, q, int(a_idx[a]), int(b_idx[b]))
        if best is None:
            raise ValueError(
                f"cap {cap:g} tokens per part: part {over} holds {held[over]:g} and no swap brings it "
                f"under; raise the cap (no partition fits under {held.sum() / len(parts):g}, the mean)"
            )
        _, q, a, b = best
        _swap(parts, loads, held, w, t, over, q, a, b)
    return [sorted(p) for p in parts]


def _swap(parts: Parts, loads, held, w, t, p: int, q: int, a: int, b: int) -> None:
    parts[p][parts[p].index(a)] = b
    parts[q][parts[q].index(b)] = a
    loads[p] += w[b] - w[a]
    loads[q] += w[a] - w[b]
    held[p] += t[b] - t[a]
    held[q] += t[a] - t[b]


def _refine_capped(w: np.ndarray, t: np.ndarray, parts: Parts, cap: float, max_swaps: int) -> Parts:
    """`refine_by_swaps`' rule (heaviest part, lightest other part that
    admits a swap, the pair closest to half the gap), among swaps that keep
    both parts within the cap."""
    parts = [list(p) for p in parts]
    held = np.array([t[p].sum() for p in parts])
    loads = np.array([w[p].sum() for p in parts])
    for _ in range(max_swaps):
        heavy = int(np.argmax(loads))
        a_idx = np.array(parts[heavy])
        swap = None
        for q in np.argsort(loads, kind="stable"):
            q = int(q)
            if q == heavy or not parts[q]:
                continue
            b_idx = np.array(parts[q])
            gap = loads[heavy] - loads[q]
            diff = w[a_idx][:, None] - w[b_idx][None, :]
            moved = t[a_idx][:, None] - t[b_idx][None, :]
            ok = (diff > 0) & (diff < gap) & (held[heavy] - moved <= cap) & (held[q] + moved <= cap)
            if ok.any():
                a, b = np.unravel_index(
                    int(np.argmin(np.where(ok, np.abs(diff - gap / 2), np.inf))), ok.shape
                )
                swap = (q, int(a_idx[a]), int(b_idx[b]))
                break
        if swap is None:
            break
        _swap(parts, loads, held, w, t, heavy, *swap)
    return [sorted(p) for p in parts]


def balance_capped(workloads: Any, tokens: Any, num_parts: int, cap: float, method: str = "kk_swap") -> Parts:
    """Equal-count parts of the samples, balanced by `workloads`, with at
    most `cap` of `tokens` on every part (module docstring). Raises
    ValueError when the cap is below `minimum_cap` or the repair finds no
    swap. Parts come in no particular order, indices ascending."""
    check_choice("method", method, CAPPED_METHODS)
    weights = as_workloads(workloads)
    counts = as_workloads(tokens)
    num_parts = check_int("num_parts", num_parts, low=1)
    check_number("cap", cap, low=0, low_open=True)
    if len(counts) != len(weights):
        raise ValueError(f"tokens has {len(counts)} samples, workloads {len(weights)}: one each per sample")
    floor = minimum_cap(counts, num_parts)
    if cap < floor:
        raise ValueError(
            f"cap {cap:g} is below {floor:g} (the largest sample or the mean part): no partition fits"
        )
    if method == "greedy_lpt":
        parts = _capped_greedy(weights, counts, num_parts, cap)
    else:
        uncapped = {"karmarkar_karp": karmarkar_karp, "kk_swap": kk_swap}[method]
        parts = uncapped(weights, num_parts)
        if max(part_tokens(counts, parts)) <= cap:
            return [sorted(p) for p in parts]
    w, t = np.asarray(weights), np.asarray(counts)
    parts = _repair(w, t, parts, cap)
    if method == "kk_swap":
        parts = _refine_capped(w, t, parts, cap, 4 * len(weights))
    check_partition(parts, len(weights))
    return parts

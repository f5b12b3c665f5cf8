"""Split one global batch's per-sample workloads into W balanced parts.

Data-parallel ranks wait for the slowest one at every gradient all-reduce, so a step costs the
*largest* part's workload; with heavy-tailed lengths the data loader's cut (`contiguous`) leaves one
rank far above the mean. Every balancer (`METHODS`) returns `parts`: one list of sample indices per
rank (ascending), heaviest part first for the KK family. `balance`'s default, KK then swaps, lands
within 1% of the lower bound max(mean, largest item) on Zipf(1.5) batches of 1024-4096 samples into
8-64 parts, where plain KK lands up to ~25% above it (notebook 04 shows every method's gap).

Equal-size parts pad the batch with zero-workload items up to a multiple of W, as real trainers do,
at most one per part, and drop them from the result: part sizes then differ by at most one. Every
function is deterministic (ties broken by index), so all ranks compute the same partition from the
same all-gathered workloads without a broadcast.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from embnb._checks import check_choice, check_int, check_native
from embnb.cuda import loader

__all__ = [
    "METHODS",
    "NATIVE_METHODS",
    "contiguous",
    "greedy_lpt",
    "karmarkar_karp",
    "refine_by_swaps",
    "kk_swap",
    "balance",
]

Parts = list[list[int]]


# --- input checks -----------------------------------------------------------


def _workload_tensor(workloads: Any) -> torch.Tensor:
    """A 1-D CPU float64 tensor (through numpy, which converts a list faster than torch)."""
    try:
        if isinstance(workloads, torch.Tensor):
            tensor = workloads.detach().to("cpu", torch.float64)
        else:
            tensor = torch.from_numpy(np.asarray(workloads, dtype=np.float64))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"workloads must be a 1-D sequence of numbers: {exc}") from exc
    if tensor.dim() != 1:
        raise ValueError(f"workloads must be 1-D, got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        raise ValueError("workloads is empty: there is no batch to partition")
    return tensor.contiguous()


def as_workloads(workloads: Any) -> list[float]:
    """A 1-D, non-empty sequence of finite, non-negative numbers, as floats."""
    tensor = _workload_tensor(workloads)
    bad = (~torch.isfinite(tensor)) | (tensor < 0)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"workloads must be finite and >= 0; workloads[{i}] = {tensor[i].item()!r}")
    return tensor.tolist()


def check_partition(parts: Any, num_items: int) -> None:
    counts = [0] * num_items
    outside = []
    for part in parts:
        for i in part:
            if 0 <= i < num_items:
                counts[i] += 1
            else:
                outside.append(i)
    missing = [i for i, c in enumerate(counts) if c == 0]
    repeated = [i for i, c in enumerate(counts) if c > 1]
    if missing or repeated or outside:
        raise ValueError(
            f"parts must hold each of the {num_items} sample indices exactly once; "
            f"missing {missing[:10]}, repeated {repeated[:10]}, out of range {outside[:10]}"
        )


def padded_weights(weights: list[float], num_parts: int, equal_size: bool) -> list[float]:
    # Zero-workload items up to a multiple of num_parts; indices >= len(weights).
    pad = (-len(weights)) % num_parts if equal_size else 0
    return weights + [0.0] * pad


def part_sizes(num_items: int, num_parts: int) -> list[int]:
    """Equal counts: every part's samples, the last parts (those holding padding) one fewer."""
    pads = (-num_items) % num_parts
    return [(num_items + pads) // num_parts - (p >= num_parts - pads) for p in range(num_parts)]


def _drop_padding(parts: Parts, num_items: int) -> Parts:
    return [sorted(i for i in part if i < num_items) for part in parts]


# --- baselines --------------------------------------------------------------


def contiguous(workloads: Any, num_parts: int, equal_size: bool = True) -> Parts:
    """The data loader's cut: consecutive runs, sizes differing by at most one
    (the first `n % num_parts` parts get the extra sample). `equal_size` is
    there for the common signature of METHODS: this cut always is."""
    num_items = len(as_workloads(workloads))
    num_parts = check_int("num_parts", num_parts, low=1)
    base, extra = divmod(num_items, num_parts)
    bounds = list(itertools.accumulate([base + (p < extra) for p in range(num_parts)], initial=0))
    return [list(range(bounds[p], bounds[p + 1])) for p in range(num_parts)]


def greedy_lpt(workloads: Any, num_parts: int, equal_size: bool = True) -> Parts:
    """Longest processing time first: items by decreasing workload (ties:
    lower index), each to the lightest part (ties: lower part index) among
    the parts that are not full when equal_size. With equal_size the last
    parts hold one padding item each, so they take one sample fewer."""
    weights = as_workloads(workloads)
    num_parts = check_int("num_parts", num_parts, low=1)
    num_items = len(weights)
    capacity = part_sizes(num_items, num_parts) if equal_size else [num_items] * num_parts
    heap = [(0.0, p) for p in range(num_parts) if capacity[p] > 0]  # (load, part): lightest on top
    heapq.heapify(heap)
    parts: Parts = [[] for _ in range(num_parts)]
    for i in sorted(range(num_items), key=lambda i: (-weights[i], i)):
        load, p = heapq.heappop(heap)
        parts[p].append(i)
        if len(parts[p]) < capacity[p]:  # a full part leaves the heap
            heapq.heappush(heap, (load + weights[i], p))
    return [sorted(part) for part in parts]


# --- Karmarkar-Karp ---------------------------------------------------------
# A state is k sets, each [sum, items], sorted by decreasing sum (a stable
# sort, so equal sums keep their order). The native version in
# embnb/cuda/karmarkar_karp.cpp follows these steps exactly.


def _set_order(weighted_set: list) -> tuple[float, int]:
    # Larger sum first, then more items (as verl's KK): sets of equal sum pair
    # their items with the emptier sets, so no part ends empty while there are
    # at least as many items as parts (e.g. all-zero workloads).
    return weighted_set[0], len(weighted_set[1])


def _kk_sets(padded: list[float], num_parts: int, equal_size: bool, num_real: int) -> list[list]:
    # Padding (indices >= num_real) sorts before real zero-workload items: it
    # all lands in the first state, one per set, so one per final part.
    order = sorted(range(len(padded)), key=lambda i: (padded[i], i < num_real, i))
    if equal_size:  # k consecutive sorted items: one state of k single-item sets
        groups = [order[g : g + num_parts] for g in range(0, len(order), num_parts)]
    else:  # one item and k-1 empty sets
        groups = [[i] for i in order]
    heap = []
    for state_id, group in enumerate(groups):
        sets = [[padded[i], [i]] for i in group] + [[0.0, []] for _ in range(num_parts - len(group))]
        sets.sort(key=_set_order, reverse=True)
        # Largest spread first, then largest top set, then the older state:
        # a strict order, so any correct heap pops the same sequence.
        heap.append((sets[-1][0] - sets[0][0], -sets[0][0], state_id, sets))
    heapq.heapify(heap)
    next_id = len(groups)
    while len(heap) > 1:
        first = heapq.heappop(heap)[3]
        second = heapq.heappop(heap)[3]
        # Largest set of one state with the smallest of the other.
        for s, t in zip(first, reversed(second)):
            s[0] = s[0] + t[0]
            s[1].extend(t[1])
        first.sort(key=_set_order, reverse=True)
        heapq.heappush(heap, (first[-1][0] - first[0][0], -first[0][0], next_id, first))
        next_id += 1
    return heap[0][3]


def karmarkar_karp(workloads: Any, num_parts: int, equal_size: bool = True) -> Parts:
    """Largest differencing method for k parts (Karmarkar-Karp).

    Sort the items. With equal_size, every group of k consecutive items is a
    state of k single-item sets (so every part gets one item of each group:
    equal counts); otherwise each item is a state with k-1 empty sets. A heap
    repeatedly pops the two states with the largest spread (largest minus
    smallest set sum) and merges them, pairing the largest set of one with
    the smallest of the other. The last state's sets are the parts.

    With equal_size and len(workloads) not a multiple of num_parts, the batch
    is padded with zero-workload items, which sort before real zeros so all
    of them sit in the first state: one per part at most. They are dropped
    from the result, so part sizes differ by at most one. Parts come
    heaviest first, indices ascending.
    """
    weights = as_workloads(workloads)
    num_parts = check_int("num_parts", num_parts, low=1)
    sets = _kk_sets(padded_weights(weights, num_parts, equal_size), num_parts, equal_size, len(weights))
    return _drop_padding([items for _, items in sets], len(weights))


def _best_swap(weights: list[float], heavy: list[int], light: list[int], gap: float, num_real: int):
    """The swap (a from heavy, b from light) with 0 < w[a] - w[b] < gap whose
    difference is closest to gap / 2; ties: lower a, then lower b. None if
    no swap lowers the heavier of the two parts. Padding never moves, so
    real part sizes stay within one."""
    target = gap * 0.5
    light_sorted = sorted((i for i in light if i < num_real), key=lambda i: (weights[i], i))
    light_weights = [weights[i] for i in light_sorted]
    best = None
    for a in heavy:
        if a >= num_real:
            continue
        wa = weights[a]
        x = wa - target
        pos = bisect.bisect_left(light_weights, x)
        # The nearest admissible b is at the start of the run of values just
        # at or above x, or of the run just below it (runs sorted by index).
        for j in (pos, pos - 1):
            if not 0 <= j < len(light_weights):
                continue
            wb = light_weights[j]
            diff = wa - wb
            if not (0 < diff < gap):
                continue
            b = light_sorted[bisect.bisect_left(light_weights, wb)]
            key = (abs(diff - target), a, b)
            if best is None or key < best:
                best = key
    return best


def _refine(weights: list[float], parts: Parts, max_swaps: int, num_real: int) -> Parts:
    parts = [sorted(part) for part in parts]
    loads = [sum(weights[i] for i in part) for part in parts]  # in index order, as the native op adds
    for _ in range(max_swaps):
        heavy = min(range(len(parts)), key=lambda p: (-loads[p], p))
        swap = None
        for light in sorted(range(len(parts)), key=lambda p: (loads[p], p)):
            if light == heavy:
                continue
            swap = _best_swap(weights, parts[heavy], parts[light], loads[heavy] - loads[light], num_real)
            if swap is not None:
                break
        if swap is None:
            break
        _, a, b = swap
        parts[heavy][parts[heavy].index(a)] = b
        parts[light][parts[light].index(b)] = a
        loads[heavy] = loads[heavy] - weights[a] + weights[b]
        loads[light] = loads[light] - weights[b] + weights[a]
    return [sorted(part) for part in parts]


def refine_by_swaps(workloads: Any, parts: Sequence[Sequence[int]], max_swaps: int | None = None) -> Parts:
    """Improve a partition by one-for-one swaps, keeping every part's size.

    Each round takes the heaviest part (ties: lower index) and the lightest
    other part that admits a swap (lighter first, ties: lower index), and
    swaps the pair (a, b) whose difference w[a] - w[b] is closest to half
    their load gap, among those with 0 < w[a] - w[b] < gap: both parts then
    end below the old maximum, so the sum of squared loads strictly falls.
    Stops when the heaviest part admits no swap, or after `max_swaps`
    (default 4 * items). Cost per round: O(m log m) for parts of m items.
    """
    weights = as_workloads(workloads)
    if not parts:
        raise ValueError("parts is empty: need at least one part")
    check_partition(parts, len(weights))
    if max_swaps is None:
        max_swaps = 4 * len(weights)
    check_int("max_swaps", max_swaps, low=0)
    return _refine(weights, [list(p) for p in parts], max_swaps, len(weights))


def kk_swap(workloads: Any, num_parts: int, equal_size: bool = True) -> Parts:
    """Karmarkar-Karp, then `refine_by_swaps` (the padding stays where KK put
    it, one item per part at most). Pure Python; `balance` runs the native
    one, which gives the same parts."""
    weights = as_workloads(workloads)
    num_parts = check_int("num_parts", num_parts, low=1)
    padded = padded_weights(weights, num_parts, equal_size)
    sets = _kk_sets(padded, num_parts, equal_size, len(weights))
    refined = _refine(padded, [items for _, items in sets], 4 * len(padded), len(weights))
    return _drop_padding(_heaviest_first(padded, refined), len(weights))


def _heaviest_first(weights: list[float], parts: Parts) -> Parts:
    loads = [sum(weights[i] for i in part) for part in parts]
    return [parts[p] for p in sorted(range(len(parts)), key=lambda p: (-loads[p], p))]


# --- the default balancer ---------------------------------------------------

METHODS = {
    "contiguous": contiguous,
    "greedy_lpt": greedy_lpt,
    "karmarkar_karp": karmarkar_karp,
    "kk_swap": kk_swap,
}
"""Every balancer by name, called as METHODS[name](workloads, num_parts,
equal_size=True); `kk_swap` is the default of `balance`."""
NATIVE_METHODS = ("karmarkar_karp", "kk_swap")


def _native_kk(workloads: Any, num_parts: int, equal_size: bool, refine: bool) -> Parts:
    """torch.ops.embnb.karmarkar_karp: the same parts as the Python version.
    The op itself rejects negative and non-finite workloads."""
    tensor = _workload_tensor(workloads)
    order, sizes = torch.ops.embnb.karmarkar_karp(
        tensor, check_int("num_parts", num_parts, low=1), equal_size, refine
    )
    order = order.tolist()
    bounds = list(itertools.accumulate(sizes.tolist(), initial=0))
    return [order[bounds[p] : bounds[p + 1]] for p in range(num_parts)]


def balance(
    workloads: Any,
    num_parts: int,
    method: str = "kk_swap",
    *,
    native: bool | None = None,
    equal_size: bool = True,
) -> Parts:
    """Parts of a batch by `method` (default: KK then swaps).

    native: True runs KK (and swaps) as torch.ops.embnb.karmarkar_karp in
    embnb's C++ extension, which runs without the GIL, so a background
    thread does not stall the training loop's Python (an error if it cannot
    load, or for a method without a native version); False runs the
    pure-Python reference; None runs the KK methods natively where the
    extension loads (one warning where it does not). Both give exactly the
    same parts.
    """
    check_choice("method", method, tuple(METHODS))
    check_native("native", native)
    if native and method not in NATIVE_METHODS:
        raise ValueError(f"method {method!r} has no native version; native: {', '.join(NATIVE_METHODS)}")
    if method in NATIVE_METHODS and loader.use(native):
        return _native_kk(workloads, num_parts, equal_size, method == "kk_swap")
    return METHODS[method](workloads, num_parts, equal_size=equal_size)

"""Equal-count Karmarkar-Karp in a dozen lines, the core notebook 04 shows.
`partition.karmarkar_karp` adds what a library needs (padding, strict
tie-breaks, checked input); on distinct workloads both give one partition.
"""

from __future__ import annotations

import heapq

from embnb.balancing import partition
from embnb.cuda import loader

__all__ = ["kk_equal_count", "greedy_capped", "page_core_agrees"]


def kk_equal_count(workloads: list[float], num_parts: int, trace: list | None = None) -> list[list[int]]:
    """Split item indices into `num_parts` parts of equal count and near-equal
    sums; `len(workloads)` must be a multiple of `num_parts`. A `trace` list
    receives (first, second, merged) states, each a list of [sum, items]."""
    order = sorted(range(len(workloads)), key=lambda i: workloads[i])
    heap = []  # states: k sets [sum, items], heaviest first, keyed by -spread
    for start in range(0, len(order), num_parts):
        sets = sorted(([workloads[i], [i]] for i in order[start : start + num_parts]), reverse=True)
        heap.append((sets[-1][0] - sets[0][0], start, sets))
    heapq.heapify(heap)
    next_id = len(order)
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)  # the two states with the largest spread
        _, _, second = heapq.heappop(heap)
        # merge: heaviest set of one with the lightest of the other, and so on
        merged = [[s + t, a + b] for (s, a), (t, b) in zip(first, reversed(second))]
        merged.sort(reverse=True)
        if trace is not None:
            trace.append((first, second, merged))
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], next_id, merged))
        next_id += 1
    return [sorted(items) for _, items in heap[0][2]]


def greedy_capped(workloads: list[float], tokens: list[float], num_parts: int, cap: float) -> list[list[int]]:
    """Equal-count greedy under a memory cap: the biggest workload first, to
    the lightest part that still has room for one more sample and for its
    tokens under `cap`; `len(workloads)` must be a multiple of `num_parts`.
    Raises ValueError where no part has room (the library then repairs)."""
    per_part = len(workloads) // num_parts
    parts = [[] for _ in range(num_parts)]
    loads, held = [0.0] * num_parts, [0.0] * num_parts
    for i in sorted(range(len(workloads)), key=lambda i: (-workloads[i], i)):
        room = [p for p in range(num_parts) if len(parts[p]) < per_part and held[p] + tokens[i] <= cap]
        if not room:
            raise ValueError(f"no part has room for sample {i} ({tokens[i]} tokens) under cap {cap}")
        p = min(room, key=lambda p: (loads[p], p))  # the lightest part with room
        parts[p].append(i)
        loads[p] += workloads[i]
        held[p] += tokens[i]
    return [sorted(part) for part in parts]


def _as_parts(parts) -> list[tuple[int, ...]]:
    return sorted(tuple(sorted(p)) for p in parts)


def page_core_agrees(
    workloads: list[float],
    num_parts: int,
    kk_parts: list[list[int]],
    kk_swap_parts: list[list[int]],
    rank_samples: list[list[int]],
) -> dict[str, bool]:
    """Whether the core on notebook 04's page agrees with the library on distinct
    `workloads`: its KK is `karmarkar_karp`'s partition, its KK + swaps `kk_swap`'s (Python
    and native, same largest load), and its worker loop gave rank r `balance`'s part r."""
    library = partition.balance(workloads, num_parts, "kk_swap", native=False)
    native = partition.balance(workloads, num_parts, "kk_swap", native=True) if loader.available() else None

    def largest(parts):
        return max(sum(workloads[i] for i in p) for p in parts)

    return {
        "kk_partition": _as_parts(kk_parts)
        == _as_parts(partition.balance(workloads, num_parts, "karmarkar_karp", native=False)),
        "kk_swap_partition": _as_parts(kk_swap_parts) == _as_parts(library),
        "kk_swap_native": native is not None and _as_parts(kk_swap_parts) == _as_parts(native),
        "kk_swap_max_load": largest(kk_swap_parts) == largest(library),
        "worker_ranks": [sorted(s) for s in rank_samples] == [sorted(p) for p in library],
    }

"""What notebook 04's page checks its own KK and swaps against, and the capped greedy the library's
`capped.balance_capped(..., "greedy_lpt")` is tested against.

    page_core_agrees(workloads, 8, page_kk, page_kk_swap, rank_samples)  # {"kk_partition": True, ...}
"""

from __future__ import annotations

import pandas as pd

from embnb.balancing import partition
from embnb.cuda import loader

__all__ = ["greedy_capped", "page_core_agrees", "trace_table"]


def trace_table(trace: list, workloads: list[float]) -> pd.DataFrame:
    """A row per merge of a traced equal-count KK: `trace` holds (first, second, merged) states, each
    a list of [sum, items] sets (heaviest first); a set shows as its sum and its workloads."""

    def sets(state: list) -> str:
        return "  ".join(f"{total:g} {sorted(workloads[i] for i in items)}" for total, items in state)

    rows = [
        {"first (widest spread)": sets(a), "second": sets(b), "merged": sets(m), "spread": m[0][0] - m[-1][0]}
        for a, b, m in trace
    ]
    return pd.DataFrame(rows, index=pd.RangeIndex(1, len(rows) + 1, name="merge"))


def greedy_capped(workloads: list[float], tokens: list[float], num_parts: int, cap: float) -> list[list[int]]:
    """Equal-count greedy under a memory cap: the biggest workload first, to the lightest part that
    still has room for one more sample and for its tokens under `cap`; `len(workloads)` must be a
    multiple of `num_parts`. Raises ValueError where no part has room (the library then repairs)."""
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
    """Whether the core on notebook 04's page agrees with the library on distinct `workloads`: its
    KK is `karmarkar_karp`'s partition, its KK + swaps `kk_swap`'s (Python and native, same largest
    load), and its worker loop gave rank r `balance`'s part r."""
    library = partition.balance(workloads, num_parts, "kk_swap", native=False)
    native = partition.balance(workloads, num_parts, "kk_swap", native=True) if loader.available() else None
    kk = partition.balance(workloads, num_parts, "karmarkar_karp", native=False)

    def largest(parts):
        return max(sum(workloads[i] for i in p) for p in parts)

    return {
        "kk_partition": _as_parts(kk_parts) == _as_parts(kk),
        "kk_swap_partition": _as_parts(kk_swap_parts) == _as_parts(library),
        "kk_swap_native": native is not None and _as_parts(kk_swap_parts) == _as_parts(native),
        "kk_swap_max_load": largest(kk_swap_parts) == largest(library),
        "worker_ranks": [sorted(s) for s in rank_samples] == [sorted(p) for p in library],
    }

"""What notebook 04's page checks its own KK and swaps against, and the table of their worked example."""

from __future__ import annotations

import pandas as pd

from embnb.balancing import partition
from embnb.cuda import loader

__all__ = ["page_core_agrees", "trace_table"]


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

"""Appendix 01a's section 7: torchrec row-wise tables under each routing of embnb's sharders.

Three id streams (`case_ids`) go into one table of `num_embeddings` rows, each laid out by
`embnb.rowwise.TableLayout` at each W; the ids per rank are counted from the layout, then each rank's
lookups are replayed with real kernels, one rank after another (`embnb.steptime.measure_routing` on the
storage slots in torchrec's contiguous blocks: the local rows the routed sharder sends each rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from tqdm.auto import tqdm

from embnb._checks import check_choice, check_int
from embnb.data import make_keys, zipf_cdf
from embnb.lab.rowwise.aliasing import into_table
from embnb.metrics import max_over_mean
from embnb.rowwise import Routing, TableLayout
from embnb.steptime import GlobalBatch, batch_from_keys, measure_routing

CASES = ("frequency", "strided", "hashed")
ROUTINGS = tuple(r.value for r in Routing)
TABLE = "table"


def case_ids(
    case: str, num_ids: int, num_embeddings: int, stride: int, alpha: float, seed: int
) -> torch.Tensor:
    """`num_ids` ids in [0, num_embeddings) of one stream (module docstring)."""
    check_choice("case", case, CASES)
    check_int("num_embeddings", num_embeddings, low=1)
    gen = torch.Generator().manual_seed(seed)
    if case == "frequency":  # embnb.data's Zipf sampler (inverse CDF), its rank as the id: no permutation
        uniform = torch.rand(num_ids, generator=gen, dtype=torch.float64)
        ranks = torch.searchsorted(zipf_cdf(num_embeddings, float(alpha)), uniform)
        return ranks.clamp_(max=num_embeddings - 1)
    if case == "strided":
        check_int("stride", stride, low=1, high=num_embeddings)
        return torch.randint(0, -(-num_embeddings // stride), (num_ids,), generator=gen) * stride
    return into_table(make_keys("uniform", num_ids, seed), num_embeddings, "hash")


@dataclass(frozen=True)
class LoadsConfig:
    """What section 7's rank-by-rank replay measures (defaults: the notebook's)."""

    world_sizes: tuple[int, ...] = (8, 64)
    cases: tuple[str, ...] = CASES
    routings: tuple[str, ...] = ROUTINGS
    ids_per_rank: int = 2048  # ids in each rank's local batch
    bag_size: int = 16  # ids per bag
    num_embeddings: int = 1_048_576  # rows of the table
    embedding_dim: int = 64
    stride: int = 8  # the strided stream's stride
    alpha: float = 1.05  # Zipf exponent of the frequency-numbered vocabulary
    threads: int = 1  # intra-op threads while a rank is replayed
    warmup: int = 1
    repeats: int = 5
    seed: int = 0


RANK_COLUMNS = (
    "case world_size routing rank rows ids ids_replayed lookup_ms lookup_wall_ms lookup_ms_low lookup_ms_high"
).split()


def layout_batch(ids: torch.Tensor, layout: TableLayout, bag_size: int) -> GlobalBatch:
    """The global batch `ids` (int64 `[W * ids per rank]`, rank 0's local ids first) as `layout`'s
    storage slots, in bags of `bag_size` ids."""
    return batch_from_keys(list(layout.slots(ids).view(layout.world_size, -1)), bag_size, table=TABLE)


def measure_case(ids: torch.Tensor, layout: TableLayout, config: LoadsConfig, case: str) -> list[tuple]:
    """Rank by rank, the lookups of the global batch `ids` (rank 0's local ids first) under `layout`:
    torchrec's blocks over the storage slots (each rank the local rows the sharder sends it); the
    collectives not timed. One `RANK_COLUMNS` row per rank: its storage rows, the ids it owns (counted
    from the layout), the ids the replayed lookup received, the lookup's median ms (forward + backward
    with the fused optimizer; thread CPU time and wall time) and its [min, max] over repeats (CPU)."""
    c, w = config, layout.world_size
    rows, dims, block = {TABLE: layout.storage_rows}, {TABLE: c.embedding_dim}, {TABLE: layout.block_size}
    # the dense part at its smallest: every rank has the same local batch
    options = dict(threads=c.threads, warmup=c.warmup, repeats=c.repeats, hidden=(8,))
    times = measure_routing(layout_batch(ids, layout, c.bag_size), "continuous", rows, dims, block, **options)
    owned = torch.bincount(layout.owner(ids), minlength=w).tolist()
    return [
        (case, w, layout.routing.value, r.rank, storage, n, r.num_ids)
        + (r.lookup.median_s("cpu") * 1e3, r.lookup.median_s("wall") * 1e3)
        + tuple(t * 1e3 for t in r.lookup.range_s("cpu"))
        for r, storage, n in zip(times.ranks, layout.rows_per_rank(), owned)
    ]


def measure_loads(config: LoadsConfig, progress: bool = False) -> pd.DataFrame:
    """Every (case, W, routing) of `config`, one `RANK_COLUMNS` row per rank; one global batch per
    (case, W), the same for each routing."""
    grid, rows, c = [(case, w) for case in config.cases for w in config.world_sizes], [], config
    for case, w in tqdm(grid, desc="case, W", leave=False, disable=not progress):
        check_int("world_size", w, low=2)
        ids = case_ids(case, w * c.ids_per_rank, c.num_embeddings, c.stride, c.alpha, c.seed)
        for routing in c.routings:
            rows += measure_case(ids, TableLayout(c.num_embeddings, w, routing, c.seed), c, case)
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def case_table(loads: pd.DataFrame) -> pd.DataFrame:
    """Per (case, world_size, routing) of `measure_loads`' ranks: max/mean of the ids and of the lookup
    time, and the slowest and the median rank's ms (CPU time)."""
    ratio = lambda values: max_over_mean(values.tolist())  # noqa: E731
    return loads.groupby(["case", "world_size", "routing"], sort=False).agg(
        ids_max_over_mean=("ids", ratio),
        time_max_over_mean=("lookup_ms", ratio),
        slowest_ms=("lookup_ms", "max"),
        median_ms=("lookup_ms", "median"),
    )


SAME = 1.1  # routings whose ids max/mean are within this factor balance a stream alike


def rank_spread(cases: pd.DataFrame, world_size: int) -> float | None:
    """The replay's rank-to-rank spread at `world_size` (`cases`: a `case_table`): the largest
    lookup-time max/mean among the cases whose ids are balanced (ids max/mean < SAME); None if none is."""
    at = cases.xs(world_size, level="world_size")
    spreads = at.loc[at.ids_max_over_mean < SAME, "time_max_over_mean"]
    return float(spreads.max()) if len(spreads) else None


def step_verdicts(cases: pd.DataFrame) -> list[dict]:
    """Per (stream, W) of a `case_table` whose routings' ids max/mean differ by SAME or more: the routing
    with the least balanced ids, its slowest rank's lookup over the slowest rank of each other routing
    (the smallest of those ratios), the rank-to-rank spread that balanced ids show at that W, and
    whether the ratio exceeds it (`told_apart`): below it this replay cannot tell the routings' steps
    apart."""
    verdicts = []
    for (case, w), group in cases.groupby(level=["case", "world_size"], sort=False):
        group = group.droplevel(["case", "world_size"])
        if group.ids_max_over_mean.max() / group.ids_max_over_mean.min() < SAME:
            continue
        worst = group.ids_max_over_mean.idxmax()
        ratio = group.slowest_ms[worst] / group.slowest_ms.drop(worst).max()
        spread = rank_spread(cases, w)
        verdicts.append(
            {
                "case": case,
                "world_size": int(w),
                "least_balanced": worst,
                "ids_max_over_mean": float(group.ids_max_over_mean[worst]),
                "slowest_over_others": float(ratio),
                "balanced_spread": spread,
                "told_apart": spread is not None and bool(ratio > spread),
            }
        )
    return verdicts

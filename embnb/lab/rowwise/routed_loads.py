"""Notebook 01's measured section: torchrec row-wise tables under each routing of embnb's sharders.

Three id streams (`case_ids`) go into one table of `num_embeddings` rows: `frequency` (Zipf ranks as
ids: id 0 the hottest), `strided` (`k * stride`; the stride does not know W), `hashed` (uniform raw
keys, `fmix64(key) % num_embeddings`). Each is laid out by `embnb.rowwise.TableLayout` at each W;
the ids per rank are counted from the layout, then each rank's lookups are replayed with real
kernels, one rank after another (`embnb.steptime.measure_ranks` on the storage slots in torchrec's
contiguous blocks: each rank looks up the local rows the routed sharder's input distribution sends
it).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch

from embnb._checks import check_choice, check_int
from embnb.data import make_keys, zipf_probs
from embnb.lab.rowwise.aliasing import into_table
from embnb.metrics import max_over_mean
from embnb.rowwise import Routing, TableLayout
from embnb.steptime import batch_from_keys
from embnb.steptime.measure import StepOptions, measure_ranks
from embnb.steptime.work import routing_work

__all__ = [
    "CASES",
    "ROUTINGS",
    "LoadsConfig",
    "RoutedCase",
    "RoutedLoads",
    "case_ids",
    "measure_loads",
    "rank_spread",
    "step_verdicts",
]

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
    if case == "frequency":  # inverse CDF of Zipf(alpha) over the vocabulary: the rank is the id
        cdf = torch.cumsum(zipf_probs(num_embeddings, alpha).to(torch.float64), 0)
        ranks = torch.searchsorted(cdf, torch.rand(num_ids, generator=gen, dtype=torch.float64) * cdf[-1])
        return ranks.clamp_(max=num_embeddings - 1)
    if case == "strided":
        check_int("stride", stride, low=1, high=num_embeddings)
        return torch.randint(0, -(-num_embeddings // stride), (num_ids,), generator=gen) * stride
    return into_table(make_keys("uniform", num_ids, seed), num_embeddings, "hash")


@dataclass(frozen=True)
class LoadsConfig:
    """What section 8's rank-by-rank replay measures (defaults: the notebook's)."""

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


@dataclass(frozen=True)
class RoutedCase:
    """One (case, W, routing): per rank, its storage rows, the ids it owns (counted from the
    layout), the ids the replayed lookup received, and the lookup's median time in ms
    (forward + backward with the fused optimizer; thread CPU time and wall time)."""

    case: str
    world_size: int
    routing: str
    rows_per_rank: list[int]
    ids_per_rank: list[int]
    ids_replayed: list[int]
    lookup_ms: list[float]
    lookup_wall_ms: list[float]
    lookup_ms_range: list[list[float]]  # per rank: [min, max] over repeats, thread CPU time

    @property
    def ids_max_over_mean(self) -> float:
        return max_over_mean(self.ids_per_rank)

    @property
    def time_max_over_mean(self) -> float:
        return max_over_mean(self.lookup_ms)

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "ids_max_over_mean": self.ids_max_over_mean,
            "time_max_over_mean": self.time_max_over_mean,
            "busiest_rank": self.ids_per_rank.index(max(self.ids_per_rank)),
            "slowest_rank": self.lookup_ms.index(max(self.lookup_ms)),
        }


@dataclass(frozen=True)
class RoutedLoads:
    config: LoadsConfig
    cases: list[RoutedCase]
    machine: str

    def case(self, case: str, world_size: int, routing: str) -> RoutedCase:
        return next(c for c in self.cases if (c.case, c.world_size, c.routing) == (case, world_size, routing))

    def to_json(self) -> dict:
        return {
            "config": asdict(self.config),
            "machine": self.machine,
            "clock": "cpu",
            "cases": [c.to_json() for c in self.cases],
        }


def measure_case(ids: torch.Tensor, layout: TableLayout, config: LoadsConfig, case: str) -> RoutedCase:
    """Rank by rank, the lookups of the global batch `ids` (rank 0's local ids first) under `layout`:
    torchrec's blocks over the storage slots (each rank the local rows the sharder sends it); no
    collectives counted."""
    w = layout.world_size
    batch = batch_from_keys(list(layout.slots(ids).view(w, -1)), config.bag_size, table=TABLE)
    rows, dims, block = (
        {TABLE: layout.storage_rows},
        {TABLE: config.embedding_dim},
        {TABLE: layout.block_size},
    )
    times = measure_ranks(
        lambda rank: routing_work(batch, "continuous", rows, dims, rank, block),
        w,
        options=StepOptions(
            threads=config.threads,
            warmup=config.warmup,
            repeats=config.repeats,
            hidden=(8,),  # the dense part at its smallest: every rank has the same local batch
        ),
    )
    return RoutedCase(
        case,
        w,
        layout.routing.value,
        layout.rows_per_rank(),
        torch.bincount(layout.owner(ids), minlength=w).tolist(),
        [r.num_ids for r in times.ranks],
        [r.lookup.median_s("cpu") * 1e3 for r in times.ranks],
        [r.lookup.median_s("wall") * 1e3 for r in times.ranks],
        [[t * 1e3 for t in r.lookup.range_s("cpu")] for r in times.ranks],
    )


def measure_loads(config: LoadsConfig, progress: bool = False) -> RoutedLoads:
    """Every (case, W, routing) of `config`; one global batch per (case, W), the same for each routing."""
    grid = [(case, w) for w in config.world_sizes for case in config.cases]
    if progress:
        from tqdm.auto import tqdm

        grid = tqdm(grid, desc="case, W", leave=False)
    cases = []
    for case, w in grid:
        check_int("world_size", w, low=2)
        ids = case_ids(
            case, w * config.ids_per_rank, config.num_embeddings, config.stride, config.alpha, config.seed
        )
        for routing in config.routings:
            layout = TableLayout(config.num_embeddings, w, routing, config.seed)
            cases.append(measure_case(ids, layout, config, case))
    from embnb.timing import machine_name

    return RoutedLoads(config, cases, machine_name("cpu"))


def summary_rows(loads: RoutedLoads) -> list[dict]:
    """Per (case, W, routing): ids and time max/mean, and the slowest rank's ms."""
    return [
        {
            "case": c.case,
            "W": c.world_size,
            "routing": c.routing,
            "ids max/mean": c.ids_max_over_mean,
            "time max/mean (cpu)": c.time_max_over_mean,
            "slowest rank ms (cpu)": max(c.lookup_ms),
            "median rank ms (cpu)": statistics.median(c.lookup_ms),
        }
        for c in loads.cases
    ]


SAME = 1.1  # routings whose ids max/mean are within this factor balance a stream alike


def rank_spread(loads: RoutedLoads, world_size: int) -> float | None:
    """The replay's rank-to-rank spread at `world_size`: the largest lookup-time max/mean among the
    cases whose ids are balanced (ids max/mean < SAME); None if no case is."""
    spreads = [
        c.time_max_over_mean for c in loads.cases if c.world_size == world_size and c.ids_max_over_mean < SAME
    ]
    return max(spreads) if spreads else None


def step_verdicts(loads: RoutedLoads) -> list[dict]:
    """Per (stream, W) whose routings' ids max/mean differ by SAME or more: the routing with the least
    balanced ids, its slowest rank's lookup over the slowest rank of each other routing (the smallest
    of those ratios), the rank-to-rank spread that balanced ids show at that W, and whether the ratio
    exceeds it (`told_apart`): below it this replay cannot tell the routings' steps apart."""
    verdicts = []
    for case in loads.config.cases:
        for w in loads.config.world_sizes:
            cases = [loads.case(case, w, r) for r in loads.config.routings]
            ratios = [c.ids_max_over_mean for c in cases]
            if max(ratios) / min(ratios) < SAME:
                continue
            worst = max(cases, key=lambda c: c.ids_max_over_mean)
            others = [max(c.lookup_ms) for c in cases if c is not worst]
            ratio = max(worst.lookup_ms) / max(others)
            spread = rank_spread(loads, w)
            verdicts.append(
                {
                    "case": case,
                    "world_size": w,
                    "least_balanced": worst.routing,
                    "ids_max_over_mean": worst.ids_max_over_mean,
                    "slowest_over_others": ratio,
                    "balanced_spread": spread,
                    "told_apart": spread is not None and ratio > spread,
                }
            )
    return verdicts

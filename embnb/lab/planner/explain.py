"""Looking inside the proposer: its options, a knapsack small enough to work by hand, the plain
knapsack's frontier, and why the least summed perf is not the plan to take: brute force over tiny
instances (the proposer is checked against it), every combination of options placed by torchrec's
GreedyPerfPartitioner and rated by its NoopPerfModel (the slowest rank), as its planner places and
rates a proposal."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, ShardingOption, Topology
from torchrec.distributed.planner.utils import reset_shard_rank
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from embnb._checks import check_int
from embnb.lab.planner.models import Enumerated, enumerate_options
from embnb.planner.knapsack import Knapsack, knapsack_axes
from embnb.planner.space import AXES, GB, SearchSpace, by_table
from embnb.planner.topology import make_topology, reserved_topology

__all__ = ["PlanRater", "brute_force_rating", "rate_every_plan", "option_label"]
__all__ += ["SmallKnapsack", "small_knapsack", "memory_ratio", "knapsack_frontier"]
__all__ += ["plan_extremes", "TINY_LIMITS", "SMALL_LIMITS", "tiny_instance"]
__all__ += ["summed_vs_rated", "share_by_tightness"]

# The knapsack worked by hand: two options per table, one memory each (HBM).
SMALL_LIMITS = {"sharding_types": ["table_wise"], "compute_kernels": ["fused", "fused_uvm_caching"]}
# A tiny instance: row-wise too, four options per table, 64 plans of three tables.
TINY_LIMITS = SMALL_LIMITS | {"sharding_types": ["table_wise", "row_wise"]}
_ROWS, _DIMS, _POOLING = (250_000, 500_000, 1_000_000, 2_000_000), (32, 64, 128), (1.0, 2.0, 5.0, 10.0, 20.0)
_HBM_GB = (0.25, 0.5, 0.75, 1.0)


def option_label(option: ShardingOption) -> str:
    return f"{option.sharding_type}/{option.compute_kernel}"


class PlanRater:
    """Places and rates one proposal as torchrec's planner does (NaN: cannot be placed)."""

    def __init__(self, enumerated: Enumerated, topology: Topology, batch_size: int, reservation: float):
        self.constraint = reserved_topology(topology, enumerated, batch_size, reservation)
        self.partitioner, self.perf_model = GreedyPerfPartitioner(), NoopPerfModel(topology)

    def __call__(self, proposal: list[ShardingOption]) -> float:
        try:
            return self.perf_model.rate(self.partitioner.partition(proposal, self.constraint))
        except PlannerError:
            return math.nan
        finally:
            reset_shard_rank(proposal)


def brute_force_rating(
    enumerated: Enumerated, topology: Topology, batch_size: int, storage_reservation_percentage: float = 0.15
) -> float:
    """The best rating over every combination of options (inf if none can be placed), tried by a
    lower bound (the mean rank load, or the largest shard) until no untried one can beat the best."""

    def bound(plan: tuple[ShardingOption, ...]) -> float:
        largest = max(shard.perf.total for option in plan for shard in option.shards)
        return max(sum(option.total_perf for option in plan) / topology.world_size, largest)

    rate, best = PlanRater(enumerated, topology, batch_size, storage_reservation_percentage), math.inf
    for plan in sorted(itertools.product(*by_table(enumerated.options)), key=bound):
        if bound(plan) >= best:
            break
        rating = rate(list(plan))
        if not math.isnan(rating):
            best = min(best, rating)
    return best


def rate_every_plan(
    enumerated: Enumerated, topology: Topology, batch_size: int, storage_reservation_percentage: float = 0.15
) -> pd.DataFrame:
    """Every combination of options, one row each: each table's option, the plan's HBM and DDR
    (GiB), its summed perf and its rating (NaN where it cannot be placed). Raises ValueError past
    100,000 combinations."""
    groups = by_table(enumerated.options)
    count = math.prod(len(g) for g in groups)
    if count > 100_000:
        raise ValueError(f"{count} combinations is more than 100,000: use fewer tables or options")
    rate, rows = PlanRater(enumerated, topology, batch_size, storage_reservation_percentage), []
    for proposal in map(list, itertools.product(*groups)):
        rows.append(
            {o.name: option_label(o) for o in proposal}
            | {
                "hbm_gb": sum(o.total_storage.hbm for o in proposal) / GB,
                "ddr_gb": sum(o.total_storage.ddr for o in proposal) / GB,
                "summed_perf": sum(o.total_perf for o in proposal),
                "perf_rating": rate(proposal),
            }
        )
    return pd.DataFrame(rows)


def memory_ratio(
    enumerated: Enumerated, topology: Topology, batch_size: int, storage_reservation_percentage: float = 0.15
) -> float:
    """How tight memory is: the devices' HBM after the storage reservation over the HBM of the
    least summed perf plan (each table's option with the least estimated perf). Below 1 memory
    binds in total; at or above 1 the fastest options may still not fit device by device."""
    need = sum(min(g, key=lambda o: o.total_perf).total_storage.hbm for g in by_table(enumerated.options))
    reserved = reserved_topology(topology, enumerated, batch_size, storage_reservation_percentage)
    return sum(d.storage.hbm for d in reserved.devices) / need if need else math.inf


@dataclass(frozen=True)
class SmallKnapsack:
    """A knapsack small enough to work by hand (notebook 03's page fills its DP table): each
    table's options (labels) with torchrec's estimated summed perf (ms) and HBM (GiB, and in whole
    bins rounded up, so a plan within `capacity` bins fits the devices' HBM together); each
    option's largest shard's perf and HBM, and torchrec's rating (`rate`, NaN: cannot be placed)."""

    tables: list[str]
    options: list[list[str]]
    perfs: list[list[float]]
    hbm_gb: list[list[float]]
    memories: list[list[int]]
    bin_gb: float
    capacity: int
    shard_perfs: list[list[float]] = field(default_factory=list)
    shard_hbm_gb: list[list[float]] = field(default_factory=list)
    rate: Callable[[Sequence[int]], float] | None = field(default=None, repr=False)

    def describe(self) -> pd.DataFrame:
        """One row per table and option: perf and HBM (GiB and bins)."""
        columns = {"option": self.options, "perf": self.perfs, "hbm_gb": self.hbm_gb, "bins": self.memories}
        frame = pd.DataFrame({"table": self.tables, **columns}).explode(list(columns), ignore_index=True)
        return frame.infer_objects()


def small_knapsack(
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    num_bins: int,
    storage_reservation_percentage: float = 0.15,
) -> SmallKnapsack:
    """The options the knapsack chooses from (`SearchSpace`'s: options alike for the partitioner
    once, none whose largest shard fits on no device; one per label and table, sorted by label)
    and the devices' HBM cut into `num_bins` bins. Raises ValueError where no plan fits."""
    check_int("num_bins", num_bins, low=1, high=60)
    reserved = reserved_topology(topology, enumerated, batch_size, storage_reservation_percentage)
    space = SearchSpace(by_table(enumerated.options), reserved)
    options = pd.DataFrame(
        {
            "table": option.name,
            "option": option_label(option),
            "perf": space.perf[t, o],
            "hbm_gb": space.mem[t, o, 0] / GB,
            "shard_perf": max(s.perf.total for s in option.shards),
            "shard_hbm_gb": max(s.storage.hbm for s in option.shards) / GB,
            "sharding_option": option,
        }
        for t, options in enumerate(space.options)
        for o, option in enumerate(options)
    )
    tables = list(dict.fromkeys(options.table))  # in the model's order
    bin_gb = float(space.capacity[0]) / GB / num_bins
    options["bins"] = [math.ceil(gb / bin_gb - 1e-9) for gb in options.hbm_gb]  # rounded up
    options = options.drop_duplicates(["table", "option"]).sort_values("option", kind="stable")
    per_table = options.groupby("table").agg(list).loc[tables]  # each column: a list per table
    perfs, memories = per_table.perf.tolist(), per_table.bins.tolist()
    if sum(min(m) for m in memories) > num_bins:
        raise ValueError(f"no plan fits {num_bins} bins of {bin_gb:.4g} GiB: give more memory or bins")
    objects = per_table.sharding_option.tolist()
    rater = PlanRater(enumerated, topology, batch_size, storage_reservation_percentage)
    return SmallKnapsack(
        tables,
        per_table.option.tolist(),
        perfs,
        per_table.hbm_gb.tolist(),
        memories,
        bin_gb,
        num_bins,
        per_table.shard_perf.tolist(),
        per_table.shard_hbm_gb.tolist(),
        lambda plan: rater([objects[t][o] for t, o in enumerate(plan)]),
    )


def knapsack_frontier(
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    bins_per_device: int = 100,
    ddr_bins_per_device: int = 10,
    storage_reservation_percentage: float = 0.15,
) -> pd.DataFrame:
    """The plain knapsack's plans in the order the proposer takes them, from the largest memory
    down: memory (GiB) and summed perf; `.attrs["axes"]`: the memory axes the knapsack bins (those
    that can bind)."""
    reserved = reserved_topology(topology, enumerated, batch_size, storage_reservation_percentage)
    space = SearchSpace(by_table(enumerated.options), reserved)
    axes, capacity, bins, weights = knapsack_axes(space, bins_per_device, ddr_bins_per_device)
    knapsack = Knapsack(capacity, bins)
    for t in range(len(space.options)):
        knapsack.add_table(t, weights[t], space.perf[t])
    plans = knapsack.frontier(len(space.options))
    tables = np.arange(len(space.options))
    frame = pd.DataFrame(
        {
            "hbm_gb": space.mem[tables, plans, 0].sum(-1) / GB,
            "ddr_gb": space.mem[tables, plans, 1].sum(-1) / GB,
            "summed_perf": space.perf[tables, plans].sum(-1),
        }
    )
    frame.attrs["axes"] = [AXES[a] for a in axes]
    return frame


def plan_extremes(every_plan: pd.DataFrame) -> pd.DataFrame:
    """Three rows of a brute-force table (`rate_every_plan`: columns summed_perf and perf_rating,
    NaN: not placeable): the `least summed` perf (placeable or not), the `least summed placeable`
    and the `best rated` (ties: the least summed perf); `.attrs`: `placeable` plans of `plans`.
    Raises ValueError where none can be placed."""
    placeable = every_plan.dropna(subset=["perf_rating"])
    if placeable.empty:
        raise ValueError(f"none of the {len(every_plan)} plans can be placed: no best plan")
    extremes = pd.DataFrame(
        {
            "least summed": every_plan.loc[every_plan.summed_perf.idxmin()],
            "least summed placeable": placeable.loc[placeable.summed_perf.idxmin()],
            "best rated": every_plan.sort_values(["perf_rating", "summed_perf"]).iloc[0],
        }
    ).T
    extremes.attrs.update(placeable=len(placeable), plans=len(every_plan))
    return extremes


def tiny_instance(
    spec: Sequence[tuple[str, int, int, float]],
    hbm_gb: float,
    world_size: int = 2,
    batch_size: int = 512,
    ddr_gb: float = 128.0,
    limits: dict[str, list[str]] | None = None,
) -> tuple[Enumerated, Topology]:
    """Tables `spec` (name, rows, dim, pooling factor) on `world_size` GPUs with `hbm_gb` GiB of HBM
    each, their options enumerated by torchrec under `limits` (default `TINY_LIMITS`)."""
    limits = TINY_LIMITS if limits is None else limits
    tables = [EmbeddingBagConfig(r, d, n, feature_names=[n]) for n, r, d, _ in spec]
    constraints = {name: ParameterConstraints(pooling_factors=[pf], **limits) for name, _, _, pf in spec}
    topology = make_topology(world_size, "cuda", hbm_cap_gb=hbm_gb, ddr_cap_gb=ddr_gb)
    return enumerate_options(tables, topology, batch_size, constraints), topology


def summed_vs_rated(
    num_instances: int, seed: int = 0, batch_size: int = 512, storage_reservation_percentage: float = 0.15
) -> pd.DataFrame:
    """Random tiny instances on two GPUs (rows, dims, pooling factors and HBM drawn from a few round
    values), one row each: the rating of the least summed perf plan the partitioner can place over
    the best rating (1: it is the best), whether the least summed perf of all cannot be placed, and
    `memory_ratio`. Instances where no plan can be placed are left out."""
    check_int("num_instances", num_instances, low=1)
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_instances):
        spec = [
            (name, int(rng.choice(_ROWS)), int(rng.choice(_DIMS)), float(rng.choice(_POOLING)))
            for name in ("user_id", "item_id", "ad_id")
        ]
        enumerated, topology = tiny_instance(spec, float(rng.choice(_HBM_GB)), batch_size=batch_size)
        every_plan = rate_every_plan(enumerated, topology, batch_size, storage_reservation_percentage)
        if every_plan.perf_rating.isna().all():
            continue
        rating = plan_extremes(every_plan).perf_rating
        rows.append(
            {
                "least_placed_sum_over_best": rating["least summed placeable"] / rating["best rated"],
                "least_sum_unplaceable": bool(math.isnan(rating["least summed"])),
                "memory_ratio": memory_ratio(
                    enumerated, topology, batch_size, storage_reservation_percentage
                ),
            }
        )
    return pd.DataFrame(rows)


def share_by_tightness(pitfall: pd.DataFrame, edges: Sequence[float] = (0.5, 1.0, 2.0)) -> pd.DataFrame:
    """`summed_vs_rated`'s instances grouped by `memory_ratio` (bins cut at `edges`), one row per
    bin: instances, those where the least summed placeable plan rates worse than the best (beyond
    rounding), and their share."""
    if pitfall.empty:
        raise ValueError("pitfall is empty: no instance had a plan")
    bins = pd.cut(pitfall.memory_ratio, [0.0, *edges, math.inf], right=False)
    worse = (pitfall.least_placed_sum_over_best > 1 + 1e-9).groupby(bins, observed=False)
    table = pd.DataFrame({"instances": worse.size(), "worse": worse.sum()})
    table["share"] = table.worse / table.instances.where(table.instances > 0)
    return table.set_axis(table.index.astype(str)).rename_axis("memory_ratio")  # "[0.5, 1.0)"

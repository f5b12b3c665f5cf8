"""Looking inside the proposer: its options, its DP table, its frontier, and
what a brute-force table says about the least summed perf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from torchrec.distributed.planner.types import Topology

from embnb._checks import check_int
from embnb.lab.planner.brute_force import PlanRater, option_label
from embnb.lab.planner.models import Enumerated
from embnb.lab.planner.reference import backtrack, knapsack_choices
from embnb.planner.knapsack import Knapsack, knapsack_axes
from embnb.planner.space import AXES, GB, SearchSpace, by_table
from embnb.planner.topology import reserved_topology

__all__ = [
    "options_table",
    "SmallKnapsack",
    "small_knapsack",
    "memory_ratio",
    "knapsack_frontier",
    "PlanExtremes",
    "plan_extremes",
]


def _space_of(
    enumerated: Enumerated, topology: Topology, batch_size: int, storage_reservation_percentage: float
) -> SearchSpace:
    constraint = reserved_topology(topology, enumerated, batch_size, storage_reservation_percentage)
    return SearchSpace(by_table(enumerated.options), constraint)


def options_table(
    enumerated: Enumerated, topology: Topology, batch_size: int, storage_reservation_percentage: float = 0.15
) -> pd.DataFrame:
    """The options the knapsack chooses from, one row per table and option:
    summed perf, memory (GiB), and the largest shard's perf and memory.
    Options alike for the partitioner are shown once; options whose largest
    shard fits on no device are left out."""
    space = _space_of(enumerated, topology, batch_size, storage_reservation_percentage)
    rows = []
    for t, options in enumerate(space.options):
        for o, option in enumerate(options):
            shards = option.shards
            rows.append(
                {
                    "table": option.name,
                    "option": option_label(option),
                    "shards": len(shards),
                    "perf": space.perf[t, o],
                    "hbm_gb": space.mem[t, o, 0] / GB,
                    "ddr_gb": space.mem[t, o, 1] / GB,
                    "shard_perf": max(s.perf.total for s in shards),
                    "shard_hbm_gb": max(s.storage.hbm for s in shards) / GB,
                    "sharding_option": option,
                }
            )
    return pd.DataFrame(rows)


def memory_ratio(
    enumerated: Enumerated, topology: Topology, batch_size: int, storage_reservation_percentage: float = 0.15
) -> float:
    """How tight memory is: the devices' HBM after the storage reservation
    over the HBM of the least summed perf plan (each table's option with the
    least estimated perf). Below 1 memory binds in total: the fastest
    options do not fit all devices together; at or above 1 they may still
    not fit device by device."""
    need = sum(min(g, key=lambda o: o.total_perf).total_storage.hbm for g in by_table(enumerated.options))
    reserved = reserved_topology(topology, enumerated, batch_size, storage_reservation_percentage)
    return sum(d.storage.hbm for d in reserved.devices) / need if need else math.inf


@dataclass(frozen=True)
class SmallKnapsack:
    """A knapsack small enough to work by hand: each table's options with
    torchrec's estimated perf and their HBM in whole bins (rounded up, so a
    plan within `capacity` bins fits the devices' HBM together), the DP
    table of `embnb.lab.planner.reference.knapsack_choices` and its best plan."""

    tables: list[str]
    options: list[list[str]]  # option labels per table ("table_wise/fused", ...)
    perfs: list[list[float]]  # estimated summed perf, ms
    hbm_gb: list[list[float]]  # exact HBM, GiB
    memories: list[list[int]]  # HBM in bins, rounded up
    bin_gb: float
    capacity: int  # bins: the devices' HBM after the storage reservation
    rows: list[list[float]]  # rows[t][m]: least summed perf of tables 0..t in exactly m bins
    choices: list[list[int]]  # choices[t][m]: the option of table t that cell took (-1: none)
    end: int  # the bin where the best plan ends (the last row's least perf)
    plan: list[int]  # the best plan's option per table, backtracked from `end`
    shard_perfs: list[list[float]] = field(default_factory=list)  # each option's largest shard's perf, ms
    shard_hbm_gb: list[list[float]] = field(default_factory=list)  # each option's largest shard's HBM, GiB
    rate: Callable[[Sequence[int]], float] | None = field(
        default=None, repr=False
    )  # torchrec's; NaN: unplaced

    def describe(self) -> pd.DataFrame:
        """One row per table and option: perf, HBM (GiB and bins), and
        whether the best plan takes it."""
        return pd.DataFrame(
            [
                {
                    "table": table,
                    "option": label,
                    "perf": perf,
                    "hbm_gb": hbm,
                    "bins": bins,
                    "in best plan": o == self.plan[t],
                }
                for t, table in enumerate(self.tables)
                for o, (label, perf, hbm, bins) in enumerate(
                    zip(self.options[t], self.perfs[t], self.hbm_gb[t], self.memories[t])
                )
            ]
        )


def small_knapsack(
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    num_bins: int,
    storage_reservation_percentage: float = 0.15,
) -> SmallKnapsack:
    """The options of `options_table` (one per label and table, sorted by
    label), the devices' HBM cut into `num_bins` bins, and the DP table of
    `knapsack_choices` over them with its best plan."""
    check_int("num_bins", num_bins, low=1, high=60)
    space = _space_of(enumerated, topology, batch_size, storage_reservation_percentage)
    capacity_gb = float(space.capacity[0]) / GB
    options = options_table(enumerated, topology, batch_size, storage_reservation_percentage)
    tables = list(dict.fromkeys(options.table))  # in the model's order
    options = options.drop_duplicates(["table", "option"]).sort_values("option", kind="stable")
    by_name = [options[options.table == name] for name in tables]
    bin_gb = capacity_gb / num_bins
    memories = [[math.ceil(gb / bin_gb - 1e-9) for gb in rows.hbm_gb] for rows in by_name]
    perfs = [rows.perf.tolist() for rows in by_name]
    rows, choices = knapsack_choices(perfs, memories, num_bins)
    objects = [r.sharding_option.tolist() for r in by_name]
    rater = PlanRater(enumerated, topology, batch_size, storage_reservation_percentage)
    last = rows[-1]
    end = min(range(num_bins + 1), key=lambda m: last[m])
    if not math.isfinite(last[end]):
        raise ValueError(f"no plan fits {num_bins} bins of {bin_gb:.4g} GiB: give more memory or bins")
    return SmallKnapsack(
        tables=tables,
        options=[r.option.tolist() for r in by_name],
        perfs=perfs,
        hbm_gb=[r.hbm_gb.tolist() for r in by_name],
        memories=memories,
        bin_gb=bin_gb,
        capacity=num_bins,
        rows=rows,
        choices=choices,
        end=end,
        plan=backtrack(choices, memories, end),
        shard_perfs=[r.shard_perf.tolist() for r in by_name],
        shard_hbm_gb=[r.shard_hbm_gb.tolist() for r in by_name],
        rate=lambda plan: rater([objects[t][o] for t, o in enumerate(plan)]),
    )


def knapsack_frontier(
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    bins_per_device: int = 100,
    ddr_bins_per_device: int = 10,
    storage_reservation_percentage: float = 0.15,
) -> pd.DataFrame:
    """The plain knapsack's plans in the order the proposer takes them, from
    the largest memory down: memory (GiB), summed perf and each table's
    option; `.attrs["axes"]`: the memory axes the knapsack bins (those that
    can bind)."""
    space = _space_of(enumerated, topology, batch_size, storage_reservation_percentage)
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
    for t, options in enumerate(space.options):
        frame[options[0].name] = [option_label(options[o]) for o in plans[:, t]]
    frame.attrs["axes"] = [AXES[a] for a in axes]  # those that can bind
    return frame


@dataclass(frozen=True)
class PlanExtremes:
    """Three rows of a brute-force table (`rate_every_plan`): what the least
    summed perf misses about the planner's rating (the slowest rank)."""

    least_sum: pd.Series  # the least summed perf, placeable or not
    least_placed_sum: pd.Series  # the least summed perf the partitioner can place
    best_rated: pd.Series  # the best perf rating (ties: the least summed perf)
    placeable: int  # plans the partitioner can place
    plans: int  # plans in all

    def table(self) -> pd.DataFrame:
        """The three plans, one row each (summed perf, rating: NaN where it cannot be placed)."""
        rows = {"least summed": self.least_sum, "least summed placeable": self.least_placed_sum}
        return pd.DataFrame({**rows, "best rated": self.best_rated}).T


def plan_extremes(every_plan: pd.DataFrame) -> PlanExtremes:
    """The least summed perf, the least placeable one and the best rated of
    `every_plan` (columns summed_perf and perf_rating, NaN: not placeable)."""
    placeable = every_plan.dropna(subset=["perf_rating"])
    if placeable.empty:
        raise ValueError(f"none of the {len(every_plan)} plans can be placed: no best plan")
    return PlanExtremes(
        least_sum=every_plan.loc[every_plan.summed_perf.idxmin()],
        least_placed_sum=placeable.loc[placeable.summed_perf.idxmin()],
        best_rated=every_plan.sort_values(["perf_rating", "summed_perf"]).iloc[0],
        placeable=len(placeable),
        plans=len(every_plan),
    )

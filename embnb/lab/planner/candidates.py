"""Plans to measure, each with torchrec's own estimate beside it: the
planners' plans (embnb's DP, torchrec's DP, Greedy, torchrec's default set)
and deliberately poor ones built from the same enumerated options (every
table table-wise on a few ranks; every table data-parallel).
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.planners import to_sharding_plan
from torchrec.distributed.planner.types import ShardingOption, Topology
from torchrec.distributed.types import ShardingPlan

from embnb._checks import check_int
from embnb.lab.planner.comparison import default_proposers
from embnb.lab.planner.models import Enumerated, Model, enumerate_options
from embnb.lab.planner.planning import run_planner

__all__ = [
    "CandidatePlan",
    "candidate_plans",
    "one_kind_on",
    "estimated_per_rank",
    "plan_shape",
    "PLANNERS",
]

PLANNERS = ("embnb DP", "torchrec DP", "Greedy", "torchrec default")
POOR = "poor on purpose"  # the note of the plans built to be slow


@dataclass(frozen=True)
class CandidatePlan:
    """A placed plan (ShardingOptions with their shards' ranks and torchrec's
    estimates), or None with the reason; torchrec's rating (NoopPerfModel:
    the slowest rank's estimated total)."""

    name: str
    options: list[ShardingOption] | None
    rating: float
    note: str = ""
    planning_s: float = math.nan

    def sharding_plan(self, topology: Topology) -> ShardingPlan:
        if self.options is None:
            raise ValueError(f"plan {self.name!r} has no plan: {self.note}")
        return to_sharding_plan(self.options, topology)


def one_kind_on(enumerated: Enumerated, sharding_type: str, ranks: Sequence[int]) -> list[ShardingOption]:
    """Every table's option of `sharding_type` (one shard per table, or
    every rank for data-parallel), table i on `ranks[i % len(ranks)]`."""
    chosen = {}
    for option in enumerated.options:
        if option.sharding_type == sharding_type and option.name not in chosen:
            chosen[option.name] = option
    missing = {o.name for o in enumerated.options} - set(chosen)
    if missing:
        raise ValueError(f"no {sharding_type!r} option for tables {sorted(missing)[:5]}")
    placed = []
    for i, option in enumerate(chosen.values()):
        option = copy.deepcopy(option)
        if sharding_type == "data_parallel":
            for rank, shard in enumerate(option.shards):
                shard.rank = rank
        else:
            if len(option.shards) != 1:
                raise ValueError(
                    f"{sharding_type!r} option of {option.name!r} has {len(option.shards)} shards"
                )
            option.shards[0].rank = ranks[i % len(ranks)]
        placed.append(option)
    return placed


def candidate_plans(
    model: Model,
    topology: Topology,
    batch_size: int,
    *,
    few_ranks: Sequence[int] = (1, 2),
    timeout_s: float = 120.0,
    enumerated: Enumerated | None = None,
) -> dict[str, CandidatePlan]:
    """The planners' plans (`PLANNERS`, from embnb.lab.planner.comparison's
    proposers over one enumeration) and poor ones: every table table-wise on
    the first k ranks for each k in `few_ranks`, and every table
    data-parallel."""
    check_int("batch_size", batch_size, low=1)
    enumerated = enumerated or enumerate_options(
        model.tables, topology, batch_size, model.constraints, "embnb"
    )
    proposers = default_proposers()
    plans = {}
    for name in PLANNERS:
        run = run_planner(
            proposers[name](), enumerated, topology, batch_size, name=name, constraints=model.constraints,
            timeout_s=timeout_s,
        )  # fmt: skip
        plans[name] = CandidatePlan(name, run.plan, run.perf_rating, run.note, run.seconds)
    rate = NoopPerfModel(topology).rate
    for k in few_ranks:
        check_int("few_ranks", k, low=1, high=topology.world_size)
        options = one_kind_on(enumerated, "table_wise", list(range(k)))
        name = f"all table-wise on {k} rank{'s' if k > 1 else ''}"
        plans[name] = CandidatePlan(name, options, rate(options), POOR)
    options = one_kind_on(enumerated, "data_parallel", [])
    plans["all data-parallel"] = CandidatePlan("all data-parallel", options, rate(options), POOR)
    return plans


def estimated_per_rank(options: Sequence[ShardingOption], world_size: int) -> dict[str, list[float]]:
    """torchrec's estimates summed per rank, in seconds: `total` (what its
    rating takes the maximum of), `compute` (forward + backward compute) and
    `comms` (forward + backward communication)."""
    shards = [shard for option in options for shard in option.shards]
    ms = {
        "total": [s.perf.total for s in shards],
        "compute": [s.perf.fwd_compute + s.perf.bwd_compute for s in shards],
        "comms": [s.perf.fwd_comms + s.perf.bwd_comms for s in shards],
    }
    ranks = np.array([shard.rank for shard in shards], dtype=np.int64)
    return {
        key: np.bincount(ranks, np.divide(values, 1e3), minlength=world_size).tolist()
        for key, values in ms.items()
    }


def plan_shape(options: Sequence[ShardingOption]) -> dict[str, int]:
    """Tables per sharding type, and the shards of all of them."""
    shape = dict(Counter(o.sharding_type for o in options))
    shape["shards"] = sum(len(o.shards) for o in options)
    return shape

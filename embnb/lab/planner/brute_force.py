"""Brute force: every combination of options, placed by torchrec's GreedyPerfPartitioner and rated
by its NoopPerfModel (the slowest rank), as torchrec's planner would place and rate a proposal.
Tiny models only; the proposer is checked against it."""

from __future__ import annotations

import itertools
import math

import pandas as pd
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.types import PlannerError, ShardingOption, Storage, Topology
from torchrec.distributed.planner.utils import reset_shard_rank

from embnb.lab.planner.models import Enumerated
from embnb.planner.space import GB, by_table
from embnb.planner.topology import reserved_topology

__all__ = ["PlanRater", "brute_force_rating", "rate_every_plan", "option_label"]


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
    groups = by_table(enumerated.options)
    perf = [[o.total_perf for o in g] for g in groups]
    shard = [[max(s.perf.total for s in o.shards) for o in g] for g in groups]
    combinations = itertools.product(*(range(len(g)) for g in groups))
    bounds = sorted(
        (
            max(
                sum(perf[t][i] for t, i in enumerate(c)) / topology.world_size,
                max(shard[t][i] for t, i in enumerate(c)),
            ),
            c,
        )
        for c in combinations
    )
    rate, best = PlanRater(enumerated, topology, batch_size, storage_reservation_percentage), math.inf
    for bound, combination in bounds:
        if bound >= best:
            break
        rating = rate([g[i] for g, i in zip(groups, combination)])
        if not math.isnan(rating):
            best = min(best, rating)
    return best


def rate_every_plan(
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    storage_reservation_percentage: float = 0.15,
    max_plans: int = 100_000,
) -> pd.DataFrame:
    """Every combination of options, one row each: each table's option, the plan's HBM and DDR
    (GiB), its summed perf and its rating (NaN where it cannot be placed)."""
    groups = by_table(enumerated.options)
    count = math.prod(len(g) for g in groups)
    if count > max_plans:
        raise ValueError(
            f"{count} combinations is more than max_plans={max_plans}; use fewer tables or options"
        )
    rate, rows = PlanRater(enumerated, topology, batch_size, storage_reservation_percentage), []
    for combination in itertools.product(*groups):
        proposal = list(combination)
        storage = sum((o.total_storage for o in proposal), Storage(0, 0))
        rows.append(
            {o.name: option_label(o) for o in proposal}
            | {
                "hbm_gb": storage.hbm / GB,
                "ddr_gb": storage.ddr / GB,
                "summed_perf": sum(o.total_perf for o in proposal),
                "perf_rating": rate(proposal),
            }
        )
    return pd.DataFrame(rows)

"""The calls a notebook or bench makes: one configuration in, every rank's
measured step out (`StepTimes`).

    times = measure_plan(plan, model.tables, batch)                  # a torchrec ShardingPlan
    times = measure_routing(batch, "hash_roundrobin", rows, dims)    # a routing mode, a key stream
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from embnb.rowwise.routing import DistType
from embnb.steptime.batch import GlobalBatch
from embnb.steptime.comms import RankComms, plan_comms, routing_comms
from embnb.steptime.measure import StepOptions, StepTimes, measure_ranks
from embnb.steptime.work import RankWork, plan_shards, plan_work, routing_work

__all__ = ["measure_plan", "plan_ranks", "measure_routing"]


def measure_plan(
    plan: ShardingPlan | EmbeddingModuleShardingPlan,
    tables: Sequence[EmbeddingBagConfig],
    batch: GlobalBatch,
    **options: Any,
) -> StepTimes:
    """Every rank's step under a torchrec sharding plan of an
    EmbeddingBagCollection of `tables`, on `batch` (`make_batch`); its
    collectives counted. `options` are `StepOptions`' fields (device, threads,
    warmup, repeats, optimizer, learning_rate, hidden)."""
    return measure_ranks(*plan_ranks(plan, tables, batch), options=StepOptions(**options))


def plan_ranks(
    plan: ShardingPlan | EmbeddingModuleShardingPlan, tables: Sequence[EmbeddingBagConfig], batch: GlobalBatch
) -> tuple[Callable[[int], RankWork], int, Callable[[int, int], RankComms]]:
    """`measure_ranks`' first three arguments for a plan on `batch`: each rank's work and collectives
    built on first use and kept, so a plan measured in several rounds builds them once (at a
    production batch, the ids each rank receives take longer to select than its step to run)."""
    shards = plan_shards(plan, tables, batch.world_size)
    works = functools.cache(lambda rank: plan_work(shards, batch, rank))
    comms = functools.cache(lambda rank, dense: plan_comms(shards, batch, rank, dense))
    return works, batch.world_size, comms


def measure_routing(
    batch: GlobalBatch,
    dist_type: DistType | str,
    rows: dict[str, int],
    dims: dict[str, int],
    block_size: dict[str, int] | None = None,
    **options: Any,
) -> StepTimes:
    """Every rank's step when each table is row-wise sharded by `dist_type`
    (`work.routing_work`): its lookups of the keys it owns, and the dense
    part of its local samples; its collectives (`comms.routing_comms`)."""
    DistType.parse(dist_type)
    return measure_ranks(
        lambda rank: routing_work(batch, dist_type, rows, dims, rank, block_size),
        batch.world_size,
        comms_of=lambda rank, dense: routing_comms(batch, dist_type, rows, dims, rank, block_size, dense),
        options=StepOptions(**options),
    )

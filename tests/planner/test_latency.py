"""embnb.planner.latency: each sharding type's collectives timed on real gloo ranks, and what the
times do to a plan's rating. Oracles: the collectives torchrec's shardings run as
`embnb.steptime.comms` counts them (validated there against a real torchrec job), and torchrec's
own NoopPerfModel for the rating without them. No speed is asserted, only that a time was taken."""

from __future__ import annotations

import math
import os

import pytest
import ranks
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.planners import to_sharding_plan
from torchrec.distributed.planner.utils import reset_shard_rank

from embnb import planner
from embnb.dist import launch
from embnb.lab.planner.models import enumerate_options, make_model
from embnb.planner.latency import COLLECTIVES, measure_collective_ms
from embnb.planner.perf_model import SHARDING_TYPES
from embnb.planner.space import by_table
from embnb.planner.topology import reserved_topology
from embnb.steptime import make_batch
from embnb.steptime.comms import plan_comms
from embnb.steptime.work import plan_shards

BATCH = 64


@pytest.fixture(scope="module")
def latency():
    return measure_collective_ms(2, repeats=5, warmup=1)


def test_every_sharding_type_with_collectives_has_a_positive_latency(latency):
    assert set(latency.collective_ms) == set(COLLECTIVES) == set(SHARDING_TYPES)
    assert latency.backend == "gloo" and latency.world_size == 2 and latency.why == ""
    for sharding_type, ms in latency.collective_ms.items():
        if COLLECTIVES[sharding_type]:
            assert 0 < ms < math.inf, (sharding_type, ms)
        else:  # data-parallel: no input or output distribution of its own
            assert ms == 0.0


# grid: table-row-wise's per column block; no option of it on one host to check
@pytest.mark.parametrize(
    "sharding_type", ["table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise"]
)
def test_the_collectives_timed_are_the_ones_steptime_counts_for_torchrec(sharding_type):
    """A one-table plan of `sharding_type` on 2 ranks: the collectives `plan_comms` counts in the
    sharded module, forward then backward, and which of them run within the host, are the ones
    `COLLECTIVES` times."""
    model = make_model(1, seed=0, max_rows=200_000)
    topology = planner.make_topology(2, "cuda", hbm_cap_gb=64)  # cpu topologies offer no row-wise
    enumerated = enumerate_options(model.tables, topology, BATCH, model.constraints)
    option = next(o for o in enumerated.options if o.sharding_type == sharding_type)
    for index, shard in enumerate(option.shards):
        shard.rank = index % 2
    batch = make_batch(model.tables, model.constraints, 2, BATCH, 0)
    shards = plan_shards(to_sharding_plan([option], topology), model.tables, 2)
    comms = plan_comms(shards, batch, 0)
    counted = [(c.kind, c.within_host) for c in comms.collectives if c.in_sharded_module]
    assert counted == [(kind, group == "host") for kind, group in COLLECTIVES[sharding_type]]
    reset_shard_rank([option])


def test_a_plan_with_one_more_sharding_type_is_rated_higher_by_its_term(latency):
    """KernelCallPerfModel with the measured `collective_ms`: a plan rates NoopPerfModel's rating
    plus each of its sharding types' latency; swapping a table into a type the plan lacks adds
    exactly that type's term over the swapped plan's own NoopPerfModel rating."""
    model = make_model(4, seed=1, max_rows=5000)
    topology = planner.make_topology(2, "cuda", hbm_cap_gb=64)  # cpu topologies offer no row-wise
    enumerated = enumerate_options(model.tables, topology, BATCH, model.constraints)
    rating = planner.KernelCallPerfModel(topology, collective_ms=latency.collective_ms)
    noop = NoopPerfModel(topology)
    tables = by_table(enumerated.options)
    table_wise = [next(o for o in t if o.sharding_type == "table_wise") for t in tables]
    mixed = [next(o for o in tables[0] if o.sharding_type == "row_wise"), *table_wise[1:]]
    storage = reserved_topology(topology, enumerated, BATCH)
    ms = latency.collective_ms
    for plan, types in ((table_wise, ["table_wise"]), (mixed, ["row_wise", "table_wise"])):
        placed = planner.HeapSearchPartitioner().partition(plan, storage)
        assert rating.rate(placed) == pytest.approx(noop.rate(placed) + sum(ms[t] for t in types), rel=1e-12)
        assert rating.collectives_ms(placed) - sum(ms[t] for t in types) == pytest.approx(0, abs=1e-12)
        reset_shard_rank(plan)
    assert rating.collectives_ms(mixed) - rating.collectives_ms(table_wise) == pytest.approx(ms["row_wise"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 1}, "world_size"),
        ({"world_size": 2, "repeats": 0}, "repeats"),
        ({"world_size": 2, "device": "tpu"}, "device"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        measure_collective_ms(**kwargs)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="thread affinity is Linux's")
def test_each_rank_has_a_core_of_its_own_even_when_the_launcher_is_pinned():
    """A calibrate run pinned to one core still times ranks that each have a core (rank modulo the
    machine's cores), every one of their threads: ranks taking turns on one core time the scheduler."""
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    try:
        threads = launch(ranks.collective_latency_affinity, 2)
    finally:
        os.sched_setaffinity(0, pinned)
    cores = os.cpu_count()
    for rank, affinities in enumerate(threads):
        assert affinities and all(a == [rank % cores] for a in affinities), (rank, affinities)

"""The rank-by-rank measurement against a real concurrent job (issue 35, item 2).

For W = 2 and 4, torchrec's ShardedEmbeddingBagCollection runs the same
plan on the same global batch in a real gloo job (`embnb.dist.launch`),
its TBEs timed with per-thread CPU time (the ranks share 2 cores: CPU time
stays stable where wall time does not). The rank-by-rank run must agree
with it rank by rank: the ids every TBE reads (count and sum, exactly), the
bytes of every collective (exactly), and each rank's lookup CPU time
within RTOL. Given another plan, the same check must fail.

The W = 4 launch also runs a plan on 2 hosts of 2 ranks (torchrec's
LOCAL_WORLD_SIZE = 2) with table-row-wise and grid shards beside
table-wise and row-wise ones: the ids every TBE reads and the bytes of
every collective (within-host reduce-scatters and all-gathers, cross-host
all-to-alls) must be what the real job's are.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from concurrent_ranks import sharded_rank
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    grid_shard,
    row_wise,
    table_row_wise,
    table_wise,
)
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb.dist import launch_each
from embnb.steptime.batch import make_batch
from embnb.steptime.kernels import DEFAULT_OPTIMIZER
from embnb.steptime.step import compare_per_rank, measure_plan
from embnb.steptime.work import devices_per_host, plan_shards, plan_work

# Each rank's median lookup CPU time within 35% of the concurrent job's: the
# ranks there share 2 cores (caches, memory bandwidth) with each other and
# other work; the plans below differ by 2x or more on some rank.
RTOL = 0.35
LOCAL_BATCH = {2: 1024, 4: 1024}  # global batches of 2048 and 4096: 10 to 50 ms per rank
WARMUP, REPEATS = 1, 5

TABLES = [
    EmbeddingBagConfig(name=f"t{i}", feature_names=[f"f{i}"], num_embeddings=40_000, embedding_dim=128)
    for i in range(6)
]
CONSTRAINTS = {t.name: ParameterConstraints(pooling_factors=[30.0]) for t in TABLES}

# 2 hosts of 2 ranks: h0 and h1 table-row-wise on one host each (h1 with two
# features, dense kernel), h2 grid-sharded (two column blocks of 128, one per
# host; rows that do not split evenly), h3 table-wise, h4 row-wise over both hosts.
PER_HOST, HOSTS_BATCH = 2, 64
HOST_TABLES = [
    EmbeddingBagConfig(name="h0", feature_names=["h0"], num_embeddings=5_001, embedding_dim=64),
    EmbeddingBagConfig(name="h1", feature_names=["h1a", "h1b"], num_embeddings=3_000, embedding_dim=32),
    EmbeddingBagConfig(name="h2", feature_names=["h2"], num_embeddings=4_001, embedding_dim=256),
    EmbeddingBagConfig(name="h3", feature_names=["h3"], num_embeddings=2_000, embedding_dim=32),
    EmbeddingBagConfig(name="h4", feature_names=["h4"], num_embeddings=2_000, embedding_dim=16),
]
HOST_CONSTRAINTS = {
    t.name: ParameterConstraints(pooling_factors=[8.0] * len(t.feature_names)) for t in HOST_TABLES
}


def plan_for(world_size: int, heavy_rank: int):
    """t0-t2 table-wise on `heavy_rank`, t3 on the next rank, t4 row-wise,
    t5 column-wise in four shards, two on each of the last two ranks: loads far apart."""
    ebc = EmbeddingBagCollection(tables=TABLES, device=torch.device("meta"))
    light, last = (heavy_rank + 1) % world_size, world_size - 1
    shardings = {f"t{i}": table_wise(rank=heavy_rank, compute_kernel="fused") for i in range(3)}
    shardings["t3"] = table_wise(rank=light, compute_kernel="fused")
    shardings["t4"] = row_wise(compute_kernel="fused")
    shardings["t5"] = column_wise(ranks=[last - 1, last, last - 1, last], compute_kernel="fused")
    return construct_module_sharding_plan(
        ebc, shardings, local_size=world_size, world_size=world_size, device_type="cpu"
    )


def host_plan(world_size: int):
    ebc = EmbeddingBagCollection(tables=HOST_TABLES, device=torch.device("meta"))
    shardings = {
        "h0": table_row_wise(host_index=0),
        "h1": table_row_wise(host_index=1),
        "h2": grid_shard(host_indexes=[0, 1]),
        "h3": table_wise(rank=3, compute_kernel="fused"),
        "h4": row_wise(compute_kernel="fused"),
    }
    plan = construct_module_sharding_plan(
        ebc, shardings, local_size=PER_HOST, world_size=world_size, device_type="cpu"
    )
    for name in ("h0", "h2"):  # torchrec's helpers give host-level shards the dense kernel
        plan[name] = dataclasses.replace(plan[name], compute_kernel="fused")
    return plan


@functools.cache
def concurrent(world_size: int):
    """The job's ranks per call: [plan_for's] at W = 2, [plan_for's, host_plan's] at W = 4."""
    batch = LOCAL_BATCH[world_size]
    calls = [(sharded_rank, (TABLES, CONSTRAINTS, plan_for(world_size, 0), batch, 0, 1, WARMUP, REPEATS))]
    if world_size == 4:
        hosts = (HOST_TABLES, HOST_CONSTRAINTS, host_plan(world_size), HOSTS_BATCH, 0, 1, 0, 1)
        calls.append((sharded_rank, (*hosts, DEFAULT_OPTIMIZER, 0.01, PER_HOST)))
    return launch_each(calls, world_size, device="cpu")


def rank_by_rank(world_size: int, heavy_rank: int):
    batch = make_batch(TABLES, CONSTRAINTS, world_size, LOCAL_BATCH[world_size], seed=0)
    return measure_plan(
        plan_for(world_size, heavy_rank), TABLES, batch, threads=1, warmup=WARMUP, repeats=REPEATS
    )


def signature(collectives) -> list[tuple[str, int, int]]:
    return sorted((c.kind, c.sent_bytes, c.received_bytes) for c in collectives)


@pytest.mark.parametrize("world_size", [2, 4])
def test_rank_by_rank_agrees_with_the_concurrent_job_rank_by_rank(world_size):
    real = concurrent(world_size)[0]
    ours = rank_by_rank(world_size, heavy_rank=0)
    batch = make_batch(TABLES, CONSTRAINTS, world_size, LOCAL_BATCH[world_size], seed=0)
    shards = plan_shards(plan_for(world_size, 0), TABLES, world_size)
    assert [r.threads for r in real] == [1] * world_size and ours.threads == 1
    for job_rank, step_rank, comms in zip(real, ours.ranks, ours.comms):
        # what each TBE read: torchrec's input dist against ours, id for id (count, sum)
        torchrec_reads = {tuple(sorted(names)): read for names, read in job_rank.lookup_inputs.items()}
        work = plan_work(shards, batch, job_rank.rank)
        our_reads = {
            tuple(sorted(s.table for s in g.shards)): (g.ids.numel(), int(g.ids.sum())) for g in work.groups
        }
        assert our_reads == torchrec_reads and torchrec_reads, job_rank.rank
        assert step_rank.num_ids == sum(count for count, _ in torchrec_reads.values())
        # every collective of the sharded module, byte for byte
        recorded = signature(job_rank.collectives)
        counted = signature(c for c in comms.collectives if c.in_sharded_module)
        assert counted == recorded, job_rank.rank
    agreement = compare_per_rank([r.lookup.cpu_s for r in ours.ranks], [r.lookup_cpu_s for r in real], RTOL)
    assert agreement.agrees, agreement.ratios


def test_the_check_fails_when_the_rank_by_rank_run_has_another_plan():
    real = concurrent(2)[0]
    other = rank_by_rank(2, heavy_rank=1)  # the heavy tables on rank 1 instead of rank 0
    agreement = compare_per_rank([r.lookup.cpu_s for r in other.ranks], [r.lookup_cpu_s for r in real], RTOL)
    # The plans differ by about 2x on each rank (ratios near 0.5 and 2); asking for
    # more than the check's own tolerance failed once under load (0.61 and 1.66).
    assert not agreement.agrees, agreement.ratios
    assert [signature(c.collectives) for c in other.comms if c] != [signature(r.collectives) for r in real]


def test_host_level_shards_read_and_move_what_torchrecs_job_does():
    real = concurrent(4)[1]
    batch = make_batch(HOST_TABLES, HOST_CONSTRAINTS, 4, HOSTS_BATCH, seed=0)
    plan = host_plan(4)
    shards = plan_shards(plan, HOST_TABLES, 4)
    kinds = {s.sharding_type for s in shards}
    assert {"table_row_wise", "grid_shard", "table_wise", "row_wise"} <= kinds
    assert devices_per_host(shards, 4) == PER_HOST
    ours = measure_plan(plan, HOST_TABLES, batch, threads=1, warmup=0, repeats=1)
    for job_rank, comms in zip(real, ours.comms):
        work = plan_work(shards, batch, job_rank.rank)
        our_reads = {
            tuple(sorted(s.table for s in g.shards)): (g.ids.numel(), int(g.ids.sum())) for g in work.groups
        }
        assert our_reads == job_rank.lookup_inputs and our_reads, job_rank.rank
        counted = [c for c in comms.collectives if c.in_sharded_module]
        assert signature(counted) == signature(job_rank.collectives), job_rank.rank
        # the within-host collectives are the host-level types' reduce-scatter and all-gather
        assert {c.name for c in counted if c.within_host} == {
            f"{kind} {what}"
            for kind in ("table_row_wise", "grid_shard")
            for what in ("pooled reduce-scatter", "gradient all-gather")
        }

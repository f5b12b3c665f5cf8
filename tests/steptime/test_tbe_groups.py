"""The replay's TBEs are torchrec's (issue #69, item 3): `plan_work` groups a rank's shards by
torchrec's `group_tables` key, so `fused`, `fused_uvm` and `fused_uvm_caching` shards of one sharding
type run as one TBE and a table whose fused parameters differ runs in a TBE of its own. The oracle is
torchrec's own `group_tables` on the plan's sharded tables (their fused parameters from torchrec's
`add_params_from_parameter_sharding`), per rank and sharding type, as a sharded module calls it; the
real gloo job's TBEs are checked in test_against_real_ranks.py."""

from __future__ import annotations

import dataclasses

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
from torchrec.distributed.embedding_sharding import group_tables
from torchrec.distributed.embedding_types import EmbeddingComputeKernel, ShardedEmbeddingTable
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
from torchrec.distributed.types import CacheParams
from torchrec.distributed.utils import add_params_from_parameter_sharding
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb.steptime.batch import make_batch
from embnb.steptime.step import measure_plan
from embnb.steptime.work import plan_shards, plan_work

WORLD = 2
TABLES = [
    EmbeddingBagConfig(name=f"t{i}", feature_names=[f"f{i}"], num_embeddings=500 + 100 * i, embedding_dim=8)
    for i in range(6)
]
TABLES.append(
    EmbeddingBagConfig(
        name="mean", feature_names=["fm"], num_embeddings=300, embedding_dim=8, pooling=PoolingType.MEAN
    )
)
CONSTRAINTS = {t.name: ParameterConstraints(pooling_factors=[3.0]) for t in TABLES}


def mixed_plan():
    """Rank 0 table-wise: t0 fused, t1 fused_uvm, t2 fused_uvm_caching (one TBE in torchrec), t3
    fused with an LFU cache algorithm (its own), `mean` with mean pooling (its own); t4 and t5
    row-wise, t5 on fused_uvm (one TBE per rank)."""
    ebc = EmbeddingBagCollection(tables=TABLES, device=torch.device("meta"))
    kernels = {"t0": "fused", "t1": "fused_uvm", "t2": "fused_uvm_caching", "t3": "fused", "mean": "fused"}
    shardings = {name: table_wise(rank=0, compute_kernel=kernel) for name, kernel in kernels.items()}
    shardings["t4"] = row_wise(compute_kernel="fused")
    shardings["t5"] = row_wise(compute_kernel="fused_uvm")
    plan = construct_module_sharding_plan(
        ebc, shardings, local_size=WORLD, world_size=WORLD, device_type="cuda"
    )
    plan["t3"] = dataclasses.replace(plan["t3"], cache_params=CacheParams(algorithm=CacheAlgorithm.LFU))
    return plan


def torchrec_groups(plan, rank: int) -> set[frozenset[str]]:
    """torchrec's group_tables over rank `rank`'s sharded tables, one call per sharding type."""
    by_type: dict[str, list[ShardedEmbeddingTable]] = {}
    for config in TABLES:
        sharding = plan[config.name]
        for meta in sharding.sharding_spec.shards:
            if meta.placement.rank() != rank:
                continue
            by_type.setdefault(sharding.sharding_type, []).append(
                ShardedEmbeddingTable(
                    name=config.name,
                    embedding_dim=config.embedding_dim,
                    num_embeddings=config.num_embeddings,
                    feature_names=config.feature_names,
                    pooling=config.pooling,
                    data_type=config.data_type,
                    compute_kernel=EmbeddingComputeKernel(sharding.compute_kernel),
                    local_rows=meta.shard_sizes[0],
                    local_cols=meta.shard_sizes[1],
                    fused_params=add_params_from_parameter_sharding({}, sharding),
                )
            )
    return {
        frozenset(table.name for table in group.embedding_tables)
        for tables in by_type.values()
        for group in group_tables([tables])[0]
    }


def test_the_replay_groups_a_ranks_tables_as_torchrecs_group_tables():
    plan = mixed_plan()
    batch = make_batch(TABLES, CONSTRAINTS, WORLD, 4, seed=0)
    shards = plan_shards(plan, TABLES, WORLD)
    for rank in range(WORLD):
        ours = {frozenset(s.table for s in g.shards) for g in plan_work(shards, batch, rank).groups}
        assert ours == torchrec_groups(plan, rank), f"rank {rank}"
    # what torchrec's key decides here: the three fused kernels in one TBE, the LFU and mean apart
    assert torchrec_groups(plan, 0) == {
        frozenset({"t0", "t1", "t2"}),
        frozenset({"t3"}),
        frozenset({"mean"}),
        frozenset({"t4", "t5"}),
    }


def test_each_measured_rank_records_its_tbes_and_their_shards():
    plan = mixed_plan()
    batch = make_batch(TABLES, CONSTRAINTS, WORLD, 4, seed=0)
    times = measure_plan(plan, TABLES, batch, threads=1, warmup=0, repeats=1)
    for rank in times.ranks:
        recorded = {frozenset(s["table"] for s in g["shards"]) for g in rank.groups}
        assert recorded == torchrec_groups(plan, rank.rank)
    merged = next(g for g in times.ranks[0].groups if len(g["shards"]) == 3)
    # one TBE of the fused kernel type, each shard keeping its own kernel (its location on a GPU)
    assert merged["compute_kernel"] == "fused"
    assert [s["compute_kernel"] for s in merged["shards"]] == ["fused", "fused_uvm", "fused_uvm_caching"]
    assert all(s["rows"] == t.num_embeddings for s, t in zip(merged["shards"], TABLES))

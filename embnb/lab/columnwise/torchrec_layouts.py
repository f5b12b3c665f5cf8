"""The column-wise layouts torchrec itself makes and takes, asked of the installed torchrec: what its
planner proposes for a table, and what its EmbeddingCollection says to tables of different widths.

    planner_cw_layout(512, 1000, 2)      # PlannerLayout(ranks=[0, 1, 0, 1], widths=[128] * 4)
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch

from embnb._checks import check_int


@dataclass(frozen=True)
class PlannerLayout:
    """One table's column-wise shards as torchrec's planner placed them, in column order."""

    embedding_dim: int
    ranks: list[int]  # rank of each shard
    widths: list[int]  # columns of each shard


def planner_cw_layout(embedding_dim: int, num_embeddings: int, world_size: int) -> PlannerLayout:
    """The shards torchrec's EmbeddingShardingPlanner makes of one EmbeddingCollection table when it may
    only shard it column-wise (fused kernel), on `world_size` CPU devices of one host."""
    from torchrec import EmbeddingCollection, EmbeddingConfig
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    check_int("embedding_dim", embedding_dim, low=1)
    check_int("num_embeddings", num_embeddings, low=1)
    check_int("world_size", world_size, low=1)
    config = EmbeddingConfig(num_embeddings, embedding_dim, "t0", feature_names=["f0"])
    ec = EmbeddingCollection(tables=[config], device=torch.device("meta"))
    constraints = {"t0": ParameterConstraints(sharding_types=["column_wise"], compute_kernels=["fused"])}
    # The planner warns about a hand-built Topology and its storage reservation, and logs its stats table.
    logger = logging.getLogger("torchrec")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            topology = Topology(world_size=world_size, compute_device="cpu")
            planner = EmbeddingShardingPlanner(topology, constraints=constraints)
            plan = planner.plan(ec, [EmbeddingCollectionSharder()])
    finally:
        logger.setLevel(level)
    shards = sorted(plan.plan[""]["t0"].sharding_spec.shards, key=lambda s: s.shard_offsets[1])
    ranks, widths = [s.placement.rank() for s in shards], [s.shard_sizes[1] for s in shards]
    return PlannerLayout(embedding_dim, ranks, widths)


def mixed_dims_error(dims: tuple[int, int] = (4, 8)) -> str:
    """The error torchrec's EmbeddingCollection raises for two tables of `dims` columns."""
    from torchrec import EmbeddingCollection, EmbeddingConfig

    tables = [EmbeddingConfig(4, d, f"t{i}", feature_names=[f"f{i}"]) for i, d in enumerate(dims)]
    try:
        EmbeddingCollection(tables=tables, device=torch.device("meta"))
    except ValueError as error:
        return f"ValueError: {error}"
    return f"no error: tables of {list(dims)} columns were accepted"

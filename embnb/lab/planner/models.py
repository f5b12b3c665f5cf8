"""Models to plan for and their sharding options: random tables like
production ones (the notebook's and the bench's), enumerated once so every
proposer plans over the same options.

    model = make_model(40, seed=0)
    enumerated = enumerate_options(model.tables, topology, 512, model.constraints)
    enumerated = enumerate_options(..., enumerator="embnb")  # the same options, estimated faster
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.shard_estimators import EmbeddingOffloadStats
from torchrec.distributed.planner.types import ParameterConstraints, ShardingOption, Topology
from torchrec.distributed.types import CacheParams, ModuleSharder
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from embnb._checks import check_int
from embnb.planner.enumerator import make_enumerator
from embnb.planner.space import GB
from embnb.timing import Stopwatch

__all__ = [
    "Model",
    "make_model",
    "MixedModel",
    "make_mixed_model",
    "fused_table_gb",
    "Enumerated",
    "enumerate_options",
]


@dataclass(frozen=True)
class Model:
    """Embedding tables and their ParameterConstraints (pooling factors), by table name."""

    tables: list[EmbeddingBagConfig]
    constraints: dict[str, ParameterConstraints]


def make_model(num_tables: int, seed: int = 0, max_rows: int = 10_000_000) -> Model:
    """A model like production ones: row counts log-uniform from 1,000 to
    `max_rows` (a few huge tables, many small), dims 16 to 256, pooling
    factors 1 to 50."""
    check_int("num_tables", num_tables, low=1)
    check_int("max_rows", max_rows, low=1000)
    rng = np.random.default_rng(seed)
    tables, constraints = [], {}
    for i in range(num_tables):
        name = f"table_{i}"
        tables.append(
            EmbeddingBagConfig(
                name=name,
                feature_names=[f"feature_{i}"],
                num_embeddings=int(10 ** rng.uniform(3, math.log10(max_rows))),
                embedding_dim=int(rng.choice([16, 32, 64, 128, 256])),
            )
        )
        constraints[name] = ParameterConstraints(pooling_factors=[float(rng.choice([1, 2, 5, 10, 20, 50]))])
    return Model(tables, constraints)


@dataclass(frozen=True)
class MixedModel:
    """A module (on meta) beyond make_model's single EmbeddingBagCollection, with
    the sharders that take its collections and its ParameterConstraints."""

    module: nn.Module
    sharders: list[ModuleSharder[nn.Module]]
    constraints: dict[str, ParameterConstraints]
    tables: list[EmbeddingBagConfig | EmbeddingConfig]  # pooled, then sequence


class _PooledAndSequence(nn.Module):
    def __init__(self, pooled: EmbeddingBagCollection, sequence: EmbeddingCollection) -> None:
        super().__init__()
        self.pooled = pooled
        self.sequence = sequence


def make_mixed_model(num_tables: int, seed: int = 0, uvm_caching: bool = True) -> MixedModel:
    """`num_tables` pooled tables in a weighted EmbeddingBagCollection, each read
    by 1 to 4 features with a pooling factor each (1 to 50), beside a quarter as
    many sequence tables in an EmbeddingCollection. With `uvm_caching` (GPU
    topologies: CPUs have no UVM), every fifth pooled table has a UVM cache
    with statistics and every third sequence table is constrained to fused or
    UVM-caching kernels with a cache load factor."""
    check_int("num_tables", num_tables, low=1)
    rng = np.random.default_rng(seed)

    def rows() -> int:
        return int(10 ** rng.uniform(3, 7))

    pooled, constraints = [], {}
    stats = EmbeddingOffloadStats(
        cacheability=0.4, expected_lookups=20_000, mrc_hist_counts=torch.tensor([9.0, 4, 2, 1]), height=8000
    )
    for i in range(num_tables):
        features = int(rng.integers(1, 5))
        name = f"shared_{i}"
        pooled.append(
            EmbeddingBagConfig(
                name=name,
                feature_names=[f"{name}_f{j}" for j in range(features)],
                num_embeddings=rows(),
                embedding_dim=int(rng.choice([16, 32, 64, 128, 256])),
            )
        )
        constraints[name] = ParameterConstraints(
            pooling_factors=[float(rng.choice([1, 2, 5, 10, 20, 50])) for _ in range(features)],
            cache_params=CacheParams(load_factor=0.2, stats=stats) if uvm_caching and i % 5 == 0 else None,
        )
    sequence = []
    for i in range(max(1, num_tables // 4)):
        name = f"sequence_{i}"
        sequence.append(
            EmbeddingConfig(name=name, feature_names=[f"{name}_f"], num_embeddings=rows(), embedding_dim=64)
        )
        if uvm_caching and i % 3 == 0:
            constraints[name] = ParameterConstraints(
                pooling_factors=[float(rng.choice([5, 20, 50]))],
                cache_params=CacheParams(load_factor=0.3),
                compute_kernels=["fused_uvm_caching", "fused"],
            )
    meta = torch.device("meta")
    module = _PooledAndSequence(
        EmbeddingBagCollection(tables=pooled, is_weighted=True, device=meta),
        EmbeddingCollection(tables=sequence, device=meta),
    )
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    return MixedModel(module, sharders, constraints, pooled + sequence)


def fused_table_gb(tables: Sequence[EmbeddingBagConfig | EmbeddingConfig]) -> float:
    """Memory of every table's rows in fp32, in GiB: a scale for budgets."""
    return sum(t.num_embeddings * t.embedding_dim * 4 for t in tables) / GB


@dataclass(frozen=True)
class Enumerated:
    """An enumerator's output (torchrec's or embnb's: the same options), kept so
    every proposer plans over the same options (enumerating is the slow part:
    torchrec's estimators)."""

    module: EmbeddingBagCollection  # on the meta device
    sharders: list[EmbeddingBagCollectionSharder]
    options: list[ShardingOption]
    seconds: float  # enumerating took


def enumerate_options(
    tables: Sequence[EmbeddingBagConfig],
    topology: Topology,
    batch_size: int,
    constraints: dict[str, ParameterConstraints] | None = None,
    enumerator: str = "torchrec",
) -> Enumerated:
    """Sharding options of an EmbeddingBagCollection of `tables` (on meta), from
    torchrec's EmbeddingEnumerator (`enumerator="torchrec"`) or embnb's
    `DistinctShardEnumerator` ("embnb": the same options, faster)."""
    if not tables:
        raise ValueError("no tables to plan: pass at least one EmbeddingBagConfig")
    check_int("batch_size", batch_size, low=1)
    chosen = make_enumerator(enumerator, topology, batch_size, constraints)
    module = EmbeddingBagCollection(tables=list(tables), device=torch.device("meta"))
    sharders = [EmbeddingBagCollectionSharder()]
    with Stopwatch() as watch:
        options = chosen.enumerate(module, sharders)
    return Enumerated(module, sharders, options, watch.wall_s)

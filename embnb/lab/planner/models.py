"""Models to plan for and their sharding options: random tables like production ones (the
notebooks' and the benches'), enumerated once so every proposer plans over the same options."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.types import ParameterConstraints, ShardingOption, Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb._checks import check_int
from embnb.planner.enumerator import make_enumerator
from embnb.planner.space import GB
from embnb.timing import Stopwatch

__all__ = ["Model", "make_model", "fused_table_gb", "Enumerated", "enumerate_options"]


@dataclass(frozen=True)
class Model:
    """Embedding tables and their ParameterConstraints (pooling factors), by table name."""

    tables: list[EmbeddingBagConfig]
    constraints: dict[str, ParameterConstraints]


def make_model(num_tables: int, seed: int = 0, max_rows: int = 10_000_000) -> Model:
    """A model like production ones: row counts log-uniform from 1,000 to `max_rows` (a few huge
    tables, many small), dims 16 to 256, pooling factors 1 to 50."""
    check_int("num_tables", num_tables, low=1)
    check_int("max_rows", max_rows, low=1000)
    rng = np.random.default_rng(seed)
    tables, constraints = [], {}
    for i in range(num_tables):
        name = f"table_{i}"
        rows, dim = int(10 ** rng.uniform(3, math.log10(max_rows))), int(rng.choice([16, 32, 64, 128, 256]))
        tables.append(EmbeddingBagConfig(rows, dim, name, feature_names=[f"feature_{i}"]))
        constraints[name] = ParameterConstraints(pooling_factors=[float(rng.choice([1, 2, 5, 10, 20, 50]))])
    return Model(tables, constraints)


def fused_table_gb(tables: Sequence[EmbeddingBagConfig | EmbeddingConfig]) -> float:
    """Memory of every table's rows in fp32, in GiB: a scale for budgets."""
    return sum(t.num_embeddings * t.embedding_dim * 4 for t in tables) / GB


@dataclass(frozen=True)
class Enumerated:
    """An enumerator's output (torchrec's or embnb's: the same options) for a module on the meta
    device, kept so every proposer plans over the same options, and the seconds it took."""

    module: EmbeddingBagCollection
    sharders: list[EmbeddingBagCollectionSharder]
    options: list[ShardingOption]
    seconds: float


def enumerate_options(
    tables: Sequence[EmbeddingBagConfig],
    topology: Topology,
    batch_size: int,
    constraints: dict[str, ParameterConstraints] | None = None,
    enumerator: str = "torchrec",
) -> Enumerated:
    """Sharding options of an EmbeddingBagCollection of `tables` (on meta), from torchrec's
    EmbeddingEnumerator (`enumerator="torchrec"`) or embnb's `DistinctShardEnumerator` ("embnb")."""
    if not tables:
        raise ValueError("no tables to plan: pass at least one EmbeddingBagConfig")
    check_int("batch_size", batch_size, low=1)
    chosen = make_enumerator(enumerator, topology, batch_size, constraints)
    module = EmbeddingBagCollection(tables=list(tables), device=torch.device("meta"))
    sharders = [EmbeddingBagCollectionSharder()]
    with Stopwatch() as watch:
        options = chosen.enumerate(module, sharders)
    return Enumerated(module, sharders, options, watch.wall_s)

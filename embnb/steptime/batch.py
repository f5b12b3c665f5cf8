"""The global batch a W-rank step sees: every rank's local KeyedJaggedTensor.

Each rank holds `local_batch_size` samples. A feature's bag length per
sample is drawn uniform on [0, 2 * pooling_factor] (rounded), so its mean is
the pooling factor torchrec's planner was told (`ParameterConstraints`);
ids are uniform over the table's rows, or Zipf(`zipf_alpha`) over them
(`ids="zipf"`: `embnb.data.zipf_ids`, each table's hot rows fixed by its
position in `tables`, as a table's traffic keeps its hot rows from step to
step). The same seed gives the same batch in the rank-by-rank measurement
and in a real job.

    batch = make_batch(model.tables, model.constraints, world_size=8, local_batch_size=256)
    kjt = batch.kjt(rank)           # what rank `rank` feeds its sharded module
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb._checks import check_choice, check_int
from embnb.data import zipf_ids

__all__ = ["GlobalBatch", "make_batch", "batch_from_keys", "feature_pooling_factors", "ID_DISTRIBUTIONS"]

ID_DISTRIBUTIONS = ("uniform", "zipf")


@dataclass(frozen=True)
class GlobalBatch:
    """W local batches. `lengths[r][f]` (int64, `local_batch_size`) and
    `ids[r][f]` (int64, `lengths[r][f].sum()`) are rank r's bags of feature
    `feature_names[f]`, whose ids index table `feature_tables[f]`."""

    feature_names: list[str]
    feature_tables: list[str]
    local_batch_size: int
    lengths: list[list[torch.Tensor]]
    ids: list[list[torch.Tensor]]

    @property
    def world_size(self) -> int:
        return len(self.lengths)

    def kjt(self, rank: int, device: torch.device | str = "cpu") -> KeyedJaggedTensor:
        """Rank `rank`'s local batch as torchrec takes it (feature-major)."""
        check_int("rank", rank, low=0, high=self.world_size - 1)
        return KeyedJaggedTensor(
            keys=list(self.feature_names),
            values=torch.cat(self.ids[rank]).to(device),
            lengths=torch.cat(self.lengths[rank]).to(device),
        )

    def global_bags(self, feature: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(lengths, ids) of `feature` over the global batch: rank 0's samples,
        then rank 1's, ...: the order torchrec's input all-to-all delivers."""
        lengths = torch.cat([self.lengths[r][feature] for r in range(self.world_size)])
        ids = torch.cat([self.ids[r][feature] for r in range(self.world_size)])
        return lengths, ids


def feature_pooling_factors(
    tables: Sequence[EmbeddingBagConfig], constraints: Mapping[str, ParameterConstraints] | None
) -> dict[str, float]:
    """Each feature's pooling factor: the table's ParameterConstraints, else
    torchrec's default of 1.0 (torchrec.distributed.planner.constants.POOLING_FACTOR)."""
    factors = {}
    for table in tables:
        given = constraints.get(table.name) if constraints else None
        pooling = list(given.pooling_factors) if given is not None else []
        for i, feature in enumerate(table.feature_names):
            factors[feature] = float(pooling[i]) if i < len(pooling) else 1.0
    return factors


def make_batch(
    tables: Sequence[EmbeddingBagConfig],
    constraints: Mapping[str, ParameterConstraints] | None,
    world_size: int,
    local_batch_size: int,
    seed: int = 0,
    ids: str = "uniform",
    zipf_alpha: float = 1.2,
) -> GlobalBatch:
    """A global batch of `world_size` local batches of `local_batch_size`
    samples for the features of `tables`, ids "uniform" or "zipf" with
    exponent `zipf_alpha` (module docstring). Raises ValueError on another
    `ids`, a size below 1, or Zipf ids of `zipf_alpha` <= 0."""
    check_choice("ids", ids, ID_DISTRIBUTIONS)
    check_int("world_size", world_size, low=1)
    check_int("local_batch_size", local_batch_size, low=1)
    if not tables:
        raise ValueError("no tables: pass at least one EmbeddingBagConfig")
    factors = feature_pooling_factors(tables, constraints)
    names = [f for t in tables for f in t.feature_names]
    owners = [t.name for t in tables for _ in t.feature_names]
    rows = {t.name: t.num_embeddings for t in tables}
    gen = torch.Generator().manual_seed(seed)
    lengths: list[list[torch.Tensor]] = []
    drawn: list[list[torch.Tensor]] = []
    for _ in range(world_size):
        rank_lengths, rank_ids = [], []
        for name, table in zip(names, owners):
            high = int(round(2 * factors[name]))
            bag = torch.randint(0, high + 1, (local_batch_size,), generator=gen)
            rank_lengths.append(bag)
            if ids == "uniform":
                rank_ids.append(torch.randint(0, rows[table], (int(bag.sum()),), generator=gen))
        lengths.append(rank_lengths)
        drawn.append(rank_ids)
    position = {t.name: i for i, t in enumerate(tables)}
    for f, table in enumerate(owners if ids == "zipf" else []):
        # one draw per feature over all ranks: the table's cached CDF and hot rows built once
        counts = [int(lengths[r][f].sum()) for r in range(world_size)]
        keys = zipf_ids(
            sum(counts),
            seed=seed * len(names) + f,
            alpha=zipf_alpha,
            vocab_size=rows[table],
            table_seed=position[table],
        )
        for r, part in enumerate(keys.split(counts)):
            drawn[r].append(part)
    return GlobalBatch(names, owners, local_batch_size, lengths, drawn)


def batch_from_keys(
    keys: Sequence[torch.Tensor], bag_size: int, table: str = "table", feature: str = "feature"
) -> GlobalBatch:
    """A global batch of one feature from each rank's key stream
    (`keys[r]`: rank r's keys, e.g. ids already hashed into the table), cut
    into bags of `bag_size` keys (the last bag of a rank may be shorter;
    ranks are padded with empty bags to the largest local batch)."""
    check_int("bag_size", bag_size, low=1)
    if not keys:
        raise ValueError("keys is empty: pass one tensor of keys per rank")
    streams = [torch.as_tensor(k, dtype=torch.int64).flatten() for k in keys]
    size = max(1, max(-(-s.numel() // bag_size) for s in streams))
    # bag i holds the keys from i * bag_size on, at most bag_size of them
    lengths = [[(s.numel() - torch.arange(size) * bag_size).clamp(0, bag_size)] for s in streams]
    return GlobalBatch([feature], [table], size, lengths, [[s] for s in streams])

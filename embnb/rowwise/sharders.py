"""Row-wise sharders for torchrec's EmbeddingBagCollection and EmbeddingCollection, a routing per table
(docs/sharders.md: the layouts, edge batches, checkpoints, cost).

    sharder = RoutedEmbeddingBagCollectionSharder({"t_items": "feistel_roundrobin", "t_users": "roundrobin"})
    plan = construct_module_sharding_plan(ebc, {name: row_wise() ...}, sharder=sharder, ...)
    model = DistributedModelParallel(model, sharders=[sharder], plan=ModuleShardingPlan...)

The sharded modules are torchrec's own `ShardedEmbeddingBagCollection` and `ShardedEmbeddingCollection`
(their all-to-all, FBGEMM's table-batched kernels, their output distribution) with
`embnb.rowwise.routed.RoutedIds` in front. torchrec 1.8's EmbeddingBagCollectionSharder offers row_wise
only for CUDA; these sharders offer it on CPU as well (DESIGN.md: torchrec's row-wise path runs on gloo
with the fused kernel).
"""

from __future__ import annotations

from typing import Any

import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder, ShardedEmbeddingCollection
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder, ShardedEmbeddingBagCollection
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingDist
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from embnb import _torchrec_private as private
from embnb.rowwise.edge_batches import EvenRwPooledEmbeddingDist
from embnb.rowwise.routed import RoutedIds, RoutedSharder, RoutingMismatch

__all__ = [
    "RoutedEmbeddingBagCollectionSharder",
    "RoutedShardedEmbeddingBagCollection",
    "RoutedEmbeddingCollectionSharder",
    "RoutedShardedEmbeddingCollection",
    "RoutingMismatch",
]

_META = torch.device("meta")


class RoutedShardedEmbeddingBagCollection(RoutedIds, ShardedEmbeddingBagCollection):
    """torchrec's ShardedEmbeddingBagCollection with ids routed by each table's layout.

    Arguments as `embnb.rowwise.routed.RoutedIds`: module, plan, env, routings, others, seed,
    then ShardedEmbeddingBagCollection's keyword arguments (fused_params, device, ...).
    Its row-wise output distribution is `embnb.rowwise.edge_batches.EvenRwPooledEmbeddingDist`:
    on gloo, ranks of different batch sizes train (torchrec's backward stops there).
    """

    weight_prefix = "embedding_bags"
    is_sequence = False

    def _edge_output_dists(self, qcomm_codecs_registry: Any) -> None:
        dists = private.output_dists(self)
        pg = private.sharding_env(self).process_group  # torchrec's row-wise shardings use it
        for i, sharding in enumerate(private.shardings(self)):
            if type(dists[i]) is RwPooledEmbeddingDist:
                dims = sharding.embedding_dims()
                dists[i] = EvenRwPooledEmbeddingDist(pg, dims, qcomm_codecs_registry=qcomm_codecs_registry)

    @staticmethod
    def _configs(module: EmbeddingBagCollection) -> list[Any]:
        return module.embedding_bag_configs()

    @staticmethod
    def _module_like(module: EmbeddingBagCollection, configs: list[Any]) -> EmbeddingBagCollection:
        return EmbeddingBagCollection(tables=configs, is_weighted=module.is_weighted(), device=_META)


class RoutedShardedEmbeddingCollection(RoutedIds, ShardedEmbeddingCollection):
    """torchrec's ShardedEmbeddingCollection with ids routed by each table's layout.

    Arguments as `embnb.rowwise.routed.RoutedIds`: module, plan, env, routings, others, seed,
    then ShardedEmbeddingCollection's keyword arguments (fused_params, device, use_index_dedup, ...).
    With `need_indices` it returns the ids it was given (torchrec keeps them from before the input
    distribution).
    """

    weight_prefix = "embeddings"
    is_sequence = True

    @staticmethod
    def _configs(module: EmbeddingCollection) -> list[Any]:
        return module.embedding_configs()

    @staticmethod
    def _module_like(module: EmbeddingCollection, configs: list[Any]) -> EmbeddingCollection:
        options = {"need_indices": module.need_indices(), "use_gather_select": module.use_gather_select()}
        if hasattr(module, "use_gather_select_per_sharding"):  # torchrec 1.8, not 1.6
            options["use_gather_select_per_sharding"] = module.use_gather_select_per_sharding()
        return EmbeddingCollection(tables=configs, device=_META, **options)


class RoutedEmbeddingBagCollectionSharder(RoutedSharder, EmbeddingBagCollectionSharder):
    """EmbeddingBagCollectionSharder with row_wise on CPU too and a routing per row-wise table.

    Args: routings, others, seed as `embnb.rowwise.routed.RoutedSharder`'s; fused_params and
    qcomm_codecs_registry as EmbeddingBagCollectionSharder's (by keyword).
    """

    @property
    def sharded_module_type(self) -> type[RoutedShardedEmbeddingBagCollection]:
        return RoutedShardedEmbeddingBagCollection


class RoutedEmbeddingCollectionSharder(RoutedSharder, EmbeddingCollectionSharder):
    """EmbeddingCollectionSharder with a routing per row-wise table.

    Args: routings, others, seed as `embnb.rowwise.routed.RoutedSharder`'s; fused_params,
    qcomm_codecs_registry and use_index_dedup as EmbeddingCollectionSharder's (by keyword).
    """

    def _sharded_kwargs(self) -> dict[str, Any]:
        return {"use_index_dedup": self._use_index_dedup}

    @property
    def sharded_module_type(self) -> type[RoutedShardedEmbeddingCollection]:
        return RoutedShardedEmbeddingCollection

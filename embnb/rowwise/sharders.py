"""Row-wise sharders for torchrec's EmbeddingBagCollection with a routing per table.

    sharder = RoutedEmbeddingBagCollectionSharder({"t_items": "feistel_roundrobin", "t_users": "roundrobin"})
    plan = construct_module_sharding_plan(ebc, {name: row_wise() ...}, sharder=sharder, ...)
    model = DistributedModelParallel(model, sharders=[sharder], plan=ModuleShardingPlan...)

The sharded module is torchrec's own `ShardedEmbeddingBagCollection` (its
row-wise input all-to-all, FBGEMM's table-batched kernels, its output
reduce-scatter); `RoutedShardedEmbeddingBagCollection` only renumbers each
id to its storage slot (`embnb.rowwise.layout`) before torchrec's input
distribution, so torchrec's contiguous blocks realize the chosen routing.
A roundrobin table whose N is not a multiple of W is sharded as
`W * ceil(N / W)` rows (torchrec's shards for it are rewritten to W equal
blocks). The routing of each table is on the module (`table_layouts`) and in
its state dict (`_extra_state`): loading rows saved under another routing
raises naming both (convert them with `convert_rows`); a checkpoint without
it (torchrec's own row-wise one, an unsharded module's) loads as continuous.

torchrec 1.8's EmbeddingBagCollectionSharder offers row_wise only for CUDA;
this sharder offers it on CPU as well (DESIGN.md: torchrec's row-wise path
runs on gloo with the fused kernel).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder, ShardedEmbeddingBagCollection
from torchrec.distributed.types import ParameterSharding, ShardingEnv, ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb._checks import check_int
from embnb.rowwise.layout import Routing, TableLayout

__all__ = ["RoutedEmbeddingBagCollectionSharder", "RoutedShardedEmbeddingBagCollection", "RoutingMismatch"]

_ROW_WISE = ShardingType.ROW_WISE.value


class RoutingMismatch(ValueError):
    """A state dict saved under another routing (or world size) than the module's."""


def _parse_routings(routings: Mapping[str, Routing | str] | None) -> dict[str, Routing]:
    if routings is None:
        return {}
    if not isinstance(routings, Mapping):
        raise TypeError(f"routings must map table names to routings, got {type(routings).__name__}")
    return {str(name): Routing.parse(r) for name, r in routings.items()}


def table_layouts(
    configs: list[Any],
    params: Mapping[str, ParameterSharding],
    world_size: int,
    routings: Mapping[str, Routing],
    others: Routing,
    seed: int,
) -> dict[str, TableLayout]:
    """The layout of each row-wise table; a routed table sharded otherwise raises."""
    names = {c.name for c in configs}
    unknown = sorted(set(routings) - names)
    if unknown:
        raise ValueError(f"routings name tables {unknown} that the module lacks; its tables: {sorted(names)}")
    layouts = {}
    for config in configs:
        routing = routings.get(config.name, others)
        sharding = params.get(config.name)
        if sharding is None or sharding.sharding_type != _ROW_WISE:
            kind = None if sharding is None else sharding.sharding_type
            if config.name in routings and routing is not Routing.CONTINUOUS:
                raise ValueError(
                    f"table {config.name!r} has routing {routing.value!r} but the plan shards it "
                    f"{kind!r}; a routing needs sharding type {_ROW_WISE!r}"
                )
            continue
        layouts[config.name] = TableLayout(config.num_embeddings, world_size, routing, seed)
    return layouts


def check_no_empty_rank(layouts: Mapping[str, TableLayout], device_type: str) -> None:
    """FBGEMM's CPU kernels reject a rank with no rows of a table (torchrec 1.8, fbgemm-gpu-cpu 1.8:
    "weights[0] must be a GPU or MTIA tensor"): raise before any rank gets there."""
    if device_type != "cpu":
        return
    for name, layout in layouts.items():
        counts = layout.rows_per_rank()
        if 0 in counts:
            raise ValueError(
                f"table {name!r}: torchrec's row-wise blocks of ceil({layout.num_embeddings}/"
                f"{layout.world_size})={layout.block_size} rows leave rank {counts.index(0)} with no rows "
                f"under routing {layout.routing.value!r}, which FBGEMM's CPU kernels reject; use routing "
                f"'roundrobin' or 'feistel_roundrobin' (W equal blocks) or fewer ranks"
            )


def _padded(
    module: EmbeddingBagCollection,
    params: Mapping[str, ParameterSharding],
    layouts: Mapping[str, TableLayout],
) -> tuple[EmbeddingBagCollection, dict[str, ParameterSharding]]:
    """The module and plan torchrec shards: padded tables hold `storage_rows` rows in W equal blocks."""
    padded = {n for n, layout in layouts.items() if layout.storage_rows != layout.num_embeddings}
    if not padded:
        return module, dict(params)
    configs = [
        dataclasses.replace(c, num_embeddings=layouts[c.name].storage_rows) if c.name in padded else c
        for c in module.embedding_bag_configs()
    ]
    meta_device = torch.device("meta")
    meta = EmbeddingBagCollection(tables=configs, is_weighted=module.is_weighted(), device=meta_device)
    params = dict(params)
    for name in padded:
        layout, sharding = layouts[name], params[name]
        shards = sharding.sharding_spec.shards
        dim = shards[0].shard_sizes[1]
        b = layout.block_size
        blocks = [
            ShardMetadata(shard_offsets=[r * b, 0], shard_sizes=[b, dim], placement=shards[r].placement)
            for r in range(layout.world_size)
        ]
        params[name] = dataclasses.replace(sharding, sharding_spec=EnumerableShardingSpec(blocks))
    return meta, params


class RoutedShardedEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """torchrec's ShardedEmbeddingBagCollection with ids renumbered to each table's routing.

    Args:
        module: the unsharded EmbeddingBagCollection.
        table_name_to_parameter_sharding: its plan (row-wise tables get a routing).
        env: torchrec's ShardingEnv.
        routings: table name -> routing; tables not named get `others`.
        others: the routing of row-wise tables not in `routings`.
        seed: the key of feistel_roundrobin's bijection.
        **kwargs: passed to ShardedEmbeddingBagCollection (fused_params, device, ...).
    """

    def __init__(
        self,
        module: EmbeddingBagCollection,
        table_name_to_parameter_sharding: dict[str, ParameterSharding],
        env: ShardingEnv,
        routings: Mapping[str, Routing | str] | None = None,
        others: Routing | str = Routing.CONTINUOUS,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        layouts = table_layouts(
            module.embedding_bag_configs(),
            table_name_to_parameter_sharding,
            env.world_size,
            _parse_routings(routings),
            Routing.parse(others),
            check_int("seed", seed, low=0),
        )
        device = kwargs.get("device")
        check_no_empty_rank(layouts, torch.device(device or "cpu").type)
        padded_module, params = _padded(module, table_name_to_parameter_sharding, layouts)
        super().__init__(padded_module, params, env, **kwargs)
        self.table_layouts: dict[str, TableLayout] = layouts
        self._feature_layouts: dict[str, tuple[str, TableLayout]] = {
            feature: (c.name, layouts[c.name])
            for c in module.embedding_bag_configs()
            if c.name in layouts and layouts[c.name].routing is not Routing.CONTINUOUS
            for feature in c.feature_names
        }
        self.register_load_state_dict_pre_hook(_default_extra_state)

    @property
    def routings(self) -> dict[str, str]:
        """Table name -> routing, for each row-wise table."""
        return {name: layout.routing.value for name, layout in self.table_layouts.items()}

    def route_features(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The KJT with each routed feature's ids replaced by their storage slots."""
        keys = features.keys()
        if not any(k in self._feature_layouts for k in keys):
            return features
        values = features.values()
        parts = torch.split(values, features.length_per_key())
        routed = []
        for key, ids in zip(keys, parts):
            if key not in self._feature_layouts:
                routed.append(ids)
                continue
            table, layout = self._feature_layouts[key]
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= layout.num_embeddings):
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                raise ValueError(
                    f"feature {key!r} (table {table!r}) has id {bad}, outside [0, {layout.num_embeddings})"
                )
            routed.append(layout.slots(ids).to(values.dtype))
        variable = features.variable_stride_per_key()
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat(routed) if routed else values,
            weights=features.weights_or_none(),
            lengths=features.lengths(),
            stride=None if variable else features.stride(),
            stride_per_key_per_rank=features.stride_per_key_per_rank() if variable else None,
            inverse_indices=features.inverse_indices_or_none(),
        )

    def input_dist(self, ctx: Any, features: Any) -> Any:
        if self._feature_layouts and not isinstance(features, KeyedJaggedTensor):
            raise TypeError(
                f"routed tables {sorted({t for t, _ in self._feature_layouts.values()})} need a "
                f"KeyedJaggedTensor input, got {type(features).__name__}"
            )
        if self._feature_layouts:
            with torch.no_grad():
                features = self.route_features(features)
        return super().input_dist(ctx, features)

    def get_extra_state(self) -> dict:
        return {"tables": {name: layout.describe() for name, layout in self.table_layouts.items()}}

    def set_extra_state(self, state: Any) -> None:
        saved = state.get("tables", {}) if isinstance(state, Mapping) else {}
        for name, layout in self.table_layouts.items():
            check_compatible(name, saved.get(name), layout)


def _default_extra_state(module, state_dict, prefix, *args) -> None:
    """A state dict without embnb's routing (torchrec's own) was saved as continuous."""
    key = prefix + "_extra_state"
    if key not in state_dict:
        state_dict[key] = {"tables": {}}


def check_compatible(table: str, saved: Mapping[str, Any] | None, layout: TableLayout) -> None:
    """Raise RoutingMismatch unless rows saved as `saved` load as they are into `layout`.

    `saved` None means torchrec's continuous layout. Continuous rows do not
    depend on W (torchrec reshards them); the round-robin routings' do.
    """
    saved = dict(saved) if saved else {"routing": Routing.CONTINUOUS.value, "seed": 0}
    routing = Routing.parse(saved.get("routing", Routing.CONTINUOUS.value))
    ours = layout.describe()
    same = routing is layout.routing and int(saved.get("seed", 0)) == layout.seed
    if same and routing is not Routing.CONTINUOUS:
        same = int(saved.get("world_size", -1)) == layout.world_size
    if not same:
        where = ", ".join(f"{k}={saved[k]!r}" for k in ("routing", "world_size", "seed") if k in saved)
        raise RoutingMismatch(
            f"table {table!r}: the state dict was saved with routing {routing.value!r} ({where}) but this "
            f"module has routing {layout.routing.value!r} (world_size={ours['world_size']}, "
            f"seed={ours['seed']}); convert the rows with embnb.rowwise.convert_rows first"
        )


class RoutedEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """EmbeddingBagCollectionSharder with row_wise on CPU too and a routing per row-wise table.

    Args:
        routings: table name -> routing ("continuous", "roundrobin", "feistel_roundrobin").
        others: the routing of row-wise tables not in `routings`.
        seed: the key of feistel_roundrobin's bijection.
        fused_params, qcomm_codecs_registry: as for EmbeddingBagCollectionSharder.
    """

    def __init__(
        self,
        routings: Mapping[str, Routing | str] | None = None,
        others: Routing | str = Routing.CONTINUOUS,
        seed: int = 0,
        fused_params: dict[str, Any] | None = None,
        qcomm_codecs_registry: dict | None = None,
    ) -> None:
        super().__init__(fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry)
        self.routings = _parse_routings(routings)
        self.others = Routing.parse(others)
        self.seed = check_int("seed", seed, low=0)

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = super().sharding_types(compute_device_type)
        return types if _ROW_WISE in types else [*types, _ROW_WISE]

    def shard(
        self,
        module: EmbeddingBagCollection,
        params: dict[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | None = None,
        module_fqn: str | None = None,
    ) -> RoutedShardedEmbeddingBagCollection:
        return RoutedShardedEmbeddingBagCollection(
            module,
            params,
            env,
            routings=self.routings,
            others=self.others,
            seed=self.seed,
            fused_params=self.fused_params,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
        )

    @property
    def sharded_module_type(self) -> type[RoutedShardedEmbeddingBagCollection]:
        return RoutedShardedEmbeddingBagCollection

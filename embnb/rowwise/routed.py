"""What the routed sharded modules share: each table's layout, the padded module torchrec shards, the
row-wise input distribution that buckets by the layouts, and the routing in the state dict.

`RoutedIds` is a mixin put before torchrec's sharded class (`ShardedEmbeddingBagCollection`,
`ShardedEmbeddingCollection`); a subclass names how to read its module's table configs and how to
build a copy of it with other configs (`_configs`, `_module_like`). `RoutedSharder` is the same for
the sharders. The row-wise sharding's input distribution is
`embnb.rowwise.input_dist.RoutedFeaturesDist` (embnb's bucketize, torchrec's all-to-all); the rest
(FBGEMM's table-batched kernels, the output distribution) is torchrec's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
from torchrec.distributed.types import ParameterSharding, ShardingEnv, ShardingType

from embnb import _torchrec_private as private
from embnb._checks import check_int
from embnb.rowwise.input_dist import RoutedFeaturesDist
from embnb.rowwise.layout import Routing, TableLayout, convert_rows

__all__ = [
    "RoutedIds",
    "RoutedSharder",
    "RoutingMismatch",
    "table_layouts",
    "check_compatible",
    "check_no_empty_rank",
]

ROW_WISE = ShardingType.ROW_WISE.value


class RoutingMismatch(ValueError):
    """A state dict saved under another routing (or world size) than the module's."""


def parse_routings(routings: Mapping[str, Routing | str] | None) -> dict[str, Routing]:
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
    layout_type: type[TableLayout] = TableLayout,
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
        if sharding is None or sharding.sharding_type != ROW_WISE:
            kind = None if sharding is None else sharding.sharding_type
            if config.name in routings and routing is not Routing.CONTINUOUS:
                raise ValueError(
                    f"table {config.name!r} has routing {routing.value!r} but the plan shards it "
                    f"{kind!r}; a routing needs sharding type {ROW_WISE!r}"
                )
            continue
        layouts[config.name] = layout_type(config.num_embeddings, world_size, routing, seed)
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


def padded_plan(
    params: Mapping[str, ParameterSharding], layouts: Mapping[str, TableLayout]
) -> dict[str, ParameterSharding]:
    """The plan with each padded table in W equal blocks of `block_size` rows."""
    params = dict(params)
    for name, layout in layouts.items():
        if layout.storage_rows == layout.num_embeddings:
            continue
        sharding = params[name]
        shards = sharding.sharding_spec.shards
        dim, b = shards[0].shard_sizes[1], layout.block_size
        blocks = [
            ShardMetadata(shard_offsets=[r * b, 0], shard_sizes=[b, dim], placement=shards[r].placement)
            for r in range(layout.world_size)
        ]
        params[name] = dataclasses.replace(sharding, sharding_spec=EnumerableShardingSpec(blocks))
    return params


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


def _default_extra_state(module, state_dict, prefix, *args) -> None:
    """A state dict without embnb's routing (torchrec's own) was saved as continuous."""
    key = prefix + "_extra_state"
    if key not in state_dict:
        state_dict[key] = {"tables": {}}


class RoutedIds:
    """Mixin for a torchrec sharded embedding module: ids routed by each table's layout.

    Args:
        module: the unsharded module.
        table_name_to_parameter_sharding: its plan (row-wise tables get a routing).
        env: torchrec's ShardingEnv.
        routings: table name -> routing; tables not named get `others`.
        others: the routing of row-wise tables not in `routings`.
        seed: the key of feistel_roundrobin's bijection.
        **kwargs: passed to torchrec's sharded module (fused_params, device, ...).

    torchrec shards a copy of the module on the meta device, with each padded table's
    `storage_rows`; unless `module` is on meta, the sharded module then loads its rows, each at
    the slot its routing names (so it starts equal to `module`, on CPU as on GPU).
    """

    layout_type: type[TableLayout] = TableLayout  # a subclass may lay rows out otherwise (a test's bug)
    features_dist_type: type[RoutedFeaturesDist] = RoutedFeaturesDist  # or route otherwise (the same)
    weight_prefix: str  # where the tables sit in the state dict ("embedding_bags", "embeddings")
    is_sequence: bool  # an EmbeddingCollection: torchrec's output distribution reads the permute

    @staticmethod
    def _configs(module: nn.Module) -> list[Any]:
        raise NotImplementedError

    @staticmethod
    def _module_like(module: nn.Module, configs: list[Any]) -> nn.Module:
        """A copy of `module` on the meta device with these table configs."""
        raise NotImplementedError

    def __init__(
        self,
        module: nn.Module,
        table_name_to_parameter_sharding: dict[str, ParameterSharding],
        env: ShardingEnv,
        routings: Mapping[str, Routing | str] | None = None,
        others: Routing | str = Routing.CONTINUOUS,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        configs = self._configs(module)
        layouts = table_layouts(
            configs,
            table_name_to_parameter_sharding,
            env.world_size,
            parse_routings(routings),
            Routing.parse(others),
            check_int("seed", seed, low=0),
            self.layout_type,
        )
        check_no_empty_rank(layouts, torch.device(kwargs.get("device") or "cpu").type)
        storage = [
            dataclasses.replace(c, num_embeddings=layouts[c.name].storage_rows) if c.name in layouts else c
            for c in configs
        ]
        params = padded_plan(table_name_to_parameter_sharding, layouts)
        # On meta, torchrec loads nothing in its constructor: the rows are loaded below, at their slots.
        super().__init__(self._module_like(module, storage), params, env, **kwargs)
        self.table_layouts: dict[str, TableLayout] = layouts
        self._feature_tables = {f: c.name for c in configs if c.name in layouts for f in c.feature_names}
        self.register_load_state_dict_pre_hook(_default_extra_state)
        if not any(p.is_meta for p in module.parameters()):
            self._load_unsharded(module)

    def _load_unsharded(self, module: nn.Module) -> None:
        state = dict(module.state_dict())
        for name, layout in self.table_layouts.items():
            key = f"{self.weight_prefix}.{name}.weight"
            id_order = TableLayout(layout.num_embeddings, layout.world_size)
            state[key] = convert_rows(state[key], id_order, layout)
        state["_extra_state"] = self.get_extra_state()
        self.load_state_dict(state)

    @property
    def routings(self) -> dict[str, str]:
        """Table name -> routing, for each row-wise table."""
        return {name: layout.routing.value for name, layout in self.table_layouts.items()}

    @property
    def routed_tables(self) -> list[str]:
        """The row-wise tables whose routing is not torchrec's continuous one."""
        return sorted(n for n, la in self.table_layouts.items() if la.routing is not Routing.CONTINUOUS)

    def _create_input_dist(self, input_feature_names: list[str], *args: Any, **kwargs: Any) -> None:
        """torchrec's input distributions, the row-wise one bucketing by the tables' layouts."""
        private.create_input_dist(self, RoutedIds, input_feature_names, *args, **kwargs)
        dists = private.input_dists(self)
        for i, sharding in enumerate(private.shardings(self)):
            if type(dists[i]) is not RwSparseFeaturesDist:
                continue  # not row-wise
            features = sharding.feature_names()
            layouts = [self.table_layouts[self._feature_tables[f]] for f in features]
            if all(la.routing is Routing.CONTINUOUS for la in layouts):
                continue  # torchrec's own layout: its own bucketize
            if private.row_wise_dist_parts(dists[i])[1]:
                raise ValueError(
                    f"routed features {features} come with positions (a feature processor); embnb's "
                    f"bucketize does not return them: route these tables 'continuous'"
                )
            pg = private.sharding_env(self).process_group  # torchrec's row-wise shardings use it
            device = next((b.device for b in dists[i].buffers()), None)  # where torchrec put its own
            dists[i] = self.features_dist_type(pg, features, layouts, device, self.is_sequence)

    def get_extra_state(self) -> dict:
        return {"tables": {name: layout.describe() for name, layout in self.table_layouts.items()}}

    def set_extra_state(self, state: Any) -> None:
        saved = state.get("tables", {}) if isinstance(state, Mapping) else {}
        for name, layout in self.table_layouts.items():
            check_compatible(name, saved.get(name), layout)


class RoutedSharder:
    """Mixin for a torchrec embedding sharder: row_wise on every device, a routing per row-wise table.

    Args:
        routings: table name -> routing ("continuous", "roundrobin", "feistel_roundrobin").
        others: the routing of row-wise tables not in `routings`.
        seed: the key of feistel_roundrobin's bijection.
        **kwargs: as for torchrec's sharder (fused_params, qcomm_codecs_registry, ...).
    """

    def __init__(
        self,
        routings: Mapping[str, Routing | str] | None = None,
        others: Routing | str = Routing.CONTINUOUS,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.routings = parse_routings(routings)
        self.others = Routing.parse(others)
        self.seed = check_int("seed", seed, low=0)

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = super().sharding_types(compute_device_type)
        return types if ROW_WISE in types else [*types, ROW_WISE]

    def _sharded_kwargs(self) -> dict[str, Any]:
        """Keyword arguments torchrec's sharder passes its sharded module besides the common ones."""
        return {}

    def shard(
        self,
        module: nn.Module,
        params: dict[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | None = None,
        module_fqn: str | None = None,
    ) -> nn.Module:
        return self.sharded_module_type(
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
            **self._sharded_kwargs(),
        )

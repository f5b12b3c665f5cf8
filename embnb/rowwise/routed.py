"""What the routed sharded modules share: each table's layout, the padded module torchrec shards, the
row-wise input distribution that buckets by the layouts, and the layout in the state dict's keys.

`RoutedIds` is a mixin put before torchrec's sharded class (`ShardedEmbeddingBagCollection`,
`ShardedEmbeddingCollection`); a subclass names how to read its module's table configs and how to
build a copy of it with other configs (`_configs`, `_module_like`). `RoutedSharder` is the same for
the sharders. The row-wise sharding's input distribution is
`embnb.rowwise.input_dist.RoutedFeaturesDist` (embnb's bucketize, torchrec's all-to-all); the rest
(FBGEMM's table-batched kernels, the output distribution) is torchrec's.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
from torchrec.distributed.types import LazyAwaitable, ParameterSharding, ShardingEnv, ShardingType

from embnb import _torchrec_private as private
from embnb._checks import check_int
from embnb.rowwise.edge_batches import has_no_samples, no_samples, one_empty_sample
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
_RESHARDABLE = (ShardingType.TABLE_WISE.value, ShardingType.COLUMN_WISE.value)  # torchrec's update_shards
_NO_SAMPLES = "embnb_no_samples"  # set on a step's context when its batch had no samples


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


_KEY_SUFFIX = re.compile(r"@(?P<routing>\w+)\(world_size=(?P<world_size>\d+)(,seed=(?P<seed>\d+))?\)")


def saved_layout(key_suffix: str) -> dict[str, Any] | None:
    """The layout a state dict key's suffix (`TableLayout.key_suffix`) names; None for no suffix."""
    if not key_suffix:
        return None
    match = _KEY_SUFFIX.fullmatch(key_suffix)
    if match is None:
        raise RoutingMismatch(f"a state dict key ends with {key_suffix!r}, which names no embnb layout")
    return {k: v if k == "routing" else int(v) for k, v in match.groupdict().items() if v is not None}


def check_compatible(table: str, saved: Mapping[str, Any] | None, layout: TableLayout) -> None:
    """Raise RoutingMismatch unless rows saved as `saved` load as they are into `layout`.

    `saved` None means torchrec's continuous layout. Continuous rows do not
    depend on W (torchrec reshards them); the round-robin routings' do, and
    feistel_roundrobin's on its seed.
    """
    saved = dict(saved) if saved else {"routing": Routing.CONTINUOUS.value}
    routing = Routing.parse(saved.get("routing", Routing.CONTINUOUS.value))
    world_size, seed = int(saved.get("world_size", 1)), int(saved.get("seed", 0))
    # the same layout is the same key suffix: routing, and W and seed where they move rows
    if TableLayout(layout.num_embeddings, world_size, routing, seed).key_suffix != layout.key_suffix:
        where = ", ".join(f"{k}={saved[k]!r}" for k in ("routing", "world_size", "seed") if k in saved)
        raise RoutingMismatch(
            f"table {table!r}: the state dict was saved with routing {routing.value!r} ({where}) but this "
            f"module has routing {layout.routing.value!r} (world_size={layout.world_size}, "
            f"seed={layout.seed}); convert the rows with embnb.rowwise.convert_rows first"
        )


def _keys_of_layouts(module: RoutedIds, destination: dict[str, Any], prefix: str, *args: Any) -> None:
    """Each routed table's rows under the key of its layout (after torchrec's own state dict hook)."""
    for name, suffix in module.key_suffixes().items():
        key = f"{prefix}{module.weight_prefix}.{name}.weight"
        destination[key + suffix] = destination.pop(key)


def _cut_to_no_samples(ctx: Any, awaitable: LazyAwaitable) -> LazyAwaitable:
    """`awaitable`, its output cut to 0 samples where the step's batch had none."""
    if getattr(ctx, _NO_SAMPLES, False) and no_samples not in awaitable.callbacks:
        awaitable.callbacks.append(no_samples)
    return awaitable


class RoutedIds:
    """Mixin for a torchrec sharded embedding module: ids routed by each table's layout.

    Args:
        module: the unsharded module.
        table_name_to_parameter_sharding: its plan (row-wise tables get a routing).
        env: torchrec's ShardingEnv.
        routings: table name -> routing; tables not named get `others`.
        others: the routing of row-wise tables not in `routings`.
        seed: the key of feistel_roundrobin's bijection.
        check_names: called at the first input distribution (when every collection of the model has
            been sharded): the sharder's check that its routings name tables of the model.
        **kwargs: passed to torchrec's sharded module (fused_params, device, ...).

    torchrec shards a copy of the module on the meta device with each table's `storage_rows`; unless
    `module` is on meta, the rows are then loaded, each at the slot its routing names (so the sharded
    module starts equal to `module`). A routed table's rows and its fused optimizer's state sit under
    torchrec's key plus `TableLayout.key_suffix`: DCP's load into a module of another layout (a plain
    one included) fails in its planning step, and `load_state_dict` raises `RoutingMismatch` naming
    both layouts before any rows load. A batch of no samples gets an output of 0 samples; an id
    outside its table raises a ValueError on every rank before any id is sent (docs/sharders.md).
    torchrec's `DistributedModelParallel.reshard` (`update_shards`) moves table-wise and column-wise
    tables; the routed tables keep their rows, optimizer state and key suffixes; a row-wise table
    named in its plan raises a ValueError naming it before anything moves.
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
        check_names: Callable[[], None] | None = None,
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
        self._check_names = check_names
        self.register_state_dict_post_hook(_keys_of_layouts)
        self._rename_optimizer_keys(self._routed_key)
        self._edge_output_dists(kwargs.get("qcomm_codecs_registry"))
        if not any(p.is_meta for p in module.parameters()):
            self._load_unsharded(module)

    def _edge_output_dists(self, qcomm_codecs_registry: Any) -> None:
        """Replace output distributions that stop on edge batches (`embnb.rowwise.edge_batches`)."""

    def update_shards(self, changed_sharding_params: Mapping[str, ParameterSharding], *args: Any) -> None:
        """torchrec's dynamic resharding (`DistributedModelParallel.reshard`, an EmbeddingBagCollection's
        in torchrec 1.6-1.9): it moves table-wise and column-wise tables between ranks; the routed
        tables keep their rows, optimizer state, key suffixes and edge-batch output distributions.

        Args:
            changed_sharding_params: table name -> its new ParameterSharding (the delta plan).
            *args: torchrec's (env, device).

        Raises:
            ValueError: naming a table the module lacks, a table that is not table_wise or
                column_wise, or a new sharding type other than the table's, before anything changes.
        """
        for name, sharding in changed_sharding_params.items():
            current = self.module_sharding_plan.get(name)
            if current is None:
                raise ValueError(
                    f"the new plan names table {name!r}, which this module lacks; its "
                    f"tables: {sorted(self.module_sharding_plan)}"
                )
            if current.sharding_type not in _RESHARDABLE or sharding.sharding_type != current.sharding_type:
                raise ValueError(
                    f"table {name!r} is sharded {current.sharding_type!r} and the new plan shards it "
                    f"{sharding.sharding_type!r}; torchrec's resharding moves {list(_RESHARDABLE)} tables "
                    f"between ranks, within their sharding type (a routed table's rows go to a new layout "
                    f"through a checkpoint: embnb.rowwise.load_resharded)"
                )
        # torchrec rebuilds the optimizers with its own keys and copies the unchanged tables' state
        # into them by key: the old ones get its keys too, for the copy; then the constructor's keys
        # and edge-batch output distributions again (torchrec rebuilt the output distributions).
        self._rename_optimizer_keys(self._torchrec_key)
        try:
            super().update_shards(changed_sharding_params, *args)
        finally:
            self._rename_optimizer_keys(self._routed_key)
        self._edge_output_dists(self.qcomm_codecs_registry)

    def _rename_optimizer_keys(self, rename: Callable[[str], str]) -> None:
        for _, optimizer in self.fused_optimizer.optimizers:  # as torchrec renames its TBEs' keys
            optimizer.params = {rename(key): p for key, p in optimizer.params.items()}

    def key_suffixes(self) -> dict[str, str]:
        """Table name -> what its keys end with (`TableLayout.key_suffix`), for each routed table."""
        return {name: la.key_suffix for name, la in self.table_layouts.items() if la.key_suffix}

    def _routed_key(self, key: str) -> str:
        """`key` (torchrec's, `{weight_prefix}.{table}.weight`) with its table's layout suffix."""
        table = key[len(self.weight_prefix) + 1 : -len(".weight")] if key.endswith(".weight") else None
        return key + self.key_suffixes().get(table, "")

    def _torchrec_key(self, key: str) -> str:
        """`key` without its table's layout suffix (torchrec's key)."""
        suffix = next((s for s in self.key_suffixes().values() if key.endswith(".weight" + s)), "")
        return key[: len(key) - len(suffix)]

    def _load_unsharded(self, module: nn.Module) -> None:
        state = dict(module.state_dict())
        for name, layout in self.table_layouts.items():
            key = f"{self.weight_prefix}.{name}.weight"
            id_order = TableLayout(layout.num_embeddings, layout.world_size)
            state[key + layout.key_suffix] = convert_rows(state.pop(key), id_order, layout)
        self.load_state_dict(state)

    @property
    def routings(self) -> dict[str, str]:
        """Table name -> routing, for each row-wise table."""
        return {name: layout.routing.value for name, layout in self.table_layouts.items()}

    @property
    def routed_tables(self) -> list[str]:
        """The row-wise tables whose routing is not torchrec's continuous one."""
        return sorted(n for n, la in self.table_layouts.items() if la.routing is not Routing.CONTINUOUS)

    def input_dist(self, ctx: Any, features: Any, *args: Any, **kwargs: Any) -> Any:
        """torchrec's input distribution; a batch of no samples goes as one sample with no ids."""
        if has_no_samples(features):
            features = one_empty_sample(features)
            setattr(ctx, _NO_SAMPLES, True)  # torchrec's contexts are plain dataclasses
        return super().input_dist(ctx, features, *args, **kwargs)

    def output_dist(self, ctx: Any, output: Any) -> LazyAwaitable:
        """torchrec's; after a batch of no samples, an output of 0 samples."""
        return _cut_to_no_samples(ctx, super().output_dist(ctx, output))

    def compute_and_output_dist(self, ctx: Any, input: Any) -> LazyAwaitable:
        """torchrec's; after a batch of no samples, an output of 0 samples."""
        return _cut_to_no_samples(ctx, super().compute_and_output_dist(ctx, input))

    def _create_input_dist(self, input_feature_names: list[str], *args: Any, **kwargs: Any) -> None:
        """torchrec's input distributions, the row-wise one bucketing by the tables' layouts."""
        if self._check_names is not None:
            self._check_names()
        private.create_input_dist(self, RoutedIds, input_feature_names, *args, **kwargs)
        dists = private.input_dists(self)
        for i, sharding in enumerate(private.shardings(self)):
            if type(dists[i]) is not RwSparseFeaturesDist:
                continue  # not row-wise
            features = sharding.feature_names()
            # A feature read by several tables appears once per table, in the order of the sharding's
            # tables: each occurrence is bucketed by the layout of the table that reads it.
            tables = [t.name for t in sharding.embedding_tables() for _ in t.feature_names]
            if len(tables) != len(features):
                raise RuntimeError(
                    f"torchrec's row-wise sharding lists features {features} for tables {tables}"
                )
            layouts = [self.table_layouts[t] for t in tables]
            if private.row_wise_dist_parts(dists[i])[1]:
                if all(la.routing is Routing.CONTINUOUS for la in layouts):
                    continue  # torchrec's own layout and bucketize, with the positions it returns
                raise ValueError(
                    f"routed features {features} come with positions (a feature processor); embnb's "
                    f"bucketize does not return them: route these tables 'continuous'"
                )
            pg = private.sharding_env(self).process_group  # torchrec's row-wise shardings use it
            device = next((b.device for b in dists[i].buffers()), None)  # where torchrec put its own
            dists[i] = self.features_dist_type(pg, features, layouts, device, self.is_sequence, tables)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        """Each routed table's rows taken from the key of its layout (renamed to torchrec's key before
        torchrec's own hooks read it); rows saved under another layout raise RoutingMismatch before
        anything of this module loads."""
        legacy = state_dict.pop(prefix + "_extra_state", None)  # embnb 0.x kept the layouts here
        legacy_tables = legacy.get("tables", {}) if isinstance(legacy, Mapping) else {}
        for name, layout in self.table_layouts.items():
            key = f"{prefix}{self.weight_prefix}.{name}.weight"
            saved = [k for k in state_dict if k == key or k.startswith(key + "@")]
            if len(saved) > 1:
                raise RoutingMismatch(
                    f"table {name!r}: the state dict holds its rows under {len(saved)} keys {saved}"
                )
            if not saved:
                continue  # missing: torch reports it
            found = saved[0]
            described = saved_layout(found[len(key) :]) if found != key else legacy_tables.get(name)
            check_compatible(name, described, layout)
            state_dict[key] = state_dict.pop(found)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class RoutedSharder:
    """Mixin for a torchrec embedding sharder: row_wise on every device, a routing per row-wise table.

    Args:
        routings: table -> routing ("continuous", "roundrobin", "feistel_roundrobin"). A table is named
            by its name or by `"{module_fqn}.{table}"` (it wins over the bare name); a name that
            matches no table raises a ValueError naming it (docs/sharders.md, "Several collections").
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
        self._tables_seen: set[str] = set()  # every table sharded so far, bare and qualified names
        self._names_used: set[str] = set()

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = super().sharding_types(compute_device_type)
        return types if ROW_WISE in types else [*types, ROW_WISE]

    def _sharded_kwargs(self) -> dict[str, Any]:
        """Keyword arguments torchrec's sharder passes its sharded module besides the common ones."""
        return {}

    def routing_of(self, table: str, module_fqn: str | None) -> Routing | None:
        """The routing `routings` names for `table` of the collection at `module_fqn` (the qualified
        name wins over the bare one); None where it names none (the table gets `others`)."""
        qualified = self.routings.get(f"{module_fqn}.{table}") if module_fqn else None
        return self.routings.get(table) if qualified is None else qualified

    def routings_of(self, tables: list[str], module_fqn: str | None) -> dict[str, Routing]:
        """The routings of one collection's `tables` at `module_fqn` (`routing_of`), recording which
        names matched; raises for a name qualified with `module_fqn`, or any name where the
        collection is the model's root, that matches none of `tables`."""
        prefix = f"{module_fqn}." if module_fqn else ""
        qualified = {f"{prefix}{t}" for t in tables} if prefix else set()
        ours = {t: r for t in tables if (r := self.routing_of(t, module_fqn)) is not None}
        self._names_used |= (set(tables) | qualified) & set(self.routings)
        self._tables_seen |= set(tables) | qualified
        unknown = [
            n for n in self.routings if n not in self._names_used and (not prefix or n.startswith(prefix))
        ]
        if unknown:  # the model's root collection, or a name qualified with this collection's path
            raise ValueError(
                f"routings name tables {unknown} that the module{f' at {module_fqn!r}' if prefix else ''} "
                f"lacks; its tables: {sorted(tables)}"
            )
        return ours

    def check_names(self) -> None:
        """Raise naming the routings' names that match no table sharded so far."""
        unknown = sorted(set(self.routings) - self._names_used)
        if unknown:
            raise ValueError(
                f"routings name tables {unknown} that no collection of the model has; its tables: "
                f"{sorted(self._tables_seen)}"
            )

    def shard(
        self,
        module: nn.Module,
        params: dict[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | None = None,
        module_fqn: str | None = None,
    ) -> nn.Module:
        tables = [c.name for c in self.sharded_module_type._configs(module)]
        return self.sharded_module_type(
            module,
            params,
            env,
            routings=self.routings_of(tables, module_fqn),
            others=self.others,
            seed=self.seed,
            check_names=self.check_names,
            fused_params=self.fused_params,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
            **self._sharded_kwargs(),
        )

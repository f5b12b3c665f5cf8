"""torchrec's EmbeddingEnumerator, enumerating the same options faster.

    enumerator = DistinctShardEnumerator(topology, batch_size=512, constraints=model.constraints)
    options = enumerator.enumerate(module, sharders)   # the same options as EmbeddingEnumerator's

It walks the module with torchrec's own loop, helpers and constructors, and
differs in what it computes once: torchrec's default estimators per distinct
shard size (`embnb.planner.estimates`), per-table results torchrec computes
again from the same arguments, shards made only when read (`LayoutOption`s,
`embnb.planner.layout`) and a cache kept as a compact record (`_Record`), not
a deep copy. docs/planner.md ("The enumerator") says where torchrec's time
goes and what each difference saves. The loop reads torchrec's private
helpers and state (`embnb._torchrec_private`), which change between versions,
so `create_planner` takes it only where this torchrec has every piece it
needs (`default_enumerator`); its equality with torchrec's enumerator, field
by field, is tested on every stack CI runs (torchrec 1.6.1, 1.8.0 and 1.9.2).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import warnings
from typing import Any

import numpy as np
import torchrec
from torch import nn
from torchrec.distributed.planner import enumerators as torchrec_enumerators
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    ShardEstimator,
    ShardingOption,
    Topology,
)
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.sharding_plan import calculate_shard_sizes_and_offsets
from torchrec.distributed.types import ModuleSharder
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.embedding_tower import EmbeddingTower, EmbeddingTowerCollection

from embnb import _torchrec_private as private
from embnb._checks import check_choice
from embnb._gc import collector_paused
from embnb._torchrec_private import enumerator_missing
from embnb.planner.estimates import Distinct, clone, covers, estimate_distinct
from embnb.planner.layout import LAZY_FIELDS, Layout, LayoutOption

__all__ = [
    "ENUMERATORS",
    "DistinctShardEnumerator",
    "default_enumerator",
    "enumerator_missing",
    "make_enumerator",
    "same_options",
]


class DistinctShardEnumerator(EmbeddingEnumerator):
    """torchrec's EmbeddingEnumerator (same arguments, same options, same cache
    behaviour), with torchrec's default estimators run once per distinct shard
    of an option and a cache made without deep copies. Other estimators run as
    torchrec runs them."""

    def __init__(
        self,
        topology: Topology,
        batch_size: int,
        constraints: dict[str, ParameterConstraints] | None = None,
        estimator: ShardEstimator | list[ShardEstimator] | None = None,
    ) -> None:
        super().__init__(
            topology=topology, batch_size=batch_size, constraints=constraints, estimator=estimator
        )
        self._record: _Record | None = None
        self._settings = private.enumerator_settings(self)  # what torchrec's __init__ kept
        self._sharders: dict[str, ModuleSharder[nn.Module]] = {}  # by module type name
        self._memos: dict[tuple, Any] = {}

    def enumerate(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> list[ShardingOption]:
        # torchrec's cache: the same module and sharders get the stored options again, as new objects.
        if self._record is not None and private.is_last_stored(self, module, sharders):
            return self._record.options()
        self._settings = private.enumerator_settings(self)
        self._sharders = private.set_sharders(self, sharders)
        self._memos = {}
        with collector_paused():
            options = self._options_of(module)
            distinct = self._estimate(options)
            self._record = _Record(options, distinct)
        private.store_last(self, module, sharders)
        return options

    @property
    def last_stored_search_space(self) -> list[ShardingOption] | None:
        return None if self._record is None else self._record.options()

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        self._estimate(sharding_options)

    def _estimate(self, options: list[ShardingOption]) -> list[Distinct] | None:
        """torchrec's populate_estimates (the same estimators in the same order);
        returns each option's distinct shards where they were estimated alone."""
        sharders, estimators = private.estimator_sharders(self), private.estimators_of(self)
        if all(map(covers, estimators)):
            return estimate_distinct(estimators, options, sharders)
        for estimator in estimators:
            estimator.estimate(options, sharders)
        return None

    def _options_of(self, module: nn.Module) -> list[LayoutOption]:
        """torchrec's EmbeddingEnumerator.enumerate up to its estimates: the
        shardable parameters of the modules its sharders take, in its order."""
        options: list[LayoutOption] = []
        queue = [("", module)]
        while queue:
            path, child = queue.pop(0) if self._settings.exact_order else queue.pop()
            sharder_key = sharder_name(type(child))
            sharder = self._sharders.get(sharder_key)
            if not sharder:
                queue.extend(
                    (f"{path}.{name}" if path else name, grandchild)
                    for name, grandchild in child.named_children()
                )
                continue
            is_pooled = ShardingOption.module_pooled(child, path)
            for name, param in sharder.shardable_parameters(child).items():
                options += self._options_of_table(name, param, path, child, sharder, sharder_key, is_pooled)
        return options

    def _options_of_table(
        self, name, param, path, child, sharder, sharder_key, is_pooled
    ) -> list[LayoutOption]:
        settings = self._settings
        constraints = private.param_constraints(settings.constraints, name)
        if constraints.device_group and constraints.device_group != settings.compute_device:
            return []
        num_buckets = self._num_buckets(name, child)
        dependency = None
        if isinstance(child, EmbeddingTower):
            dependency = path
        elif isinstance(child, EmbeddingTowerCollection):
            dependency = f"{path}.tower_{private.tower_index(name, child)}"
        options = []
        sharding_types = self._memo(sharder.sharding_types, settings.compute_device)
        for sharding_type in private.filter_sharding_types(self, name, sharding_types, sharder_key):
            kernels = self._memo(sharder.compute_kernels, sharding_type, settings.compute_device)
            layout = None  # torchrec's shard sizes depend on the sharding type, not the kernel
            for compute_kernel in self._kernels_of(name, kernels, sharding_type):
                if layout is None:
                    layout = self._layout(
                        param,
                        sharding_type,
                        constraints.col_wise_shard_dim,
                        num_buckets,
                        (name, path, child, sharder, compute_kernel),
                    )
                option = LayoutOption.of(
                    layout,
                    name=name,
                    tensor=param,
                    module=(path, child),
                    input_lengths=constraints.input_lengths,
                    batch_size=settings.batch_size,
                    compute_kernel=compute_kernel,
                    sharding_type=sharding_type,
                    partition_by=self._memo(torchrec_enumerators.get_partition_by_type, sharding_type),
                    cache_params=constraints.cache_params,
                    enforce_hbm=constraints.enforce_hbm,
                    stochastic_rounding=constraints.stochastic_rounding,
                    bounds_check_mode=constraints.bounds_check_mode,
                    dependency=dependency,
                    is_pooled=is_pooled,
                    feature_names=constraints.feature_names,
                    output_dtype=constraints.output_dtype,
                    key_value_params=constraints.key_value_params,
                    **({"stash_weights": self._stash_weights(name, child)} if private.STASH_WEIGHTS else {}),
                )
                options.append(option)
        if not options:
            raise RuntimeError(
                "No available sharding type and compute kernel combination after applying user provided "
                f"constraints for {name}. Module: {sharder_key}, sharder: {type(sharder).__name__}, "
                f"compute device: {settings.compute_device}. To debug, search above for warning logs about "
                f"no available sharding types/compute kernels for table: {name}"
            )
        return options

    def _stash_weights(self, name: str, child: nn.Module) -> bool:
        """torchrec 1.9's `_get_stash_weights`: the flag on the first config named `name`, read once
        per EmbeddingBagCollection or EmbeddingCollection (torchrec scans the configs per table);
        other modules ask torchrec."""
        if not isinstance(child, (EmbeddingBagCollection, EmbeddingCollection)):
            return private.stash_weights(self, name, child)
        return self._by_table(child, "stash_weights", lambda c: bool(getattr(c, "stash_weights", False)))[
            name
        ]

    def _num_buckets(self, name: str, child: nn.Module) -> int | None:
        """torchrec's `_get_num_buckets`: for an EmbeddingBagCollection or EmbeddingCollection, the
        first config named `name` that is a virtual table gives its buckets, else None. torchrec
        scans every config for each table (quadratic: seconds at 5,000 tables), so the virtual
        ones are read once per module here; other modules ask torchrec."""
        if not isinstance(child, (EmbeddingBagCollection, EmbeddingCollection)):
            return private.num_buckets(self, name, child)
        virtual = self._by_table(
            child, "virtual tables", lambda c: c.total_num_buckets, lambda c: c.use_virtual_table
        )
        return virtual.get(name)

    def _by_table(self, child: nn.Module, what: str, read, keep=lambda config: True) -> dict[str, Any]:
        """`read(config)` of the first kept config of each table name of an EBC or EC, once per module."""
        key = (what, id(child))
        if key not in self._memos:
            configs = (
                child.embedding_bag_configs()
                if isinstance(child, EmbeddingBagCollection)
                else child.embedding_configs()
            )
            values: dict[str, Any] = {}
            for config in configs:
                if keep(config):
                    values.setdefault(config.name, read(config))
            self._memos[key] = values
        return self._memos[key]

    def _memo(self, function, *args):
        """`function(*args)`, computed once per enumeration: torchrec's sharders'
        sharding types and kernels and its partition types depend on their
        arguments alone, and torchrec asks again for every table."""
        key = (function, *args)
        if key not in self._memos:
            self._memos[key] = function(*args)
        return self._memos[key]

    def _kernels_of(self, name: str, kernels: list[str], sharding_type: str) -> list[str]:
        """torchrec's _filter_compute_kernels. For a table without compute-kernel
        constraints it reads only the sharder's kernels (the sharding type and
        the name go into its warning when none is left), so it runs once per
        sharder's kernel list."""
        constraints = self._settings.constraints
        constraint = constraints.get(name) if constraints else None
        if constraint and constraint.compute_kernels:
            return private.filter_compute_kernels(self, name, kernels, sharding_type)
        key = ("unconstrained kernels", tuple(kernels))
        if key not in self._memos:
            self._memos[key] = private.filter_compute_kernels(self, name, kernels, sharding_type)
            return self._memos[key]
        return self._memos[key] or private.filter_compute_kernels(self, name, kernels, sharding_type)  # warns

    def _layout(self, param, sharding_type, col_wise_shard_dim, num_buckets, where) -> Layout:
        """torchrec's calculate_shard_sizes_and_offsets, as a Layout (one per table and sharding
        type: its options of every kernel share it); data-parallel and even row-wise layouts are
        made in numpy (`Layout.spread`)."""
        settings = self._settings
        try:
            if not num_buckets and not settings.device_memory_sizes:
                spread = Layout.spread(sharding_type, *param.shape, settings.world_size)
                if spread is not None:
                    return spread
            sizes, offsets = calculate_shard_sizes_and_offsets(
                tensor=param,
                world_size=settings.world_size,
                local_world_size=settings.local_world_size,
                sharding_type=sharding_type,
                col_wise_shard_dim=col_wise_shard_dim,
                device_memory_sizes=settings.device_memory_sizes,
                num_buckets=num_buckets,
            )
        except ZeroDivisionError as e:  # torchrec adds the same context
            name, path, child, sharder, compute_kernel = where
            raise ValueError(
                f"Failed to calculate sharding plan: {e} Context: table_name='{name}', module_path='{path}', "
                f"module_type='{type(child).__name__}', sharder='{type(sharder).__name__}', "
                f"tensor.shape={param.shape}, sharding_type='{sharding_type}', "
                f"compute_kernel='{compute_kernel}', "
                f"world_size={settings.world_size}, local_world_size={settings.local_world_size}, "
                f"col_wise_shard_dim={col_wise_shard_dim}, compute_device='{settings.compute_device}'"
            ) from e
        return Layout.of(sizes, offsets)


class _Record:
    """The options as enumerated, kept compactly: each option's attributes
    (mutable ones deep-copied, the module and tensor shared, as torchrec's deep
    copy does), its shard layout, and a copy of each distinct shard's
    estimates. `options()` builds fresh LayoutOptions equal to them (every
    shard's rank was None when enumerated), their shards not yet made."""

    def __init__(self, options: list[LayoutOption], distinct: list[Distinct] | None) -> None:
        memo: dict[int, Any] = {}
        if distinct is None:  # each shard its own
            distinct = [Distinct(np.arange(len(option.shards)), option.shards) for option in options]
        self._options = [
            (
                _snapshot(option, memo),
                option.layout,
                np.asarray(its.slot_of),
                [(clone(shard.perf), clone(shard.storage)) for shard in its.shards],
            )
            for option, its in zip(options, distinct)
        ]

    def options(self) -> list[LayoutOption]:
        memo: dict[int, Any] = {}
        rebuilt = []
        for fields, layout, slot_of, estimates in self._options:
            option = object.__new__(LayoutOption)
            option.__dict__.update(_snapshot(fields, memo))
            copies = [(clone(perf), clone(storage)) for perf, storage in estimates]  # shared as enumerated
            option.defer(layout, slot_of, copies)
            rebuilt.append(option)
        return rebuilt


_ATOMIC = frozenset({str, int, float, bool, type(None)})
_SHARED = frozenset({*private.OPTION_SHARED_ATTRIBUTES, "shards"})  # torchrec's deep copy shares the first


def _snapshot(option: ShardingOption | dict, memo: dict[int, Any]) -> dict[str, Any]:
    """An option's attributes but its shards (made or to be made): module and tensor shared,
    immutable values as they are, the rest deep-copied (through `memo`, so what options share
    stays shared)."""
    copied = dict(option if isinstance(option, dict) else vars(option))
    for name in ("shards", *LAZY_FIELDS):
        copied.pop(name, None)
    for name, value in copied.items():
        if type(value) in _ATOMIC or name in _SHARED or isinstance(value, enum.Enum):
            continue
        copied[name] = memo[id(value)] if id(value) in memo else copy.deepcopy(value, memo)
    return copied


_NOT_COMPARED = frozenset({*_SHARED, *LAZY_FIELDS, "cache_params"})


def same_options(expected: list, actual: list) -> bool:
    """Whether two enumerations (of one module, or of two alike ones) hold the
    same options in the same order: each option's fields, and each shard's
    size, offset, rank, storage and perf (floats to the bit). A cache's
    statistics object is compared by presence (torchrec copies it per option)."""

    def record(option) -> tuple:
        shards = [
            (
                shard.size,
                shard.offset,
                shard.storage,
                shard.rank,
                *map(_bits, (*dataclasses.astuple(shard.perf), shard.perf.total)),
            )
            for shard in option.shards
        ]
        fields = {k: v for k, v in vars(option).items() if k not in _NOT_COMPARED}
        cache = option.cache_params  # its statistics are copied per option: compared by presence
        cache = None if cache is None else (dataclasses.replace(cache, stats=None), cache.stats is None)
        return (fields, option.tensor.shape, option.module[0], cache, shards)

    return len(expected) == len(actual) and all(record(a) == record(b) for a, b in zip(expected, actual))


def _bits(value: float) -> object:
    return value.hex() if isinstance(value, float) else value  # -0.0 apart from 0.0, NaN equal to NaN


ENUMERATORS = ("torchrec", "embnb")  # torchrec's EmbeddingEnumerator, DistinctShardEnumerator


_WARNED: set[str] = set()


def default_enumerator() -> str:
    """ "embnb" where this torchrec has every private piece DistinctShardEnumerator needs
    (`embnb._torchrec_private.enumerator_missing`), else "torchrec", with one warning naming what
    is missing and what the fallback costs."""
    missing = private.enumerator_missing()
    if not missing:
        return "embnb"
    message = (
        f"embnb's enumerator needs what torchrec {torchrec.__version__} lacks: {'; '.join(missing)}. "
        "create_planner enumerates with torchrec's EmbeddingEnumerator instead: the same options, "
        "enumerated several times slower (docs/performance.md, the enumerators bench)"
    )
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=2)
    return "torchrec"


def make_enumerator(
    enumerator: str,
    topology: Topology,
    batch_size: int,
    constraints: dict[str, ParameterConstraints] | None = None,
    estimator: list[ShardEstimator] | None = None,
) -> EmbeddingEnumerator:
    """The enumerator named `enumerator` (one of ENUMERATORS) with `estimator` (None: torchrec's
    default estimators)."""
    check_choice("enumerator", enumerator, ENUMERATORS)
    kind = EmbeddingEnumerator if enumerator == "torchrec" else DistinctShardEnumerator
    return kind(topology=topology, batch_size=batch_size, constraints=constraints, estimator=estimator)

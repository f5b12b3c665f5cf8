"""A torchrec PerfModel that prices a rank as it runs: its shards, its kernel calls, the collectives.

torchrec's planner rates every plan it places with a `PerfModel` (`EmbeddingShardingPlanner(
performance_model=...)`; its default `NoopPerfModel` takes the largest per-rank sum of shard perfs)
and keeps the plan rated least. `KernelCallPerfModel` adds two costs that sum of shards cannot see:

- **a kernel call per TBE on a rank**: a sharded module looks a rank's tables up one
  `GroupedEmbeddingConfig` (one FBGEMM TBE) at a time, one group per distinct key of torchrec's
  `group_tables` (torchrec/distributed/embedding_sharding.py, 1.6.1 to 1.9.2 alike) within each
  sharding type's lookup; each call has a cost whatever its ids (on a 2-core CPU about 0.46 ms
  fitted; on the H200 a rank's forward took 0.5-1.5 ms whatever its ids: issue #69). `tbe_group_key`
  is that key for one shard;
- **the fixed latency of each sharding type's collectives**: each sharded module runs, per sharding
  type its plan uses, one input distribution (the ids' all-to-all) and one output distribution (the
  embeddings' all-to-all or reduce-scatter, and its gradient's); every rank waits for them, so the
  plan pays each once, whatever the rank.

The rating (ms), per plan: max over ranks r of (sum of r's shard perfs, added in plan order as
NoopPerfModel adds them, + `kernel_call_ms` x r's TBE groups), + the sum over the distinct (module,
sharding type) pairs of the plan, in sorted order, of `collective_ms[sharding type]`. At zero
coefficients it is NoopPerfModel's to the bit (x + 0.0 is x). Coefficients come from a
`Calibration` (`from_calibration`; `embnb.planner.calibration`).

    model = KernelCallPerfModel(topology, kernel_call_ms=0.46, collective_ms={"table_wise": 0.1})
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=512, performance_model=model)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import PerfModel, ShardingOption, Topology
from torchrec.distributed.types import ShardingType

from embnb._checks import check_number
from embnb.planner.layout import deferred

__all__ = [
    "KernelCallPerfModel",
    "tbe_group_key",
    "tbe_group_keys",
    "parameter_sharding_group_keys",
    "SHARDING_TYPES",
]

SHARDING_TYPES = tuple(t.value for t in ShardingType)

# torchrec's _get_compute_kernel_type: the UVM kernels run in the same TBE as the HBM one.
_KERNEL_TYPE = {
    EmbeddingComputeKernel.FUSED_UVM.value: EmbeddingComputeKernel.FUSED.value,
    EmbeddingComputeKernel.FUSED_UVM_CACHING.value: EmbeddingComputeKernel.FUSED.value,
    EmbeddingComputeKernel.QUANT_UVM.value: EmbeddingComputeKernel.QUANT.value,
    EmbeddingComputeKernel.QUANT_UVM_CACHING.value: EmbeddingComputeKernel.QUANT.value,
}
# torchrec's _prefetch_and_cached: these kernels always (DRAM_SSD_VIRTUAL_TABLE is 1.8's), the
# caching ones where the cache parameters turn the prefetch pipeline on.
_PREFETCH_KERNELS = frozenset(
    {"key_value", "ssd_virtual_table", "dram_virtual_table", "dram_ssd_virtual_table"}
)
_CACHING_KERNELS = frozenset({"fused_uvm_caching", "quant_uvm_caching"})
# The DataType's bits (torchrec's DATA_TYPE_NUM_BITS), for the dimension bucket of prefetched tables.
_BITS = {"FP32": 32, "FP16": 16, "BF16": 16, "INT8": 8, "INT4": 4, "INT2": 2, "INT64": 64, "INT32": 32}


def _frozen(value: Any) -> Any:
    """`value` as something hashable that compares as torchrec's key compares it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,) + tuple(
            (f.name, _frozen(getattr(value, f.name))) for f in dataclasses.fields(value)
        )
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _table_configs(module: nn.Module) -> dict[str, Any]:
    """The table configs of a module torchrec shards (EmbeddingBagCollection, EmbeddingCollection,
    their feature-processed and managed-collision wrappers), by table name."""
    found: dict[str, Any] = {}
    for candidate in (module, *module.children()):
        for method in ("embedding_bag_configs", "embedding_configs"):
            configs = getattr(candidate, method, None)
            if callable(configs):
                found.update({config.name: config for config in configs()})
    return found


def _fused_key(option: Any) -> tuple:
    """The fused parameters torchrec's `add_params_from_parameter_sharding` takes from the plan
    (less `cache_load_factor`, which `_get_grouping_fused_params` drops), with the table's
    optimizer kwargs (`merge_fused_params` with the parameter's `_optimizer_kwargs`). A sharder's
    own fused parameters are one per module: they split no group within it."""
    params: dict[str, Any] = {}
    tensor = getattr(option, "tensor", None)
    kwargs = getattr(tensor, "_optimizer_kwargs", None)
    if kwargs:
        params["optimizer_kwargs"] = kwargs[0]
    classes = getattr(tensor, "_optimizer_classes", None)
    if classes and classes[0] is not None:
        params["optimizer_class"] = classes[0].__qualname__
    cache = option.cache_params
    if cache is not None:
        for name in (
            "algorithm",
            "reserved_memory",
            "precision",
            "prefetch_pipeline",
            "multipass_prefetch_config",
        ):
            value = getattr(cache, name, None)
            if value is not None:
                params[f"cache_{name}"] = value
    for name in ("enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype"):
        value = getattr(option, name, None)
        if value is not None:
            params[name] = value
    if option.compute_kernel in _PREFETCH_KERNELS and getattr(option, "key_value_params", None) is not None:
        params["key_value_params"] = option.key_value_params
    return _frozen(params)


def _prefetch_and_cached(option: Any) -> bool:
    if option.compute_kernel in _PREFETCH_KERNELS:
        return True
    cache = option.cache_params
    return option.compute_kernel in _CACHING_KERNELS and bool(getattr(cache, "prefetch_pipeline", None))


def _shard_columns(option: ShardingOption) -> list[int]:
    """Each shard's column count (torchrec's `local_cols`), without making deferred shards."""
    if deferred(option):
        return option.layout.table[:, 0, 1].tolist()
    return [shard.size[1] for shard in option.shards]


def tbe_group_keys(option: ShardingOption, configs: dict[str, Any] | None = None) -> list[tuple]:
    """Per shard of `option`, torchrec's TBE grouping key with the module and sharding type (a
    sharded module looks each sharding type up apart): shards on one rank with one key run as one
    TBE call. The key is `group_tables`' (torchrec/distributed/embedding_sharding.py, the same in
    1.6.1, 1.8.0 and 1.9.2): data type, pooling, feature processor (False: torchrec's
    EmbeddingBagCollection and EmbeddingCollection shardings set none), the grouping fused
    parameters, the compute kernel type (`fused_uvm` and `fused_uvm_caching` as `fused`, the
    `quant_uvm*` as `quant`), the dimension bucket (bytes per row, only for prefetched and cached
    tables), prefetched-and-cached, the virtual table (inference), embedding update (an
    EmbeddingCollection's) and weight stashing. `configs`: the module's table configs by name
    (read from `option.module` when None).

    Not visible in a plan, so not in the key: a sharder's `use_one_tbe_per_table` (a TBE per
    table); and `quant` tables are taken as a rank's only kernel (torchrec's inference check is
    over all the tables of a rank)."""
    path, module = option.module
    if configs is None:
        configs = _table_configs(module)
    pooled = getattr(option, "is_pooled", True) is not False
    return _group_keys(path, option, configs.get(option.name), pooled, _shard_columns(option))


def parameter_sharding_group_keys(
    sharding: Any, config: Any, columns: list[int], path: str = ""
) -> list[tuple]:
    """`tbe_group_keys` from a plan's `ParameterSharding` (its sharding type, compute kernel, cache
    parameters and fused flags, which it names as a `ShardingOption` does) and the table's
    `EmbeddingBagConfig`, for shards of `columns` columns each (pooled: an EmbeddingBagCollection's).
    Per-parameter optimizer arguments are not in a plan, so not in this key."""
    return _group_keys(path, sharding, config, True, columns)


def _group_keys(path: str, source: Any, config: Any, pooled: bool, columns: list[int]) -> list[tuple]:
    """The keys of `tbe_group_keys`; `source` a ShardingOption or ParameterSharding."""
    data_type = getattr(config, "data_type", None)
    inference = source.compute_kernel == EmbeddingComputeKernel.QUANT.value
    base = (
        path,
        source.sharding_type,
        None if inference else data_type,
        getattr(config, "pooling", None) if pooled else None,
        False,
        _fused_key(source),
        _KERNEL_TYPE.get(source.compute_kernel, source.compute_kernel),
    )
    prefetched = _prefetch_and_cached(source)
    tail = (
        prefetched,
        getattr(config, "use_virtual_table", None) if inference else None,
        bool(getattr(config, "enable_embedding_update", False)) if not pooled else False,
        bool(getattr(source, "stash_weights", False) or getattr(config, "stash_weights", False)),
    )
    if not prefetched:
        return [(*base, 0, *tail)] * len(columns)
    bits = _BITS.get(getattr(data_type, "name", None), 32)
    return [(*base, cols * bits // 8, *tail) for cols in columns]


def kernel_type(compute_kernel: str) -> str:
    """torchrec's `_get_compute_kernel_type`: the kernel a TBE group is keyed by (`fused_uvm` and
    `fused_uvm_caching` as `fused`, the `quant_uvm*` as `quant`, others as themselves)."""
    return _KERNEL_TYPE.get(compute_kernel, compute_kernel)


def tbe_group_key(option: ShardingOption, shard: int = 0) -> tuple:
    """torchrec's TBE grouping key of shard `shard` of `option` (`tbe_group_keys`)."""
    return tbe_group_keys(option)[shard]


class KernelCallPerfModel(PerfModel):
    """torchrec's NoopPerfModel plus the cost of each TBE call on a rank and the fixed latency of
    each sharding type's collectives (module docstring: the formula and its sources).

    Args:
        topology: the topology planned for (its `world_size` ranks).
        kernel_call_ms: ms per TBE call on a rank (forward and backward), >= 0.
        collective_ms: ms per sharding type (a `ShardingType` value) for one module's input and
            output distributions of it, forward and backward; types left out cost 0.

    Raises ValueError naming a negative or non-finite coefficient or an unknown sharding type
    (TypeError where a coefficient is not a number).

    `rate(plan)` is the rating (ms); `rank_costs(plan)` each rank's part, `kernel_calls(plan)` each
    rank's TBE groups, `collectives_ms(plan)` the plan's fixed part."""

    def __init__(
        self,
        topology: Topology,
        kernel_call_ms: float = 0.0,
        collective_ms: Mapping[str, float] | None = None,
    ) -> None:
        self._topology = topology
        self.kernel_call_ms = _coefficient("kernel_call_ms", kernel_call_ms)
        self.collective_ms = {
            sharding_type: _coefficient(f"collective_ms[{sharding_type!r}]", ms, sharding_type)
            for sharding_type, ms in (collective_ms or {}).items()
        }
        self._configs: dict[int, tuple[nn.Module, dict[str, Any]]] = {}

    @classmethod
    def from_calibration(cls, topology: Topology, calibration: Any) -> KernelCallPerfModel:
        """The model with a `Calibration`'s `kernel_call_ms` and `collective_ms`."""
        return cls(topology, calibration.kernel_call_ms, calibration.collective_ms)

    def __repr__(self) -> str:
        terms = f"kernel_call_ms={self.kernel_call_ms!r}, collective_ms={self.collective_ms!r}"
        return f"KernelCallPerfModel({terms})"

    @property
    def is_zero(self) -> bool:
        """Whether every coefficient is 0 (then the ratings are NoopPerfModel's)."""
        return self.kernel_call_ms == 0 and not any(self.collective_ms.values())

    def keys(self, option: ShardingOption) -> list[tuple]:
        """`tbe_group_keys` of `option`, its module's configs read once per module."""
        module = option.module[1]
        held = self._configs.get(id(module))
        if held is None or held[0] is not module:
            held = self._configs[id(module)] = (module, _table_configs(module))
        return tbe_group_keys(option, held[1])

    def kernel_calls(self, plan: list[ShardingOption]) -> list[int]:
        """Per rank, the TBE groups its shards make (its kernel calls per lookup)."""
        seen: list[set] = [set() for _ in range(self._topology.world_size)]
        for option in plan:
            for shard, key in zip(option.shards, self.keys(option)):
                seen[shard.rank].add(key)
        return [len(keys) for keys in seen]

    def collectives_ms(self, plan: list[ShardingOption]) -> float:
        """The plan's fixed part: `collective_ms` of each distinct (module, sharding type), added
        in sorted order."""
        total = 0.0
        for _path, sharding_type in sorted({(o.module[0], o.sharding_type) for o in plan}):
            total += self.collective_ms.get(sharding_type, 0.0)
        return total

    def rank_costs(self, plan: list[ShardingOption]) -> list[float]:
        """Per rank (ms): its shards' perf totals added in plan order (NoopPerfModel's sums) plus
        `kernel_call_ms` x its TBE groups."""
        perfs = [0.0] * self._topology.world_size
        for option in plan:
            for shard in option.shards:
                perfs[shard.rank] += shard.perf.total
        calls = self.kernel_calls(plan) if self.kernel_call_ms else [0] * len(perfs)
        return [perf + self.kernel_call_ms * count for perf, count in zip(perfs, calls)]

    def rate(self, plan: list[ShardingOption]) -> float:
        """The plan's rating (ms): the slowest rank's cost plus the plan's collectives."""
        return max(self.rank_costs(plan)) + self.collectives_ms(plan)


def _coefficient(name: str, value: Any, sharding_type: str | None = None) -> float:
    if sharding_type is not None and sharding_type not in SHARDING_TYPES:
        raise ValueError(f"{name}: the sharding type must be one of {SHARDING_TYPES}, got {sharding_type!r}")
    return check_number(name, value, low=0)


class RatingTerms:
    """A `KernelCallPerfModel`'s terms laid out for the replica of torchrec's partitioner
    (`embnb.planner.replica`): per shard row of `ShardValues` its TBE group id, per option (flat,
    table by table) its (module, sharding type) id, numbered in sorted order, and each id's
    `collective_ms`. `rank_costs` and `collectives_ms` compute what the model's do, in its order."""

    def __init__(self, model: KernelCallPerfModel, options: list[list[ShardingOption]], values: Any) -> None:
        self.kernel_call_ms = model.kernel_call_ms
        flat = [option for table in options for option in table]
        group_of: dict[tuple, int] = {}
        self.shard_group = np.zeros(len(values.slots), dtype=np.int64)
        if self.kernel_call_ms:
            for option in flat:
                keys, rows = model.keys(option), values.rows(option)
                if all(key is keys[0] for key in keys):  # one key for all (not dimension-bucketed)
                    self.shard_group[rows] = group_of.setdefault(keys[0], len(group_of))
                else:
                    self.shard_group[rows] = [group_of.setdefault(key, len(group_of)) for key in keys]
        self.num_groups = max(len(group_of), 1)
        pairs = sorted({(option.module[0], option.sharding_type) for option in flat})
        pair_id = {pair: i for i, pair in enumerate(pairs)}
        self.option_pair = np.array(
            [pair_id[(option.module[0], option.sharding_type)] for option in flat], dtype=np.int64
        )
        self.pair_ms = np.array([model.collective_ms.get(st, 0.0) for _, st in pairs], dtype=float)
        self.has_collectives = bool(self.pair_ms.any())

    def rank_costs(self, loads: np.ndarray, shard_rows: np.ndarray, shard_ranks: np.ndarray) -> np.ndarray:
        """`loads` (NoopPerfModel's per-rank sums) plus `kernel_call_ms` x each rank's distinct
        groups among the placed shards (`shard_rows`: their `ShardValues` rows; `shard_ranks`)."""
        if not self.kernel_call_ms:
            return loads
        pairs = np.unique(shard_ranks * self.num_groups + self.shard_group[shard_rows])
        calls = np.bincount(pairs // self.num_groups, minlength=len(loads))
        return loads + self.kernel_call_ms * calls

    def collectives_ms(self, flat_options: np.ndarray) -> float:
        """The plan's fixed part: each distinct (module, sharding type) of the chosen options
        (`flat_options`), added in sorted order from 0.0."""
        total = 0.0
        if self.has_collectives:
            for ms in self.pair_ms[np.unique(self.option_pair[flat_options])].tolist():
                total += ms
        return total

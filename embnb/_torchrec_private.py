"""torchrec's private names that embnb uses, each behind one small function.

None of them is part of torchrec's API, so they live here alone: the rest of embnb calls the
functions below, and tests/planner/test_torchrec_private.py checks, on every stack CI runs, that
every name in `PRIVATE_FUNCTIONS` and `PRIVATE_ATTRIBUTES` still exists with the parameters used
here. At run time a torchrec that lacks a piece embnb's enumerator needs (`enumerator_missing`)
gets torchrec's own enumerator, with one warning naming it (`enumerator.default_enumerator`).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any, NamedTuple

from torch import nn
from torchrec.distributed.dist_data import KJTAllToAllSplitsAwaitable
from torchrec.distributed.embedding import ShardedEmbeddingCollection
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.planner import enumerators as torchrec_enumerators
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator.estimator import (
    EmbeddingPerfEstimator,
    EmbeddingShardingPerfEvaluator,
)
from torchrec.distributed.planner.estimator.types import HardwarePerfConfig
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, ShardEstimator, ShardingOption
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist

# ShardingOption's fields that embnb's enumerator fills as torchrec's does (or, num_poolings, leaves
# at the default as torchrec's does); stash_weights from torchrec 1.9 on.
OPTION_FIELDS = (
    *("name", "tensor", "module", "input_lengths", "batch_size", "sharding_type", "partition_by"),
    *("compute_kernel", "shards", "cache_params", "enforce_hbm", "stochastic_rounding"),
    *("bounds_check_mode", "dependency", "is_pooled", "feature_names", "output_dtype"),
    *("key_value_params", "num_poolings", "stash_weights"),
)
# torchrec 1.9+ options carry each table's stash_weights flag (embedding memory stashing, #4519).
STASH_WEIGHTS = "stash_weights" in inspect.signature(ShardingOption.__init__).parameters

# torchrec 1.7+ hands estimators a snapshot of each sharder (SharderData); 1.6 the sharders by name.
SHARDER_DATA = hasattr(torchrec_enumerators, "build_sharder_data_map")

# Each private function or method used here, with the parameters it is called with.
PRIVATE_FUNCTIONS: dict[tuple[Any, str], tuple[str, ...]] = {
    (torchrec_enumerators, "_extract_constraints_for_param"): ("constraints", "name"),
    (torchrec_enumerators, "_get_tower_index"): ("name", "child_module"),
    (EmbeddingEnumerator, "_get_num_buckets"): ("self", "parameter", "module"),
    **(
        {(EmbeddingEnumerator, "_get_stash_weights"): ("self", "parameter", "module")}
        if STASH_WEIGHTS
        else {}
    ),
    # overridden, not called: embnb.planner.partitioner.HeapSearchPartitioner
    (GreedyPerfPartitioner, "_device_partition"): ("sharding_option", "minheap_devices"),
    (ShardedEmbeddingCollection, "_generate_permute_indices_per_feature"): (
        "self",
        "embedding_configs",
        "table_name_to_parameter_sharding",
    ),
    (ShardedEmbeddingBagCollection, "_create_input_dist"): ("self", "input_feature_names"),
    (ShardedEmbeddingCollection, "_create_input_dist"): ("self", "input_feature_names", "ctx"),
    (EmbeddingEnumerator, "_filter_sharding_types"): (
        "self",
        "name",
        "allowed_sharding_types",
        "sharder_key",
    ),
    (EmbeddingEnumerator, "_filter_compute_kernels"): (
        "self",
        "name",
        "allowed_compute_kernels",
        "sharding_type",
    ),
    # forward_sizes: what a shard's forward is computed from
    (EmbeddingShardingPerfEvaluator, "_get_embedding_lookup_size"): ("self", "ctx", "use_min_dim"),
    (EmbeddingShardingPerfEvaluator, "_default_fwd_comp"): ("self", "ctx", "config"),
    (EmbeddingShardingPerfEvaluator, "_get_device_bw"): ("self", "ctx", "config"),
}

# Each private attribute used here, by the class whose instances hold it
# (set when it is built).
PRIVATE_ATTRIBUTES: dict[type, tuple[str, ...]] = {
    EmbeddingEnumerator: (
        "_compute_device",
        "_world_size",
        "_local_world_size",
        "_batch_size",
        "_device_memory_sizes",
        "_constraints",
        "_use_exact_enumerate_order",
        "_estimators",
        "_sharder_map",
        "_last_stored_module",
        "_last_stored_sharders",
        *(("_sharder_data_map",) if SHARDER_DATA else ()),
    ),
    EmbeddingPerfEstimator: ("_config",),
    HardwarePerfConfig: ("_bwd_compute_multiplier",),
    EmbeddingShardingPlanner: (
        "_enumerator",
        "_proposers",
        "_storage_reservation",
        "_num_proposals",
        "_best_plan",
    ),
    ShardedEmbeddingCollection: (
        "_features_to_permute_indices",
        "_local_embedding_dim",
        "_lookups",
        "_input_dists",
        "_sharding_type_to_sharding",
        "_env",
    ),
    ShardedEmbeddingBagCollection: (
        "_lookups",
        "_input_dists",
        "_output_dists",
        "_embedding_shardings",
        "_env",
    ),
    RwSparseFeaturesDist: ("_dist", "_has_feature_processor", "_need_pos"),
    KJTAllToAllSplitsAwaitable: ("_splits_awaitable",),
}

# A ShardingOption's attributes that torchrec's deep copy of an option shares
# (the module and the tensor) instead of copying.
OPTION_SHARED_ATTRIBUTES = ("_tensor", "_module")


def enumerator_missing(functions: dict[tuple[Any, str], tuple[str, ...]] | None = None) -> list[str]:
    """What embnb's enumerator needs of this torchrec and does not find: each private function of
    torchrec's enumerator it calls (`functions`, default those of PRIVATE_FUNCTIONS) missing or taking
    other parameters, and ShardingOption fields it does not fill. Empty where it can run."""
    if functions is None:
        functions = {
            k: v for k, v in PRIVATE_FUNCTIONS.items() if k[0] in (torchrec_enumerators, EmbeddingEnumerator)
        }
    missing = []
    for (owner, name), used in functions.items():
        where = f"{getattr(owner, '__name__', owner)}.{name}"
        function = getattr(owner, name, None)
        if function is None:
            missing.append(f"{where} (gone)")
            continue
        taken = tuple(inspect.signature(function).parameters)[: len(used)]
        if taken != used:
            missing.append(f"{where}{used} (it takes {taken})")
    fields = set(inspect.signature(ShardingOption.__init__).parameters) - {"self", *OPTION_FIELDS}
    if fields:
        missing.append(f"ShardingOption fields {sorted(fields)} (not filled by embnb's enumerator)")
    return missing


# --- EmbeddingEnumerator's helpers and state -------------------------------


class ParamConstraints(NamedTuple):
    """A table's constraints as torchrec's enumerator reads them (the tuple of
    its `_extract_constraints_for_param`, in its order)."""

    input_lengths: list[float]
    col_wise_shard_dim: int | None
    cache_params: Any
    enforce_hbm: bool | None
    stochastic_rounding: bool | None
    bounds_check_mode: Any
    feature_names: list[str] | None
    output_dtype: Any
    device_group: str | None
    key_value_params: Any


def param_constraints(constraints: dict[str, ParameterConstraints] | None, name: str) -> ParamConstraints:
    """torchrec's `_extract_constraints_for_param(constraints, name)`, by field name."""
    return ParamConstraints(*torchrec_enumerators._extract_constraints_for_param(constraints, name))


def tower_index(name: str, child: nn.Module) -> int:
    """torchrec's `_get_tower_index`: the tower of an EmbeddingTowerCollection holding table `name`."""
    return torchrec_enumerators._get_tower_index(name, child)


class EnumeratorSettings(NamedTuple):
    """What an EmbeddingEnumerator was built with (its private fields)."""

    compute_device: str
    world_size: int
    local_world_size: int
    batch_size: int
    device_memory_sizes: list[int] | None
    constraints: dict[str, ParameterConstraints] | None
    exact_order: bool  # use_exact_enumerate_order


def enumerator_settings(enumerator: EmbeddingEnumerator) -> EnumeratorSettings:
    return EnumeratorSettings(
        enumerator._compute_device,
        enumerator._world_size,
        enumerator._local_world_size,
        enumerator._batch_size,
        enumerator._device_memory_sizes,
        enumerator._constraints,
        enumerator._use_exact_enumerate_order,
    )


def estimators_of(enumerator: EmbeddingEnumerator) -> list[ShardEstimator]:
    """The enumerator's estimators, in the order populate_estimates runs them."""
    return enumerator._estimators


def set_sharders(enumerator: EmbeddingEnumerator, sharders: list) -> dict[str, Any]:
    """What torchrec's enumerate sets first: the sharders by module type name
    (and on 1.7+ their SharderData); returns the sharders by name."""
    sharder_map = {sharder_name(sharder.module_type): sharder for sharder in sharders}
    enumerator._sharder_map = sharder_map
    if SHARDER_DATA:
        enumerator._sharder_data_map = torchrec_enumerators.build_sharder_data_map(sharder_map)
    return sharder_map


def estimator_sharders(enumerator: EmbeddingEnumerator) -> Any:
    """What torchrec's populate_estimates hands its estimators for the last sharders set."""
    return enumerator._sharder_data_map if SHARDER_DATA else enumerator._sharder_map


def sharders_for_estimators(sharders: list) -> Any:
    """What torchrec's estimators take for `sharders`: their SharderData by name on 1.7+, the sharders
    by name on 1.6."""
    sharder_map = {sharder_name(sharder.module_type): sharder for sharder in sharders}
    return torchrec_enumerators.build_sharder_data_map(sharder_map) if SHARDER_DATA else sharder_map


def is_last_stored(enumerator: EmbeddingEnumerator, module: nn.Module, sharders: list) -> bool:
    """torchrec's cache test: the same module and sharders as the last enumerate."""
    return enumerator._last_stored_module == module and enumerator._last_stored_sharders == sharders


def store_last(enumerator: EmbeddingEnumerator, module: nn.Module, sharders: list) -> None:
    enumerator._last_stored_module = module
    enumerator._last_stored_sharders = sharders


def num_buckets(enumerator: EmbeddingEnumerator, name: str, child: nn.Module) -> int | None:
    return enumerator._get_num_buckets(name, child)


def stash_weights(enumerator: EmbeddingEnumerator, name: str, child: nn.Module) -> bool:
    """torchrec 1.9's `_get_stash_weights`: table `name`'s stash_weights flag in `child`'s configs."""
    return enumerator._get_stash_weights(name, child)


def filter_sharding_types(
    enumerator: EmbeddingEnumerator, name: str, sharding_types: list[str], sharder_key: str
) -> list[str]:
    return enumerator._filter_sharding_types(name, sharding_types, sharder_key)


def filter_compute_kernels(
    enumerator: EmbeddingEnumerator, name: str, kernels: list[str], sharding_type: str
) -> list[str]:
    return enumerator._filter_compute_kernels(name, kernels, sharding_type)


# --- the perf estimator ------------------------------------------------------


def set_perf_config(estimator: EmbeddingPerfEstimator, config: Any) -> None:
    """Make `config` the one the estimator reads (it has a read-only `config` property)."""
    estimator._config = config


class ForwardSizes(NamedTuple):
    """What torchrec's perf estimator computes a shard's forward from."""

    forward_s: float  # the forward by torchrec's own coefficient formula
    lookup_bytes: float  # the shard's embedding lookup bytes (TABLE_WISE: at least 32 columns)
    ids: float  # the ids the shard looks up in a batch
    penalty: float  # the block usage penalty (1 where the evaluator uses none)
    device_bw: float  # bytes per second


def forward_sizes(ctx: Any, config: HardwarePerfConfig) -> ForwardSizes:
    """A shard's `ForwardSizes` (`ctx`: its ShardPerfContext), each as torchrec's evaluator for the
    sharding type computes it."""
    from torchrec.distributed.planner.estimator.estimator import (
        compute_block_usage_penalty,
        get_embedding_perf_sharding_evaluator,
    )

    evaluator = get_embedding_perf_sharding_evaluator(ctx.sharding_type, ctx.is_inference)
    min_dim = evaluator.use_min_dim_for_lookup(config)
    lookup = evaluator._get_embedding_lookup_size(ctx=ctx, use_min_dim=min_dim)
    row_bytes = ctx.emb_dim * ctx.table_data_type_size
    ids = evaluator._get_embedding_lookup_size(ctx=ctx, use_min_dim=False) / row_bytes if row_bytes else 0.0
    penalty = compute_block_usage_penalty(ctx.emb_dim) if evaluator.use_block_usage_penalty(config) else 1.0
    return ForwardSizes(
        evaluator._default_fwd_comp(ctx, config), lookup, ids, penalty, evaluator._get_device_bw(ctx, config)
    )


def set_bwd_compute_multiplier(config: HardwarePerfConfig, multiplier: float) -> None:
    """Make `config`'s backward compute `multiplier` x its forward (where it gives no backward
    coefficients) whatever the topology's bwd_compute_multiplier."""
    config._bwd_compute_multiplier = multiplier


# --- EmbeddingShardingPlanner's parts ---------------------------------------


def planner_enumerator(planner: EmbeddingShardingPlanner) -> Any:
    return planner._enumerator


def planner_proposers(planner: EmbeddingShardingPlanner) -> list:
    return planner._proposers


def planner_storage_reservation(planner: EmbeddingShardingPlanner) -> Any:
    return planner._storage_reservation


def num_proposals(planner: EmbeddingShardingPlanner) -> int:
    """How many proposals the last `plan` partitioned and rated."""
    return planner._num_proposals


def best_plan(planner: EmbeddingShardingPlanner) -> list[ShardingOption] | None:
    """The best plan of the last `plan` (None: none fit)."""
    return planner._best_plan


# --- sharded modules ---------------------------------------------------------


def features_to_permute_indices(sharded: ShardedEmbeddingCollection) -> dict[str, list[int]]:
    """The column-wise permute indices the sharded EC computed, per output name."""
    return sharded._features_to_permute_indices


def set_features_to_permute_indices(sharded: ShardedEmbeddingCollection, indices: dict) -> None:
    sharded._features_to_permute_indices = indices


def generate_permute_indices(configs: list, plan: dict) -> dict[str, list[int]]:
    """torchrec's own column-wise permute code (ShardedEmbeddingCollection's
    `_generate_permute_indices_per_feature`) on table configs and their
    ParameterShardings by table name, without building a sharded module."""
    holder = SimpleNamespace(_features_to_permute_indices={})
    ShardedEmbeddingCollection._generate_permute_indices_per_feature(holder, configs, plan)
    return holder._features_to_permute_indices


def local_embedding_dim(sharded: ShardedEmbeddingCollection) -> int:
    """The one width the sharded EC gives every rank's column-wise lookups."""
    return sharded._local_embedding_dim


def lookups(sharded: nn.Module) -> list[nn.Module]:
    """A sharded EC's or EBC's lookups (a plain list in torchrec 1.8.0, not submodules)."""
    return sharded._lookups


def create_input_dist(
    sharded: nn.Module, below: type, input_feature_names: list[str], *args: Any, **kwargs: Any
) -> None:
    """torchrec's `_create_input_dist` of `sharded`, as the class after `below` in its MRO defines
    it (the call an override makes to its base)."""
    super(below, sharded)._create_input_dist(input_feature_names, *args, **kwargs)


def input_dists(sharded: nn.Module) -> nn.ModuleList:
    """A sharded EC's or EBC's input distributions, one per sharding type (built on the first input)."""
    return sharded._input_dists


def shardings(sharded: nn.Module) -> list:
    """A sharded EC's or EBC's shardings, in the order of its input distributions."""
    if isinstance(sharded, ShardedEmbeddingBagCollection):
        return list(sharded._embedding_shardings)
    return list(sharded._sharding_type_to_sharding.values())


def output_dists(sharded: ShardedEmbeddingBagCollection) -> list[nn.Module]:
    """A sharded EBC's output distributions, one per sharding (a plain list, built with the module)."""
    return sharded._output_dists


def sharding_env(sharded: nn.Module) -> Any:
    """The ShardingEnv a sharded EC or EBC was built with."""
    return sharded._env


def row_wise_dist_parts(dist: RwSparseFeaturesDist) -> tuple[nn.Module, bool]:
    """(its KJT all-to-all, whether it sends positions: a feature processor's)."""
    return dist._dist, dist._has_feature_processor or dist._need_pos


def received_splits(awaitable: KJTAllToAllSplitsAwaitable) -> list[list[int]]:
    """What the splits all-to-all of a KJT all-to-all (world size > 1) delivered: one row per row
    sent, each with one entry per source rank. Waits for it; torchrec's own wait reads it again."""
    return awaitable._splits_awaitable.wait()

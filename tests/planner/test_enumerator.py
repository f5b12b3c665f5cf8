"""embnb.planner.enumerator against torchrec's EmbeddingEnumerator: the same
options in the same order, each option's fields and each shard's size, offset,
storage and perf (every field, floats to the bit) alike.

Both enumerate in the same process: torchrec orders a table's compute kernels
through a set when it has constraints, so the order follows the hash seed."""

import copy
import dataclasses
import logging
import math
import re

import pytest
import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig
from torchrec.distributed.planner.estimator.estimator import EmbeddingPerfEstimator
from torchrec.distributed.planner.estimator.types import (
    EstimatorPerfCoefficients,
    PerfCoefficient,
    PerfCoefficientConfig,
)
from torchrec.distributed.planner.shard_estimators import EmbeddingOffloadStats, EmbeddingStorageEstimator
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import BoundsCheckMode, CacheParams, ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb import planner
from embnb.planner.enumerator import DistinctShardEnumerator, _context_keys
from embnb.planner.models import enumerate_options, fused_table_gb, make_model

logging.getLogger("torchrec").setLevel(logging.ERROR)

BATCH_SIZE = 512

# What an option holds besides its shards, compared one by one.
OPTION_FIELDS = (
    "name",
    "fqn",
    "path",
    "sharding_type",
    "compute_kernel",
    "partition_by",
    "input_lengths",
    "batch_size",
    "num_inputs",
    "num_poolings",
    "cache_load_factor",
    "enforce_hbm",
    "stochastic_rounding",
    "bounds_check_mode",
    "dependency",
    "is_pooled",
    "is_weighted",
    "feature_names",
    "output_dtype",
    "key_value_params",
    "module_type_key",
    "has_feature_processor",
)
PERF_FIELDS = (
    "fwd_compute",
    "fwd_comms",
    "bwd_compute",
    "bwd_comms",
    "input_dist_comms",
    "prefetch_compute",
    "total",
)


def bits(value):
    """Floats by their bits (so -0.0 differs from 0.0 and NaN equals NaN), other values as they are."""
    return value.hex() if isinstance(value, float) else value


def cache_record(cache_params) -> tuple | None:
    """CacheParams field by field; its statistics (copied per option, no __eq__) by what they hold."""
    if cache_params is None:
        return None
    record = []
    for field in dataclasses.fields(cache_params):
        value = getattr(cache_params, field.name)
        if isinstance(value, EmbeddingOffloadStats):
            value = (value.cacheability, value.expected_lookups, value.height, value.hist.tolist())
        record.append((field.name, value))
    return tuple(record)


def shard_record(shard) -> tuple:
    storage = None if shard.storage is None else (shard.storage.hbm, shard.storage.ddr, shard.storage.ssd)
    perf = None if shard.perf is None else tuple(bits(getattr(shard.perf, f)) for f in PERF_FIELDS)
    return (list(shard.size), list(shard.offset), storage, perf, shard.rank)


def assert_same_options(expected, actual, same_module=True):
    """`same_module`: both enumerated one module (else: two alike modules)."""
    assert len(actual) == len(expected)
    for i, (want, got) in enumerate(zip(expected, actual)):
        where = f"option {i} ({want.name}, {want.sharding_type}, {want.compute_kernel})"
        for field in OPTION_FIELDS:
            assert getattr(got, field) == getattr(want, field), f"{where}: {field}"
        assert cache_record(got.cache_params) == cache_record(want.cache_params), where
        tensor = (got.tensor.shape, got.tensor.dtype, got.tensor.device)
        assert tensor == (want.tensor.shape, want.tensor.dtype, want.tensor.device), where
        assert got.module[0] == want.module[0], where
        assert (got.tensor is want.tensor and got.module[1] is want.module[1]) == same_module, where
        assert sorted(vars(got)) == sorted(vars(want)), f"{where}: attributes"
        assert len(got.shards) == len(want.shards), where
        for s, (want_shard, got_shard) in enumerate(zip(want.shards, got.shards)):
            assert shard_record(got_shard) == shard_record(want_shard), f"{where}, shard {s}"
            assert got_shard.perf is not want_shard.perf
        # torchrec gives each shard a Perf of its own; so must embnb (the planner mutates shards)
        assert len({id(shard.perf) for shard in got.shards}) == len(got.shards), where


def enumerate_both(tables, topology, constraints, estimators=lambda: None):
    """torchrec's options and embnb's; `estimators` makes each enumerator's own (None: the defaults)."""
    module = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    sharders = [EmbeddingBagCollectionSharder()]
    expected = EmbeddingEnumerator(topology, BATCH_SIZE, constraints, estimators()).enumerate(
        module, sharders
    )
    actual = DistinctShardEnumerator(topology, BATCH_SIZE, constraints, estimators()).enumerate(
        module, sharders
    )
    return expected, actual


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("world_size", "local_world_size", "device"),
    [(8, None, "cuda"), (64, None, "cuda"), (64, 8, "cuda"), (8, None, "cpu"), (64, 16, "cpu")],
)
def test_same_options_as_torchrec_on_bench_models(seed, world_size, local_world_size, device):
    model = make_model(12, seed)
    hbm_cap_gb = fused_table_gb(model.tables) / world_size * 0.5
    topology = planner.make_topology(
        world_size, device, hbm_cap_gb=hbm_cap_gb, local_world_size=local_world_size
    )
    expected, actual = enumerate_both(model.tables, topology, model.constraints)
    assert sum(len(o.shards) for o in expected) > len(expected)  # shards alike within options
    assert_same_options(expected, actual)


def varied_constraints() -> tuple[list[EmbeddingBagConfig], dict[str, ParameterConstraints]]:
    """Tables and constraints beyond make_model's: several features, poolings,
    batch sizes, caches with statistics, kernels and sharding types named."""
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}",
            feature_names=[f"f{i}_{j}" for j in range(1 + i % 3)],
            num_embeddings=1000 + 7919 * i**3,
            embedding_dim=[8, 24, 64, 96, 200, 256][i % 6],
        )
        for i in range(10)
    ]
    stats = EmbeddingOffloadStats(
        cacheability=0.4, expected_lookups=20_000, mrc_hist_counts=torch.tensor([9.0, 4, 2, 1]), height=8000
    )
    uvm = [EmbeddingComputeKernel.FUSED_UVM_CACHING.value, EmbeddingComputeKernel.FUSED.value]
    constraints = {
        "t0": ParameterConstraints(pooling_factors=[3.5], num_poolings=[2.0], batch_sizes=[256]),
        "t1": ParameterConstraints(
            pooling_factors=[1.0, 40.0], num_poolings=[1.0, 3.0], is_weighted=True, stochastic_rounding=True
        ),
        "t2": ParameterConstraints(
            pooling_factors=[0.3, 7.0, 12.0],
            compute_kernels=uvm,
            cache_params=CacheParams(load_factor=0.25, stats=stats),
        ),
        "t3": ParameterConstraints(compute_kernels=uvm, cache_params=CacheParams(load_factor=0.05)),
        "t4": ParameterConstraints(
            sharding_types=[ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value],
            min_partition=32,
            enforce_hbm=True,
        ),
        "t5": ParameterConstraints(
            sharding_types=[ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value, "table_wise"],
            bounds_check_mode=BoundsCheckMode.WARNING,
            pooling_factors=[math.pi],
        ),
        "t6": ParameterConstraints(feature_names=["f6_0"], pooling_factors=[0.0]),
        # t7-t9: no constraints (torchrec's defaults, its kernel order without a set)
    }
    return tables, constraints


@pytest.mark.parametrize(
    ("world_size", "local_world_size", "device"), [(8, None, "cuda"), (64, 8, "cuda"), (16, 4, "cpu")]
)
def test_same_options_as_torchrec_with_other_constraints(world_size, local_world_size, device):
    tables, constraints = varied_constraints()
    topology = planner.make_topology(
        world_size, device, hbm_cap_gb=4, ddr_cap_gb=64, local_world_size=local_world_size
    )
    expected, actual = enumerate_both(tables, topology, constraints)
    kernels = {o.compute_kernel for o in expected}
    assert EmbeddingComputeKernel.FUSED_UVM_CACHING.value in kernels or device == "cpu"
    assert_same_options(expected, actual)


class RowCostConfig(EmbeddingPerfEstimatorConfig):
    """torchrec's default estimator config, with a cost per row for (table-)row-wise
    and data-parallel shards: shards of one option then differ in perf (with the
    default config they never do: column-wise shards are all alike, and a shard's
    row count does not enter its perf)."""

    coefficients = PerfCoefficientConfig(
        table_wise=EmbeddingPerfEstimatorConfig.coefficients.table_wise,
        column_wise=EmbeddingPerfEstimatorConfig.coefficients.column_wise,
        row_wise=EstimatorPerfCoefficients(fwd=PerfCoefficient(hash_size_multiplier=3.0)),
        table_row_wise=EstimatorPerfCoefficients(fwd=PerfCoefficient(hash_size_multiplier=0.7)),
        data_parallel=EstimatorPerfCoefficients(fwd=PerfCoefficient(hash_size_multiplier=1e-3)),
    )


@pytest.mark.parametrize(("world_size", "local_world_size"), [(8, None), (64, 8)])
def test_same_options_as_torchrec_when_shards_of_an_option_differ(world_size, local_world_size):
    tables, constraints = varied_constraints()
    topology = planner.make_topology(world_size, "cuda", hbm_cap_gb=4, local_world_size=local_world_size)

    def estimators():
        return [
            EmbeddingPerfEstimator(topology, constraints, config=RowCostConfig()),
            EmbeddingStorageEstimator(topology, constraints),
        ]

    expected, actual = enumerate_both(tables, topology, constraints, estimators)
    differing = [o for o in expected if len({shard_record(s)[3] for s in o.shards}) > 1]
    assert len(differing) >= 10  # the case this test is for
    assert_same_options(expected, actual)


def test_populate_estimates_alone_matches_torchrec():
    """torchrec's scale-up proposer calls populate_estimates on options of its own."""
    tables, constraints = varied_constraints()
    topology = planner.make_topology(8, "cuda", hbm_cap_gb=4)
    expected, _ = enumerate_both(tables, topology, constraints)
    ours = DistinctShardEnumerator(topology, BATCH_SIZE, constraints)
    ours.enumerate(
        EmbeddingBagCollection(tables=tables, device=torch.device("meta")), [EmbeddingBagCollectionSharder()]
    )
    options = copy.deepcopy(expected)
    for option in options:
        for shard in option.shards:
            shard.perf = shard.storage = None
    ours.populate_estimates(options)
    assert_same_options(expected, options)


def test_enumerate_options_and_create_planner_take_either_enumerator():
    model = make_model(8, seed=3)
    topology = planner.make_topology(8, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 8)
    by_name = {
        name: enumerate_options(model.tables, topology, BATCH_SIZE, model.constraints, enumerator=name)
        for name in ("torchrec", "embnb")
    }
    assert_same_options(by_name["torchrec"].options, by_name["embnb"].options, same_module=False)
    plans = {}
    for name in ("torchrec", "embnb"):
        module = EmbeddingBagCollection(tables=model.tables, device=torch.device("meta"))
        chosen = planner.create_planner(topology, BATCH_SIZE, constraints=model.constraints, enumerator=name)
        assert isinstance(chosen._enumerator, DistinctShardEnumerator) == (name == "embnb")
        plans[name] = chosen.plan(module, [EmbeddingBagCollectionSharder()])
    assert plans["embnb"] == plans["torchrec"]
    default = planner.create_planner(topology, BATCH_SIZE, constraints=model.constraints)
    assert isinstance(default._enumerator, DistinctShardEnumerator)  # tested equal on both stacks


@pytest.mark.parametrize("bad", ["fast", "EMBNB", None, 1])
def test_bad_enumerator_is_refused(bad):
    model = make_model(2)
    topology = planner.make_topology(2, "cuda", hbm_cap_gb=1)
    message = re.escape(f"enumerator {bad!r} is not one of 'torchrec', 'embnb'")
    with pytest.raises(ValueError, match=message):
        enumerate_options(model.tables, topology, BATCH_SIZE, enumerator=bad)
    with pytest.raises(ValueError, match=message):
        planner.create_planner(topology, BATCH_SIZE, enumerator=bad)


def test_context_keys_tell_apart_what_compares_equal():
    """Equal keys must mean the same input: 1, 1.0 and True compare equal, and so do 0.0 and -0.0."""

    class Context:
        def __init__(self, **fields):
            self.__dict__.update(fields)

    shared = [1.0, 2.0]
    contexts = [
        Context(a=1, b=shared, c=0.0),
        Context(a=1, b=shared, c=0.0),
        Context(a=1.0, b=shared, c=0.0),
        Context(a=True, b=shared, c=0.0),
        Context(a=1, b=shared, c=-0.0),
        Context(a=1, b=[1.0, 2.0], c=0.0),
        Context(a=1, b=[1, 2.0], c=0.0),
        Context(a=1, b=shared, c=0.0, d=None),
    ]
    keys = _context_keys(contexts)
    assert keys[0] == keys[1]
    assert len(set(keys[1:])) == len(keys) - 1

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
import warnings

import numpy as np
import pytest
import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator.annotations import forward_compute
from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig
from torchrec.distributed.planner.estimator.estimator import EmbeddingPerfEstimator
from torchrec.distributed.planner.estimator.types import (
    EstimatorPerfCoefficients,
    PerfCoefficient,
    PerfCoefficientConfig,
)
from torchrec.distributed.planner.shard_estimators import EmbeddingOffloadStats, EmbeddingStorageEstimator
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.sharding_plan import calculate_shard_sizes_and_offsets
from torchrec.distributed.types import BoundsCheckMode, CacheParams, ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb import _torchrec_private as private
from embnb import planner
from embnb._torchrec_private import planner_enumerator
from embnb.bench.enumerators import make_mixed_model
from embnb.lab.planner.models import enumerate_options, fused_table_gb, make_model
from embnb.planner.enumerator import (
    ENUMERATORS,
    DistinctShardEnumerator,
    default_enumerator,
    same_options,
)
from embnb.planner.layout import LAZY_FIELDS, Layout, LayoutOption

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
        for field in set(vars(want)) - {"shards", "cache_params", *private.OPTION_SHARED_ATTRIBUTES}:
            assert getattr(got, field) == getattr(want, field), f"{where}: {field}"  # any field of its own
        assert cache_record(got.cache_params) == cache_record(want.cache_params), where
        tensor = (got.tensor.shape, got.tensor.dtype, got.tensor.device)
        assert tensor == (want.tensor.shape, want.tensor.dtype, want.tensor.device), where
        assert got.module[0] == want.module[0], where
        assert (got.tensor is want.tensor and got.module[1] is want.module[1]) == same_module, where
        assert torchrec_attributes(got) == sorted(vars(want)), f"{where}: attributes"
        assert len(got.shards) == len(want.shards), where
        for s, (want_shard, got_shard) in enumerate(zip(want.shards, got.shards)):
            assert shard_record(got_shard) == shard_record(want_shard), f"{where}, shard {s}"
            assert got_shard.perf is not want_shard.perf and got_shard.storage is not want_shard.storage
        assert_shared_by_size_only(got, where)


def torchrec_attributes(option) -> list[str]:
    """An option's attribute names as torchrec's would have them (a LayoutOption's shards: `shards`)."""
    names = set(vars(option))
    return sorted(names - LAZY_FIELDS | {"shards"} if isinstance(option, LayoutOption) else names)


def assert_shared_by_size_only(option, where=""):
    """Shards share a Perf or Storage object only with shards of their own size in their option."""
    for kind in ("perf", "storage"):
        sizes_by_object: dict[int, set] = {}
        for shard in option.shards:
            sizes_by_object.setdefault(id(getattr(shard, kind)), set()).add(tuple(shard.size))
        assert all(len(sizes) == 1 for sizes in sizes_by_object.values()), f"{where}: {kind}"


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
        assert isinstance(planner_enumerator(chosen), DistinctShardEnumerator) == (name == "embnb")
        plans[name] = chosen.plan(module, [EmbeddingBagCollectionSharder()])
    assert plans["embnb"] == plans["torchrec"]
    default = planner.create_planner(topology, BATCH_SIZE, constraints=model.constraints)
    assert isinstance(planner_enumerator(default), DistinctShardEnumerator)  # tested equal on both stacks


@pytest.mark.parametrize("bad", ["fast", "EMBNB", "", 1])
def test_bad_enumerator_is_refused(bad):
    model = make_model(2)
    topology = planner.make_topology(2, "cuda", hbm_cap_gb=1)
    message = re.escape(f"enumerator {bad!r} is not one of 'torchrec', 'embnb'")
    with pytest.raises(ValueError, match=message):
        enumerate_options(model.tables, topology, BATCH_SIZE, enumerator=bad)
    with pytest.raises(ValueError, match=message):
        planner.create_planner(topology, BATCH_SIZE, enumerator=bad)


@pytest.mark.parametrize(("world_size", "local_world_size", "device"), [(8, None, "cuda"), (16, 4, "cpu")])
def test_same_options_on_shared_multi_feature_tables_and_sequence_tables(
    world_size, local_world_size, device
):
    model = make_mixed_model(8, seed=0, uvm_caching=device == "cuda")  # CPUs have no UVM
    topology = planner.make_topology(
        world_size, device, hbm_cap_gb=2, ddr_cap_gb=32, local_world_size=local_world_size
    )
    expected = EmbeddingEnumerator(topology, BATCH_SIZE, model.constraints).enumerate(
        model.module, model.sharders
    )
    actual = DistinctShardEnumerator(topology, BATCH_SIZE, model.constraints).enumerate(
        model.module, model.sharders
    )
    assert {o.is_pooled for o in expected} == {True, False}  # both kinds of module were walked
    assert {len(o.input_lengths) for o in expected} >= {1, 2, 3, 4}  # tables read by several features
    assert {len(set(o.input_lengths)) for o in expected} >= {2}  # each feature its own pooling factor
    assert any(o.cache_params and o.cache_params.stats for o in expected) == (device == "cuda")
    assert_same_options(expected, actual)


def test_repeated_enumerate_and_the_stored_search_space_match_torchrecs_cache():
    """torchrec hands out a deep copy of its first enumeration for the same module
    and sharders: what the caller then changed in the options it got does not show."""
    tables, _ = varied_constraints()
    topology = planner.make_topology(8, "cuda", hbm_cap_gb=4)
    module = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    sharders = [EmbeddingBagCollectionSharder()]
    runs = {}
    for kind in (EmbeddingEnumerator, DistinctShardEnumerator):
        enumerator = kind(topology, BATCH_SIZE, varied_constraints()[1])
        first = enumerator.enumerate(module, sharders)
        for option in first:  # what a planner and a careless caller do to the options
            option.enforce_hbm = "changed"
            if option.cache_params is not None:  # a deep copy of the constraint's, per table
                option.cache_params.load_factor = 0.99
            for rank, shard in enumerate(option.shards):
                shard.rank = rank
                shard.perf.fwd_compute = -1.0
                shard.storage.hbm = -1
                shard.size[0] += 1
        again = enumerator.enumerate(module, sharders)
        assert not {id(o) for o in again} & {id(o) for o in first}
        runs[kind] = (again, enumerator.last_stored_search_space)
        other = EmbeddingBagCollection(tables=tables[:3], device=torch.device("meta"))
        assert {o.module[1] for o in enumerator.enumerate(other, sharders)} == {other}  # not the cache
    (theirs, theirs_stored), (ours, ours_stored) = runs.values()
    assert all(shard.rank is None for option in ours for shard in option.shards)
    assert_same_options(theirs, ours)
    assert_same_options(theirs_stored, ours_stored)


def test_planners_hash_their_context_alike_with_either_enumerator():
    model = make_model(10, seed=4)
    topology = planner.make_topology(8, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 8)
    hashes = []
    for name in ENUMERATORS:
        chosen = planner.create_planner(topology, BATCH_SIZE, constraints=model.constraints, enumerator=name)
        chosen.plan(
            EmbeddingBagCollection(tables=model.tables, device=torch.device("meta")),
            [EmbeddingBagCollectionSharder()],
        )
        hashes.append(chosen.hash_planner_context_inputs())
    assert hashes[0] == hashes[1]


class UnevenPenaltyConfig(EmbeddingPerfEstimatorConfig):
    """Post-processes perfs across an option's shards (the largest shard pays
    for the unevenness): estimates per distinct shard would not see that."""

    def post_process_perfs(
        self, shard_perfs, shard_sizes, sharding_type, uneven_sharding_perf_multiplier=1.0
    ):
        largest = max(range(len(shard_sizes)), key=lambda i: shard_sizes[i][0], default=None)
        if largest is not None and len({tuple(size) for size in shard_sizes}) > 1:
            shard_perfs[largest] = dataclasses.replace(
                shard_perfs[largest], fwd_compute=shard_perfs[largest].fwd_compute * 1.5
            )
        return shard_perfs


class RowWiseFormulaConfig(EmbeddingPerfEstimatorConfig):
    """A custom forward formula for row-wise shards, found by torchrec through its annotation."""

    @forward_compute(sharding_type="row_wise")
    def row_wise_forward(self, ctx):
        return 1e-6 * ctx.hash_size + 1e-3 * ctx.emb_dim


class OwnStorageEstimator(EmbeddingStorageEstimator):
    """torchrec's storage estimator under another type: not one embnb estimates per distinct shard."""


@pytest.mark.parametrize(
    "make_estimators",
    [
        lambda t, c: [
            EmbeddingPerfEstimator(t, c, config=UnevenPenaltyConfig()),
            EmbeddingStorageEstimator(t, c),
        ],
        lambda t, c: [EmbeddingPerfEstimator(t, c), OwnStorageEstimator(t, c)],
        lambda t, c: [
            EmbeddingPerfEstimator(t, c, config=RowWiseFormulaConfig()),
            EmbeddingStorageEstimator(t, c),
        ],
    ],
    ids=["cross-shard post-processing", "another estimator type", "annotated formula"],
)
def test_estimators_beyond_torchrecs_defaults_give_torchrecs_results(make_estimators):
    tables, constraints = varied_constraints()
    topology = planner.make_topology(16, "cuda", hbm_cap_gb=4, local_world_size=4)
    expected, actual = enumerate_both(
        tables, topology, constraints, lambda: make_estimators(topology, constraints)
    )
    assert_same_options(expected, actual)
    default, _ = enumerate_both(tables, topology, constraints)
    changed = [
        a for a, b in zip(expected, default) if shard_record(a.shards[0])[3] != shard_record(b.shards[0])[3]
    ]
    assert (
        changed or make_estimators(topology, constraints)[1].__class__ is OwnStorageEstimator
    )  # the config bit


def test_the_default_enumerator_is_torchrecs_with_one_warning_where_a_piece_is_missing(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing missing here: no warning
        assert default_enumerator() == "embnb"
    model = make_model(2)
    topology = planner.make_topology(2, "cuda", hbm_cap_gb=1)
    assert isinstance(
        planner_enumerator(planner.create_planner(topology, BATCH_SIZE)), DistinctShardEnumerator
    )
    # a requirement this torchrec does not meet (embnb's list, not torchrec, is changed)
    monkeypatch.setitem(private.PRIVATE_FUNCTIONS, (EmbeddingEnumerator, "_gone_from_torchrec"), ("self",))
    with pytest.warns(UserWarning) as warned:
        chosen = planner.create_planner(topology, BATCH_SIZE, constraints=model.constraints)
        planner.create_planner(topology, BATCH_SIZE, constraints=model.constraints)
    assert type(planner_enumerator(chosen)) is EmbeddingEnumerator
    ours = [str(w.message) for w in warned if "embnb's enumerator needs" in str(w.message)]
    assert len(ours) == 1, ours  # once, however often it plans
    assert "EmbeddingEnumerator._gone_from_torchrec (gone)" in ours[0]
    assert "torchrec's EmbeddingEnumerator instead" in ours[0]


@pytest.mark.skipif(not private.STASH_WEIGHTS, reason="torchrec before 1.9 has no stash_weights")
def test_stash_weights_is_copied_as_torchrec_copies_it():
    tables, constraints = varied_constraints()
    tables = [dataclasses.replace(t, stash_weights=i % 2 == 0) for i, t in enumerate(tables)]
    topology = planner.make_topology(8, "cuda", hbm_cap_gb=fused_table_gb(tables) / 4, local_world_size=8)
    expected, actual = enumerate_both(tables, topology, constraints)
    assert {o.stash_weights for o in expected} == {True, False}
    assert_same_options(expected, actual)


def test_a_table_left_without_options_fails_as_in_torchrec():
    tables, _ = varied_constraints()
    constraints = {"t3": ParameterConstraints(compute_kernels=["fused_uvm_caching"])}  # no UVM on CPUs
    topology = planner.make_topology(4, "cpu", ddr_cap_gb=64)
    module = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    messages = []
    for kind in (EmbeddingEnumerator, DistinctShardEnumerator):
        with pytest.raises(RuntimeError, match="No available sharding type and compute kernel") as raised:
            kind(topology, BATCH_SIZE, constraints).enumerate(module, [EmbeddingBagCollectionSharder()])
        messages.append(str(raised.value))
    assert messages[0] == messages[1]


class UnknownRowWiseKernelSharder(EmbeddingBagCollectionSharder):
    """Offers a kernel torchrec's filter does not know for row-wise shards (so
    unconstrained tables get no row-wise option, with a warning each) and
    only two kernels for column-wise ones."""

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        if sharding_type == ShardingType.ROW_WISE.value:
            return ["not_a_kernel"]
        if sharding_type == ShardingType.COLUMN_WISE.value:
            return [EmbeddingComputeKernel.FUSED_UVM.value, EmbeddingComputeKernel.FUSED.value]
        return super().compute_kernels(sharding_type, compute_device_type)


def test_a_sharders_own_kernels_give_torchrecs_options_and_warnings(caplog):
    """Where the kernel filter leaves nothing, torchrec warns once per table
    and sharding type; embnb looks the filter up once per kernel list but
    warns as often."""
    tables, constraints = varied_constraints()
    topology = planner.make_topology(8, "cuda", hbm_cap_gb=4)
    module = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    enumerated, warned = {}, {}
    for kind in (EmbeddingEnumerator, DistinctShardEnumerator):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="torchrec.distributed.planner.enumerators"):
            enumerated[kind] = kind(topology, BATCH_SIZE, constraints).enumerate(
                module, [UnknownRowWiseKernelSharder()]
            )
        warned[kind] = [
            r.getMessage() for r in caplog.records if "No available compute kernels" in r.getMessage()
        ]
    assert_same_options(enumerated[EmbeddingEnumerator], enumerated[DistinctShardEnumerator])
    assert not any(o.sharding_type == "row_wise" for o in enumerated[EmbeddingEnumerator])
    asking_row_wise = [t.name for t in tables if t.name != "t4"]  # t4's constraints name other types
    assert len(warned[EmbeddingEnumerator]) >= len(asking_row_wise)
    assert warned[DistinctShardEnumerator] == warned[EmbeddingEnumerator]


def test_same_options_tells_options_apart_by_one_ulp_of_a_perf():
    """The check behind the benches' 'same options'."""
    tables, constraints = varied_constraints()
    expected, actual = enumerate_both(tables, planner.make_topology(8, "cuda", hbm_cap_gb=4), constraints)
    assert same_options(expected, actual)
    assert not same_options(expected, actual[:-1])
    changes = [
        lambda o: setattr(
            o.shards[-1].perf, "bwd_comms", math.nextafter(o.shards[-1].perf.bwd_comms, math.inf)
        ),
        lambda o: setattr(o.shards[0], "size", [o.shards[0].size[0] + 1, o.shards[0].size[1]]),
        lambda o: setattr(o.shards[0], "rank", 3),
        lambda o: setattr(o, "compute_kernel", "not_a_kernel"),
        lambda o: setattr(o, "input_lengths", [*o.input_lengths, 1.0]),
    ]
    for change in changes:
        changed = copy.deepcopy(actual)
        change(changed[len(changed) // 2])
        assert not same_options(expected, changed)


def test_a_layout_numbers_sizes_as_first_seen_and_makes_its_shards():
    """Layout.of against a loop over the shards; the shards it makes; a LayoutOption's deep copy
    shares the read-only layout and copies what torchrec's deep copy copies."""
    sizes = [[5, 8], [5, 8], [3, 8], [5, 8], [5, 4], [3, 8]]
    offsets = [[0, 0], [5, 0], [10, 0], [13, 0], [18, 0], [23, 4]]
    layout = Layout.of(sizes, offsets)
    first_seen: dict[tuple, int] = {}
    expected = [first_seen.setdefault(tuple(size), len(first_seen)) for size in sizes]
    assert layout.slot_of.tolist() == expected == [0, 0, 1, 0, 2, 1]
    assert layout.firsts.tolist() == [0, 2, 4] and len(layout) == 6
    # sizes of 2**31 rows and more, and of three dimensions, take another path to the same slots
    for other in ([[2**40, 8], [5, 8], [2**40, 8], [2**40, 9]], [[2, 8, 1], [5, 8, 1], [2, 8, 1]]):
        seen: dict[tuple, int] = {}
        numbered = [seen.setdefault(tuple(size), len(seen)) for size in other]
        odd = Layout.of(other, [[0] * len(other[0])] * len(other))
        assert odd.slot_of.tolist() == numbered and odd.table[:, 0].tolist() == other
    assert [(s.size, s.offset, s.rank) for s in layout.shards()] == [
        (a, b, None) for a, b in zip(sizes, offsets)
    ]
    assert [s.size for s in layout.distinct_shards()] == [[5, 8], [3, 8], [5, 4]]
    with pytest.raises(ValueError, match="read-only"):
        layout.table[0, 0, 0] = 1
    model = make_model(3, seed=0)
    topology = planner.make_topology(16, "cuda", hbm_cap_gb=fused_table_gb(model.tables), local_world_size=8)
    options = enumerate_options(model.tables, topology, 64, model.constraints, enumerator="embnb").options
    option = next(o for o in options if o.sharding_type == "row_wise")
    copied = copy.deepcopy(option)
    assert not option.made and not copied.made and copied.layout is option.layout
    assert (
        copied.estimates[0][0] == option.estimates[0][0]
        and copied.estimates[0][0] is not option.estimates[0][0]
    )
    option.shards[3].rank = 7  # made, then placed
    placed = copy.deepcopy(option)
    assert placed.made and placed.shards[3].rank == 7 and placed.shards[3] is not option.shards[3]
    assert [s.size for s in placed.shards] == [s.size for s in copied.shards]


def test_a_spread_layout_is_torchrecs_layout():
    """Layout.spread (numpy) against torchrec's calculate_shard_sizes_and_offsets read by Layout.of,
    on row counts below, at and above the ranks, divisible or not, up to 2**52; zero rows fail as in
    torchrec; other sharding types are left to torchrec."""
    rng = np.random.default_rng(0)
    cases = [(1, 1), (1, 8), (7, 8), (8, 8), (9, 8), (10, 4), (5, 4), (1023, 1024), (2**52 + 3, 1024)]
    cases += [
        (int(rows), int(world)) for rows, world in zip(rng.integers(1, 10**7, 40), rng.integers(1, 1100, 40))
    ]
    for rows, world_size in cases:
        param = torch.empty(rows, 24, device="meta")
        for sharding_type in ("row_wise", "data_parallel"):
            spread = Layout.spread(sharding_type, rows, 24, world_size)
            expected = Layout.of(*calculate_shard_sizes_and_offsets(param, world_size, 8, sharding_type))
            assert np.array_equal(spread.table, expected.table), (rows, world_size, sharding_type)
            assert spread.slot_of.tolist() == expected.slot_of.tolist()
            assert spread.firsts.tolist() == expected.firsts.tolist()
            assert not spread.table.flags.writeable
    for sharding_type in ("table_wise", "column_wise", "table_row_wise", "grid_shard"):
        assert Layout.spread(sharding_type, 10, 24, 8) is None
    with pytest.raises(ZeroDivisionError):
        calculate_shard_sizes_and_offsets(torch.empty(0, 24, device="meta"), 8, 8, "row_wise")
    with pytest.raises(ZeroDivisionError):
        Layout.spread("row_wise", 0, 24, 8)


@pytest.mark.parametrize("world_size", [4, 8])
def test_same_options_as_torchrec_with_virtual_tables_and_their_buckets(world_size):
    """Tables with `use_virtual_table` and `total_num_buckets` (torchrec sizes their row-wise shards
    by bucket): embnb reads each module's virtual tables once, torchrec per table."""
    model = make_model(6, seed=3)
    tables = []
    for i, table in enumerate(model.tables):
        buckets = world_size * i + 2  # uneven over the ranks; torchrec needs the rows divisible by them
        rows = table.num_embeddings // buckets * buckets
        virtual = {"use_virtual_table": True, "total_num_buckets": buckets, "num_embeddings": rows}
        tables.append(dataclasses.replace(table, **virtual) if i % 2 else table)
    topology = planner.make_topology(world_size, "cuda", hbm_cap_gb=4)
    expected, actual = enumerate_both(tables, topology, model.constraints)
    assert_same_options(expected, actual)
    bucketed = [
        o for o in expected if o.sharding_type == "row_wise" and o.name in {t.name for t in tables[1::2]}
    ]
    plain = [o for o in expected if o.sharding_type == "row_wise" and o.name == tables[0].name]
    assert bucketed and plain  # both kinds were compared
    # the buckets moved the row-wise shards' sizes off torchrec's plain split (ceil(rows / W) each)
    assert any(
        [s.size[0] for s in o.shards] != _plain_row_split(o.tensor.shape[0], world_size) for o in bucketed
    )


def _plain_row_split(rows: int, world_size: int) -> list[int]:
    block = -(-rows // world_size)
    return [max(0, min(block, rows - r * block)) for r in range(world_size)]

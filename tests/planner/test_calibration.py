"""embnb.planner.calibration: torchrec's perf config fitted to measured ranks.

The oracle is torchrec's own EmbeddingPerfEstimator run here with a config built from torchrec's types
(`EmbeddingPerfEstimatorConfig` with known `by_kernel` coefficients): its fwd + bwd compute summed per
rank is the "measurement" the fit must explain, and the coefficients it must recover are the test's.
"""

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.constants import kernel_bw_lookup
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig
from torchrec.distributed.planner.estimator.estimator import EmbeddingPerfEstimator
from torchrec.distributed.planner.estimator.types import EstimatorPerfCoefficients, PerfCoefficient
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb._torchrec_private import estimators_of, planner_enumerator, sharders_for_estimators
from embnb.planner import create_planner
from embnb.planner.calibration import (
    SHARD_BYTES,
    TERMS,
    TORCHREC_TERMS,
    Calibration,
    MeasuredRank,
    estimators,
    shard_terms,
)
from embnb.planner.estimates import covers
from embnb.planner.fitting import fit
from embnb.planner.topology import make_topology

BATCH = 64
SHAPES = [(rows, dim, pf) for rows, dim, pf in itertools.product((300, 4000), (16, 64, 128), (1.0, 7.0))]


def model(shapes=SHAPES):
    tables = [
        EmbeddingBagConfig(name=f"t{i}", feature_names=[f"f{i}"], num_embeddings=rows, embedding_dim=dim)
        for i, (rows, dim, _) in enumerate(shapes)
    ]
    constraints = {f"t{i}": ParameterConstraints(pooling_factors=[pf]) for i, (_, _, pf) in enumerate(shapes)}
    return EmbeddingBagCollection(tables=tables, device="meta"), constraints


def enumerated(world_size=4, device="cuda"):
    topology = make_topology(world_size, device, hbm_cap_gb=16)
    ebc, constraints = model()
    sharders = [EmbeddingBagCollectionSharder()]
    options = EmbeddingEnumerator(topology, BATCH, constraints).enumerate(ebc, sharders)
    return topology, constraints, sharders, options


def oracle_compute(options, topology, constraints, sharders, by_kernel):
    """torchrec's estimate of each option's shards (fwd + bwd compute) under a config with `by_kernel`
    (bwd: torchrec's fwd x the topology's bwd_compute_multiplier, 2)."""
    config = EmbeddingPerfEstimatorConfig()
    config.coefficients = dataclasses.replace(
        EmbeddingPerfEstimatorConfig.coefficients,
        by_kernel={
            group: EstimatorPerfCoefficients(fwd=PerfCoefficient(*values), bwd=None)
            for group, values in by_kernel.items()
        },
    )
    EmbeddingPerfEstimator(topology, constraints, config=config).estimate(
        options, sharders_for_estimators(sharders)
    )
    return [[s.perf.fwd_compute + s.perf.bwd_compute for s in option.shards] for option in options]


KNOWN = {
    ("table_wise", "fused"): (0.6, 1.7, 0.4, 2e-3),
    ("column_wise", "fused"): (1.3, 0.5, 2.2, 5e-3),
    ("row_wise", "fused"): (0.9, 2.5, 0.7, 1e-3),
}
ADDED = {  # embnb's terms: a missed lookup, a shard, the rows updated
    ("table_wise", "fused"): (3.0, 0.2, 0.8),
    ("column_wise", "fused"): (1.5, 0.7, 2.5),
    ("row_wise", "fused"): (2.0, 0.4, 1.2),
}
CACHE_BYTES = 256 * 1024  # the model's tables are 19 KB to 2 MB


def extended(values):
    """torchrec's four coefficients, with embnb's terms 0."""
    return (*values, *(0.0,) * (len(TERMS) - len(TORCHREC_TERMS)))


def device_bw(topology, compute_kernel):
    return kernel_bw_lookup(
        topology.compute_device,
        compute_kernel,
        topology.hbm_mem_bw,
        topology.ddr_mem_bw,
        topology.hbm_to_ddr_mem_bw,
    )


def distinct_rows(ids: int, rows: int) -> float:
    """The expected distinct rows among `ids` uniform draws from `rows` rows: each row is missed by
    every draw with probability (1 - 1/rows)^ids."""
    return rows * (1 - (1 - 1 / rows) ** ids)


def test_added_terms_are_a_missed_lookup_a_shard_and_the_rows_updated():
    """Per shard, the miss term is torchrec's lookup term (its forward's share: bwd = 2 x fwd) times
    log2 of the shard's table (rows x cols x 4 bytes) over CACHE_BYTES where it is larger; the
    shard term is SHARD_BYTES over torchrec's bandwidth for the kernel; the rows term is the
    distinct rows the shard's ids touch (uniform ids; a table-wise or column-wise shard reads every
    rank's BATCH x pooling factor ids, a row-wise or data-parallel one a batch's share) times the
    row's bytes, over that bandwidth (embnb's terms are forward only: torchrec's backward is a
    multiple of its own forward). No miss without a cache."""
    topology, constraints, sharders, options = enumerated()
    world = topology.world_size
    ids_of = {"table_wise": world, "column_wise": world, "row_wise": 1, "data_parallel": 1}
    options = [o for o in options if o.compute_kernel in ("fused", "dense")]
    with_cache = shard_terms(options, topology, sharders, constraints, cache_bytes=CACHE_BYTES)
    without = shard_terms(options, topology, sharders, constraints)
    missed, checked = 0, set()
    for option, terms, plain in zip(options, with_cache, without):
        for shard, term, plain_term in zip(option.shards, terms, plain):
            rows, cols = shard.size
            table = rows * cols * 4
            share = math.log2(table / CACHE_BYTES) if table > CACHE_BYTES else 0.0
            missed += share > 0
            assert term.terms[:5] == pytest.approx((*plain_term.terms[:4], plain_term.terms[1] / 3 * share))
            assert plain_term.terms[4] == 0.0
            bw = device_bw(topology, option.compute_kernel)
            assert term.terms[5] == plain_term.terms[5] == pytest.approx(SHARD_BYTES / bw, rel=1e-12)
            assert term.terms[6] == plain_term.terms[6] > 0
            if option.sharding_type in ids_of:
                ids = BATCH * sum(option.input_lengths) * ids_of[option.sharding_type]
                want = distinct_rows(round(ids), rows) * cols * 4 / bw
                # the library's e^(-ids/rows) beside the exact (1 - 1/rows)^ids: within 0.5% here
                assert term.terms[6] == pytest.approx(want, rel=5e-3), option.sharding_type
                checked.add(option.sharding_type)
    assert 0 < missed < sum(len(o.shards) for o in options)
    assert checked == set(ids_of)


def test_fit_recovers_known_coefficients_from_torchrecs_estimates():
    topology, constraints, sharders, options = enumerated()
    options = [o for o in options if (o.sharding_type, o.compute_kernel) in KNOWN]
    assert {(o.sharding_type, o.compute_kernel) for o in options} == set(KNOWN)
    measured = oracle_compute(options, topology, constraints, sharders, KNOWN)
    terms = shard_terms(options, topology, sharders, constraints, cache_bytes=CACHE_BYTES)
    for option_terms, option_measured in zip(terms, measured):
        for s, shard in enumerate(option_terms):  # embnb's terms (checked above) on torchrec's estimate
            miss, per_shard, rows = ADDED[shard.group]
            option_measured[s] += miss * shard.terms[4] + per_shard * shard.terms[5] + rows * shard.terms[6]
    pool = [(terms[i][s], measured[i][s]) for i, o in enumerate(options) for s in range(len(o.shards))]
    rng = np.random.default_rng(0)
    ranks = []
    for _ in range(60):
        picked = [pool[j] for j in rng.choice(len(pool), size=3, replace=False)]
        ranks.append(MeasuredRank(sum(ms for _, ms in picked), tuple(t for t, _ in picked)))
    calibration = fit(ranks, device_kind="cuda", device_name="synthetic", cache_bytes=CACHE_BYTES)
    assert set(calibration.coefficients) == set(KNOWN) and calibration.cache_bytes == CACHE_BYTES
    for group, values in KNOWN.items():
        want = (*values, *ADDED[group])
        np.testing.assert_allclose(calibration.coefficients[group], want, rtol=1e-6, err_msg=str(group))
    assert max(abs(e) for e in calibration.fit_errors) < 1e-9
    for rank in ranks[:5]:
        assert math.isclose(calibration.estimate(rank.shards), rank.lookups_ms, rel_tol=1e-9)


def two_term_pool():
    """KNOWN's groups with torchrec's first two terms only, and every shard of their enumerated
    options as (its terms, its compute by torchrec's estimator at those coefficients)."""
    topology, constraints, sharders, options = enumerated()
    two = {group: (values[0], values[1], 0.0, 0.0) for group, values in KNOWN.items()}
    options = [o for o in options if (o.sharding_type, o.compute_kernel) in two]
    measured = oracle_compute(options, topology, constraints, sharders, two)
    terms = shard_terms(options, topology, sharders, constraints)
    return two, [(terms[i][s], measured[i][s]) for i, o in enumerate(options) for s in range(len(o.shards))]


def test_fit_recovers_a_known_cost_per_kernel_call():
    """Ranks priced at known coefficients plus 0.46 ms per kernel call (issue #69: a TBE call's
    cost whatever its ids), each rank with 1 to 3 calls: `fit` recovers both, its estimate adds the
    calls, and the same ranks fitted without the term (`kernel_calls=False`) fit worse."""
    two, pool = two_term_pool()
    rng, per_call = np.random.default_rng(1), 0.46
    ranks = []
    for _ in range(60):
        picked = [pool[j] for j in rng.choice(len(pool), size=3, replace=False)]
        calls = int(rng.integers(1, 4))
        compute = sum(ms for _, ms in picked) + per_call * calls
        ranks.append(MeasuredRank(compute, tuple(t for t, _ in picked), calls))
    calibration = fit(ranks, "cuda", "synthetic", terms=TERMS[:2])
    assert calibration.kernel_call_ms == pytest.approx(per_call, rel=1e-6)
    for group, values in two.items():
        np.testing.assert_allclose(calibration.coefficients[group], extended(values), rtol=1e-6)
    for rank in ranks[:5]:
        assert calibration.estimate(rank.shards, rank.kernel_calls) == pytest.approx(
            rank.lookups_ms, rel=1e-9
        )
        assert calibration.estimate(rank.shards) == pytest.approx(
            rank.lookups_ms - per_call * rank.kernel_calls
        )
    without = fit(ranks, "cuda", "synthetic", terms=TERMS[:2], kernel_calls=False)
    assert without.kernel_call_ms == 0
    assert max(map(abs, without.fit_errors)) > 100 * max(map(abs, calibration.fit_errors))
    # uncounted calls (0, the default): no kernel-call term is fitted
    uncounted = [MeasuredRank(r.lookups_ms, r.shards) for r in ranks]
    assert fit(uncounted, "cuda", "synthetic", terms=TERMS[:2]).kernel_call_ms == 0


def test_a_few_outlying_ranks_leave_the_huber_fit_pricing_the_others():
    """Ranks priced at known coefficients (torchrec's own estimator, the oracle), 6 of 60 measured
    60% slow (a cost the terms cannot see): the Huber fit (the default) prices the 54 others within
    1% at the median rank; least squares (`huber_delta=None`), pulled toward the slow ones, more
    than 2% off. (Ranks, not coefficients: the two terms are nearly collinear in this pool.) A bad
    threshold is named."""
    _, pool = two_term_pool()
    rng = np.random.default_rng(2)
    ranks = []
    for r in range(60):
        picked = [pool[j] for j in rng.choice(len(pool), size=3, replace=False)]
        slow = 1.6 if r % 10 == 0 else 1.0
        ranks.append(MeasuredRank(slow * sum(ms for _, ms in picked), tuple(t for t, _ in picked)))
    huber = fit(ranks, "cuda", "synthetic", terms=TERMS[:2])
    squares = fit(ranks, "cuda", "synthetic", terms=TERMS[:2], huber_delta=None)
    regular = [r % 10 != 0 for r in range(60)]
    assert np.median(np.abs(huber.fit_errors)[regular]) < 0.01
    assert np.median(np.abs(squares.fit_errors)[regular]) > 0.02
    with pytest.raises(ValueError, match="huber_delta"):
        fit(ranks, "cuda", "synthetic", terms=TERMS[:2], huber_delta=0.0)


def test_fit_of_some_terms_recovers_them_and_leaves_the_others_zero():
    """`terms=`: coefficients known to be 0 outside the fitted terms are recovered as the others."""
    two, pool = two_term_pool()
    ranks = [MeasuredRank(ms, (shard,)) for shard, ms in pool]
    calibration = fit(ranks, "cuda", "synthetic", terms=TERMS[:2])
    for group, values in two.items():
        want = extended(values)
        np.testing.assert_allclose(calibration.coefficients[group], want, rtol=1e-6, err_msg=str(group))
    with pytest.raises(ValueError, match=r"terms must be distinct names from .*got \('hash',\)"):
        fit(ranks, "cuda", "synthetic", terms=("hash",))


def test_fit_leaves_the_miss_term_out_where_no_table_outgrows_the_cache():
    """With a cache larger than every table, no shard has a miss term: by default `fit` fits the
    other six and recovers torchrec's coefficients with embnb's 0; asked for it, it says so."""
    topology, constraints, sharders, options = enumerated()
    options = [o for o in options if (o.sharding_type, o.compute_kernel) in KNOWN]
    measured = oracle_compute(options, topology, constraints, sharders, KNOWN)
    terms = shard_terms(options, topology, sharders, constraints, cache_bytes=1 << 30)
    ranks = [
        MeasuredRank(measured[i][s], (terms[i][s],))
        for i, o in enumerate(options)
        for s in range(len(o.shards))
    ]
    calibration = fit(ranks, "cuda", "synthetic", cache_bytes=1 << 30)
    for group, values in KNOWN.items():
        got = calibration.coefficients[group]
        np.testing.assert_allclose(got[:4], values, rtol=1e-6, err_msg=str(group))
        assert got[4] == 0 and max(abs(got[5]), abs(got[6])) < 1e-9 * max(values)
    with pytest.raises(ValueError, match="no shard has a term for: .*cache_miss_lookup_multiplier"):
        fit(ranks, "cuda", "synthetic", terms=TERMS, cache_bytes=1 << 30)


def test_shard_terms_are_torchrecs_default_estimate_at_default_coefficients():
    """At torchrec's default coefficients (1, 1, 1, 0) the terms sum to its default estimate, block
    penalty included (bwd = 2 x fwd)."""
    topology, constraints, sharders, options = enumerated(world_size=2)
    default = [[s.perf.fwd_compute + s.perf.bwd_compute for s in o.shards] for o in options]
    terms = shard_terms(options, topology, sharders, constraints)
    assert [[s.perf.fwd_compute + s.perf.bwd_compute for s in o.shards] for o in options] == default  # kept
    for option_terms, option_default in zip(terms, default):
        for shard, expected in zip(option_terms, option_default):
            assert math.isclose(sum(shard.terms[:3]), expected, rel_tol=1e-12)


def test_an_unfitted_sharding_type_is_priced_as_its_fitted_sibling():
    """A calibration fitted on row_wise, table_wise and column_wise (KNOWN) prices table_row_wise and
    grid_shard as row_wise, table_column_wise as column_wise, and data_parallel (no sibling) at
    torchrec's default: written out here by hand, torchrec's estimator with those coefficients is
    the oracle of both `estimate` and the calibration's perf config."""
    topology, constraints, sharders, options = enumerated(world_size=16)  # 2 hosts of 8
    by_hand = {
        **KNOWN,
        ("table_row_wise", "fused"): KNOWN[("row_wise", "fused")],
        ("grid_shard", "fused"): KNOWN[("row_wise", "fused")],
        ("table_column_wise", "fused"): KNOWN[("column_wise", "fused")],
    }
    kinds = {(o.sharding_type, o.compute_kernel) for o in options}
    # torchrec enumerates grid_shard only where constraints ask for it: priced_as checks it below
    assert set(by_hand) - {("grid_shard", "fused")} | {("data_parallel", "dense")} <= kinds, kinds
    options = [o for o in options if o.compute_kernel in ("fused", "dense")]
    expected = oracle_compute(options, topology, constraints, sharders, by_hand)
    calibration = Calibration("cuda", "test", {group: extended(values) for group, values in KNOWN.items()})
    terms = shard_terms(options, topology, sharders, constraints)
    for option, option_terms, option_expected in zip(options, terms, expected):
        for shard, want in zip(option_terms, option_expected):
            assert math.isclose(calibration.estimate([shard]), want, rel_tol=1e-9), option.sharding_type
    (perf, _) = estimators(calibration, topology, constraints)
    perf.estimate(options, sharders_for_estimators(sharders))
    through_torchrec = [s.perf.fwd_compute + s.perf.bwd_compute for o in options for s in o.shards]
    assert through_torchrec == pytest.approx([v for values in expected for v in values], rel=1e-9)
    assert calibration.priced_as(("grid_shard", "fused")) == ("row_wise", "fused")
    assert calibration.priced_as(("data_parallel", "dense")) is None


PER_SHARD = 0.25  # the scaled calibration's shard coefficient, where the kernel is fused or dense


def scaled_calibration(options, factor):
    groups = {(o.sharding_type, o.compute_kernel) for o in options}
    return Calibration(
        "cuda",
        "test",
        {
            (kind, kernel): (
                factor,
                factor,
                factor,
                0.0,
                0.0,
                PER_SHARD if kernel in ("fused", "dense") else 0.0,
                0.0,
            )
            for kind, kernel in groups
        },
    )


@pytest.mark.parametrize("planner_kind", ["torchrec", "embnb"])
def test_calibrated_config_plugs_into_the_planner(planner_kind):
    """A plan of a small model on the calibrated estimator: every enumerated shard's compute is the
    calibration's factor times torchrec's default estimate (coefficients (k, k, k, 0), bwd 2 x fwd),
    and a fused or dense shard's forward PER_SHARD x SHARD_BYTES over its bandwidth more."""
    topology, constraints, sharders, options = enumerated(world_size=2)
    calibration = scaled_calibration(options, 3.0)
    ebc, _ = model()
    if planner_kind == "torchrec":
        calibrated_estimators = estimators(calibration, topology, constraints)
        enumerator = EmbeddingEnumerator(topology, BATCH, constraints, estimator=calibrated_estimators)
        the_planner = EmbeddingShardingPlanner(
            topology=topology, batch_size=BATCH, enumerator=enumerator, constraints=constraints
        )
    else:
        the_planner = create_planner(topology, BATCH, constraints=constraints, calibration=calibration)
        enumerator = planner_enumerator(the_planner)
        assert all(map(covers, estimators_of(enumerator)))  # embnb's fast path stays on
    plan = the_planner.plan(ebc, sharders)
    assert plan.plan  # a real plan
    calibrated = enumerator.last_stored_search_space
    assert calibrated

    def key(o):
        return (o.name, o.sharding_type, o.compute_kernel, tuple(tuple(s.size) for s in o.shards))

    by_key = {key(o): o for o in options}
    assert len(by_key) == len(options)
    for option in calibrated:
        default = by_key[key(option)]
        added = PER_SHARD * SHARD_BYTES / device_bw(topology, option.compute_kernel)
        if option.compute_kernel not in ("fused", "dense"):
            added = 0.0
        for shard, default_shard in zip(option.shards, default.shards):
            want = 3.0 * default_shard.perf.fwd_compute + added
            assert math.isclose(shard.perf.fwd_compute, want, rel_tol=1e-9)
            assert math.isclose(shard.perf.bwd_compute, 3.0 * default_shard.perf.bwd_compute, rel_tol=1e-9)
            assert shard.perf.fwd_comms == default_shard.perf.fwd_comms  # communication is not calibrated


def test_save_load_round_trip(tmp_path):
    calibration = Calibration(
        "cpu",
        "AMD EPYC test",
        {
            ("table_wise", "fused"): (0.5, 1.25, 0.0, 1e-4, 2.0, 0.5, 0.75),
            ("row_wise", "dense"): (1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0),
        },
        bwd_multiplier=1.5,
        fit_errors=(0.01, -0.02),
        cache_bytes=2.0**21,
        kernel_call_ms=0.46,
        collective_ms={"table_wise": 0.1, "row_wise": 0.25},
    )
    path = tmp_path / "calibration.json"
    calibration.save(path)
    data = json.loads(path.read_text())
    assert data["device_kind"] == "cpu" and data["device_name"] == "AMD EPYC test"
    assert data["format"] == 4 and data["kernel_call_ms"] == 0.46
    assert Calibration.load(path) == calibration
    # format 3 (no rating terms: the committed files) reads with them 0
    old = {k: v for k, v in data.items() if k not in ("kernel_call_ms", "collective_ms")}
    read = Calibration.from_json({**old, "format": 3})
    assert (read.kernel_call_ms, read.collective_ms) == (0.0, {})
    assert read.coefficients == calibration.coefficients
    # format 1 (torchrec's terms only) reads with embnb's terms 0 and no cache
    old = {**data, "format": 1, "terms": list(TORCHREC_TERMS), "cache_bytes": None}
    old["coefficients"] = [{**row, "fwd": row["fwd"][:4]} for row in data["coefficients"]]
    read = Calibration.from_json(old)
    assert read.coefficients[("table_wise", "fused")] == (0.5, 1.25, 0.0, 1e-4, 0.0, 0.0, 0.0)
    assert read.cache_bytes is None
    # format 2 (no rows term) reads with it 0
    old = {**data, "format": 2, "terms": list(TERMS[:6])}
    old["coefficients"] = [{**row, "fwd": row["fwd"][:6]} for row in data["coefficients"]]
    read = Calibration.from_json(old)
    assert read.coefficients[("table_wise", "fused")] == (0.5, 1.25, 0.0, 1e-4, 2.0, 0.5, 0.0)
    assert read.cache_bytes == 2.0**21
    with pytest.raises(ValueError, match=r"format 2: \[.*terms=\['input_read_size_multiplier'\]"):
        Calibration.from_json({**old, "terms": ["input_read_size_multiplier"]})


def test_bad_input_raises_naming_the_value():
    shard = shard_terms_example()
    with pytest.raises(ValueError, match=r"ranks\[1\]\.lookups_ms .*-2\.0"):
        fit([MeasuredRank(1.0, (shard,)), MeasuredRank(-2.0, (shard,))], "cpu", "x")
    with pytest.raises(ValueError, match="at least one"):
        fit([], "cpu", "x")
    with pytest.raises(ValueError, match=r"determine 1 of the 6 coefficients"):
        fit([MeasuredRank(1.0, (shard,)), MeasuredRank(2.0, (shard, shard))], "cpu", "x")
    with pytest.raises(ValueError, match=r"coefficients\[\('table_wise', 'fused'\)\].*-1"):
        Calibration("cpu", "x", {("table_wise", "fused"): (1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0)})
    with pytest.raises(ValueError, match="cache_bytes .*-1"):
        Calibration("cpu", "x", {}, cache_bytes=-1)
    with pytest.raises(ValueError, match=r"kernel_call_ms .*-0\.5"):
        Calibration("cpu", "x", {}, kernel_call_ms=-0.5)
    with pytest.raises(ValueError, match=r"sharding type must be one of .*'tw'"):
        Calibration("cpu", "x", {}, collective_ms={"tw": 1.0})
    with pytest.raises(ValueError, match=r"collective_ms\['row_wise'\] .*inf"):
        Calibration("cpu", "x", {}, collective_ms={"row_wise": math.inf})
    with pytest.raises(ValueError, match="device_name .*''"):
        Calibration("cpu", "", {})
    with pytest.raises(ValueError, match="format"):
        Calibration.from_json({"format": 99, "terms": list(TERMS)})
    with pytest.raises(TypeError, match="calibration must be a Calibration"):
        create_planner(make_topology(2, "cuda", hbm_cap_gb=16), BATCH, calibration={"a": 1})


def shard_terms_example():
    from embnb.planner.calibration import ShardTerms

    return ShardTerms("table_wise", "fused", (1.0, 2.0, 3.0, 4.0, 0.0, 5.0, 6.0))

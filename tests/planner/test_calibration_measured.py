"""From steptime's measurements to a calibration's `MeasuredRank`s (`measured_ranks`), on plans run
rank by rank with real FBGEMM kernels. The oracles: torchrec's own estimate of each rank's compute
(its enumerator's default estimator, summed per rank) and the plan's shard placement. No time is
asserted, only which measurement goes with which shards."""

from __future__ import annotations

import math

import pytest
from torchrec.distributed.planner.planners import to_sharding_plan

from embnb.lab.planner.candidates import estimated_per_rank, one_kind_on
from embnb.lab.planner.models import enumerate_options, make_model
from embnb.planner.calibration import MeasuredRank, measured_ranks, rank_terms, torchrec_default_estimate
from embnb.planner.fitting import fit
from embnb.planner.topology import make_topology
from embnb.steptime import make_batch, measure_plan

WORLD_SIZE, BATCH = 3, 8


@pytest.fixture(scope="module")
def setup():
    model = make_model(6, seed=3, max_rows=2000)
    topology = make_topology(WORLD_SIZE, "cpu")
    enumerated = enumerate_options(model.tables, topology, BATCH, model.constraints)  # torchrec's enumerator
    batch = make_batch(model.tables, model.constraints, WORLD_SIZE, BATCH, seed=0)
    plans = {
        "table-wise on rank 0": one_kind_on(enumerated, "table_wise", [0]),
        "table-wise on ranks 1, 2": one_kind_on(enumerated, "table_wise", [1, 2]),
        "data-parallel": one_kind_on(enumerated, "data_parallel", []),
    }
    measured = {
        name: measure_plan(to_sharding_plan(options, topology), model.tables, batch, warmup=0, repeats=2)
        for name, options in plans.items()
    }
    return model, topology, enumerated, plans, measured


def test_each_measured_rank_holds_its_shards_and_torchrecs_estimate(setup):
    model, topology, enumerated, plans, measured = setup
    for name, options in plans.items():
        times = measured[name]
        ranks = measured_ranks(options, times, topology, enumerated.sharders, model.constraints)
        holding = sorted({shard.rank for option in options for shard in option.shards})
        assert len(ranks) == len(holding), name  # ranks holding no shard are left out
        estimated = estimated_per_rank(options, WORLD_SIZE)["compute"]  # torchrec's, seconds
        for rank, measured_rank in zip(holding, ranks):
            on_rank = [s for option in options for s in option.shards if s.rank == rank]
            assert len(measured_rank.shards) == len(on_rank)
            assert {t.group for t in measured_rank.shards} == {
                (o.sharding_type, o.compute_kernel) for o in options
            }
            assert math.isclose(
                torchrec_default_estimate(measured_rank.shards), estimated[rank] * 1e3, rel_tol=1e-9
            )
            assert measured_rank.lookups_ms == times.ranks[rank].lookup.median_s("cpu") * 1e3 > 0
    # the same plan by wall time: the same shards, the other clock
    wall = measured_ranks(
        plans["data-parallel"],
        measured["data-parallel"],
        topology,
        enumerated.sharders,
        model.constraints,
        "wall",
    )
    assert [r.lookups_ms for r in wall] == [
        t.lookup.median_s("wall") * 1e3 for t in measured["data-parallel"].ranks
    ]


def test_measured_ranks_fit_with_the_terms_they_determine(setup):
    """Data-parallel ranks all hold the same shards: the three plans' ranks determine one coefficient
    per group, not six (torchrec's four, the shard and the rows terms); `fit` says so, and fits with
    `terms` one term."""
    model, topology, enumerated, plans, measured = setup
    ranks: list[MeasuredRank] = []
    for name, options in plans.items():
        ranks += measured_ranks(options, measured[name], topology, enumerated.sharders, model.constraints)
    assert all(rank.kernel_calls == 1 for rank in ranks)  # one TBE per rank in each of these plans
    # 6 terms x 2 groups, and the cost per kernel call
    with pytest.raises(ValueError, match="determine .* of the 13 coefficients.*fewer `terms`"):
        fit(ranks, "cpu", "test")
    # one term, without the per-call cost (which, fitted too, may take a group's whole cost: nnls)
    calibration = fit(ranks, "cpu", "test", terms=("lookup_size_multiplier",), kernel_calls=False)
    assert set(calibration.coefficients) == {("table_wise", "fused"), ("data_parallel", "dense")}
    for values in calibration.coefficients.values():
        assert values[1] > 0 and [v for i, v in enumerate(values) if i != 1] == [0.0] * 6
    assert len(calibration.fit_errors) == len(ranks) and calibration.kernel_call_ms == 0
    with_calls = fit(ranks, "cpu", "test", terms=("lookup_size_multiplier",))
    assert with_calls.kernel_call_ms >= 0 and len(with_calls.fit_errors) == len(ranks)


def test_measured_ranks_bad_input(setup):
    model, topology, enumerated, plans, measured = setup
    options = plans["table-wise on rank 0"]
    times = measured["table-wise on rank 0"]
    with pytest.raises(ValueError, match="clock must be 'cpu' or 'wall', got 'gpu'"):
        measured_ranks(options, times, topology, enumerated.sharders, clock="gpu")
    with pytest.raises(ValueError, match="times has 3 ranks, the topology 2"):
        measured_ranks(options, times, make_topology(2, "cpu"), enumerated.sharders)
    unplaced = enumerated.options[:1]  # enumerated, not placed: no rank
    with pytest.raises(ValueError, match="a shard's rank must be in 0..2 .*got None"):
        rank_terms(unplaced, topology, enumerated.sharders)

"""embnb.lab.balancing.measured's rank-time fits on ranks built by hand: a cost exactly linear in its
features comes back exactly, the fixed share and r follow, and a flat time reads as overhead-bound."""

import types

import pytest

from embnb.lab.balancing import measured
from embnb.lab.balancing.measured import RankStep

COST = {"gflops": 2.0, "distinct_lengths": 0.5, "tokens": 0.001, "per_rank": 0.25}  # ms per unit


def _step(flops, distinct, tokens):
    ms = [
        COST["gflops"] * f / 1e9 + COST["distinct_lengths"] * n + COST["tokens"] * t + COST["per_rank"]
        for f, n, t in zip(flops, distinct, tokens)
    ]
    return RankStep(ms, ms, ms, tokens, flops, distinct, "thread")


def _runs():
    return {
        ("zipf", 2, "contiguous"): _step([1e9, 1.5e9], [9, 1], [300, 200]),
        ("zipf", 2, "kk_swap"): _step([1.2e9, 1.3e9], [4, 6], [240, 260]),
        ("zipf", 2, "greedy_lpt"): _step([1.3e9, 1.2e9], [2, 8], [210, 290]),
    }


def test_an_exactly_linear_cost_is_recovered_with_no_residual():
    rows = measured.rank_rows(_runs())
    assert len(rows) == 6
    fit = measured.fit_rank_time(rows, measured.WORK_AND_LENGTHS)
    assert fit.coefficients == pytest.approx(COST, rel=1e-6)
    assert fit.max_relative_residual == pytest.approx(0, abs=1e-9)
    mean_ms = sum(r["ms"] for r in rows) / len(rows)
    assert fit.fixed_share == pytest.approx(COST["per_rank"] / mean_ms)
    # cut's slowest rank: 2 + 4.5 + 0.3 + 0.25 = 7.05 ms
    assert fit.predict(rows[0]) == pytest.approx(7.05)


def test_time_flat_in_work_is_mostly_fixed():
    rows = [{"ms": 10.0 + 0.01 * (i % 2), "gflops": float(i)} for i in range(6)]
    fit = measured.fit_rank_time(rows, measured.WORK)
    assert fit.fixed_share > 0.95 and abs(fit.coefficients["gflops"]) < 0.01
    with pytest.raises(ValueError, match="at least 2 ranks"):
        measured.fit_rank_time(rows[:1])


def test_fitted_speedups_are_the_fits_slowest_ranks():
    runs = _runs()
    bounds = {("zipf", 2): {"lower_bound": 1.25e9, "longest_sets_bound": False}}
    config = measured.StepConfig([2], 2)
    steps = measured.BalancedSteps(runs, bounds, {("zipf", 2): [1, 2, 3, 4]}, config)
    table, fits = measured.fitted(steps)
    kk = table[table["method"] == "kk_swap"].iloc[0]
    # KK + swaps' slowest rank: 2.6 + 3 + 0.26 + 0.25 = 6.11 ms
    assert kk["fitted_model"] == pytest.approx(7.05 / 6.11)
    assert set(fits) == {"work", "work_and_lengths"}
    assert types.SimpleNamespace(**fits["work_and_lengths"]).max_relative_residual == pytest.approx(
        0, abs=1e-9
    )


def test_the_latency_measurement_refuses_fewer_than_two_ranks():
    with pytest.raises(ValueError, match="world_size"):
        measured.measure_latency_ms(1)
    assert measured.measure_latency_ms(2, "cpu", repeats=3) > 0

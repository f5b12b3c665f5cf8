"""The rank cost fit of notebook 04's section 8 on runs built by hand: a
cost that is exactly linear in the features comes back exactly, and a
speed-up within its FLOP bound needs no explanation."""

import types

import pytest

from embnb.lab.balancing import cost_fit, measured
from embnb.lab.balancing.measured import RankStep

COST = {"gflops": 2.0, "distinct_lengths": 0.5, "tokens": 0.001, "per_rank": 0.25}  # ms per unit


def _step(flops, distinct, tokens):
    ms = [
        COST["gflops"] * f / 1e9 + COST["distinct_lengths"] * n + COST["tokens"] * t + COST["per_rank"]
        for f, n, t in zip(flops, distinct, tokens)
    ]
    return RankStep(ms, ms, ms, ms, tokens, flops, ms, ms, "cpu", distinct)


def _steps():
    runs = {  # the cut: rank 0 holds many distinct lengths and fewer FLOPs than rank 1
        ("zipf", 2, "contiguous"): _step([1e9, 1.5e9], [9, 1], [300, 200]),
        ("zipf", 2, "kk_swap"): _step([1.2e9, 1.3e9], [4, 6], [240, 260]),
        ("zipf", 2, "greedy_lpt"): _step([1.3e9, 1.2e9], [2, 8], [210, 290]),
    }
    return types.SimpleNamespace(runs=runs)


def test_an_exactly_linear_cost_is_recovered_and_predicts_every_step():
    steps = _steps()
    fit = cost_fit.fit_rank_cost(steps)
    assert fit.coefficients == pytest.approx(COST, rel=1e-6)
    assert fit.max_abs_rank_residual() == pytest.approx(0, abs=1e-9)
    # cut: max(2 + 4.5 + 0.3, 3 + 0.5 + 0.2) + 0.25 = 7.05; KK + swaps: 2.6 + 3 + 0.26 + 0.25 = 6.11
    assert fit.predicted_speedup("zipf", 2, "kk_swap") == pytest.approx(7.05 / 6.11)


def test_only_a_speedup_past_its_bound_is_explained_and_the_text_says_by_what():
    steps = _steps()
    fit = cost_fit.fit_rank_cost(steps)
    within = types.SimpleNamespace(
        distribution="zipf", world_size=2, method="kk_swap", measured=1.05, bound=1.1
    )
    assert cost_fit.explain(fit, steps, within) is None
    past = types.SimpleNamespace(distribution="zipf", world_size=2, method="kk_swap", measured=1.2, bound=1.1)
    text = cost_fit.explain(fit, steps, past)
    # the slowest measured rank of the cut is 0 (6.8 ms), the one with the most FLOPs is 1
    assert "slowest measured rank (0, 9 distinct lengths) is not the rank with the most FLOPs (1, 1)" in text
    assert f"predicts {7.05 / 6.11:.2f}x, so the fitted terms account for passing the bound" in text
    above = types.SimpleNamespace(
        distribution="zipf", world_size=2, method="kk_swap", measured=1.3, bound=1.2
    )
    assert "do not account for it" in cost_fit.explain(fit, steps, above)  # 1.15x predicted: not past 1.2x


def test_the_latency_measurement_refuses_fewer_than_two_ranks():
    with pytest.raises(ValueError, match="world_size"):
        measured.measure_latency_ms(1)

"""embnb.lab.balancing.measured's memory caps: the activation-bytes model, fitted to real peaks of
`SequenceDense`, and caps on tokens and on modelled bytes measured on one small batch (real kernels
on CPU, real profiler peaks)."""

import pytest

from embnb.balancing.lengths import LengthDistribution
from embnb.lab.balancing import measured
from embnb.steptime.memory import peak_step_bytes

WIDTH, HIDDEN = 8, (16,)
W = 2  # ranks of the capped batch


def test_the_model_is_its_formula_and_its_fit_follows_the_measured_peaks():
    model = measured.ActivationModel(100.0, 3.0, 0.5, [1, 2, 4], [104, 108, 120], "cpu")
    assert model.sample_bytes([2, 10]) == [3 * 2 + 0.5 * 4, 3 * 10 + 0.5 * 100]
    # predicted 103.5, 108, 120 against 104, 108, 120
    assert model.max_relative_residual() == pytest.approx(0.5 / 104)
    fitted = measured.ActivationModel.fit([4, 16, 64], WIDTH, HIDDEN, "cpu")
    assert fitted.measured == [peak_step_bytes([n], WIDTH, HIDDEN) for n in (4, 16, 64)]
    assert fitted.per_token >= 0 and fitted.per_token_squared >= 0 and fitted.fixed >= 0
    with pytest.raises(ValueError, match=r"3 distinct lengths.*\[4, 16\]"):
        measured.ActivationModel.fit([4, 16, 16], WIDTH, HIDDEN, "cpu")


@pytest.fixture(scope="module")
def capped():
    steps = measured.measure_balanced_steps(
        {"lognormal": LengthDistribution("lognormal", median=24, sigma=1.0)},
        measured.StepConfig([W], local_batch_size=4, max_length=64, width=WIDTH, hidden=HIDDEN, repeats=1),
    )
    lengths = steps.lengths[("lognormal", W)]
    model = measured.ActivationModel.fit([4, 16, 32, 64], WIDTH, HIDDEN, "cpu")
    tokens = measured.measure_capped(steps, "lognormal", W, 1.0)
    sizes = model.sample_bytes(lengths)
    by_bytes = measured.measure_capped(steps, "lognormal", W, 1.0, sizes, "modelled bytes", ["kk_swap"])
    return steps, lengths, sizes, tokens, by_bytes


def test_each_cap_holds_and_a_partition_measured_once_is_reused(capped):
    steps, lengths, sizes, tokens, by_bytes = capped
    for run, per_sample in ((tokens, lengths), (by_bytes, sizes)):
        assert run.mean == pytest.approx(sum(per_sample) / W) and run.cap >= run.mean
        for label, step in run.runs.items():
            assert sum(step.tokens) == sum(lengths)  # every sample on exactly one rank
            assert sum(run.held[label]) == pytest.approx(sum(per_sample))
            assert label == "uncapped" or max(run.held[label]) <= run.cap * (1 + 1e-12)
        assert run.binds == (max(run.held["uncapped"]) > run.cap)
        assert run.runs["uncapped"] is steps.runs[("lognormal", W, "kk_swap")]  # measured once
        assert run.cost["uncapped"] == 1.0
    assert set(tokens.runs) == {"uncapped", "greedy_lpt", "karmarkar_karp", "kk_swap"}
    assert set(by_bytes.runs) == {"uncapped", "kk_swap"}
    if not by_bytes.binds:  # a cap that does not bind leaves KK + swaps' partition and its measurement
        assert by_bytes.runs["kk_swap"] is by_bytes.runs["uncapped"]


def test_the_table_credits_no_lower_peak_to_a_cap_that_does_not_bind(capped):
    *_, tokens, by_bytes = capped
    for run in (tokens, by_bytes):
        table = run.table()
        assert table["cost_low"].le(table["cost"]).all() and table["cost"].le(table["cost_high"]).all()
        if not run.binds:
            assert not table["lowers_peak"].any()
    with pytest.raises(ValueError, match="no run of 'zipf' at W=2"):
        measured.measure_capped(capped[0], "zipf", W, 1.0)

"""embnb.lab.balancing.memory_cap: the activation-bytes model, fitted to
real peaks of `SequenceDense`, and the bytes cap measured beside the token
cap on one small batch (real kernels on CPU, real profiler peaks)."""

import pytest

from embnb.balancing.lengths import LengthDistribution
from embnb.lab.balancing import measured, memory_cap
from embnb.steptime.memory import peak_step_bytes

WIDTH, HIDDEN = 8, (16,)
W = 2  # ranks of the capped batch


def test_the_model_is_its_formula_and_its_fit_follows_the_measured_peaks():
    model = memory_cap.ActivationModel(100.0, 3.0, 0.5, [1, 2, 4], [104, 108, 120], "cpu")
    assert model.sample_bytes([2, 10]) == [3 * 2 + 0.5 * 4, 3 * 10 + 0.5 * 100]
    # predicted 103.5, 108, 120 against 104, 108, 120
    assert model.max_relative_residual() == pytest.approx(0.5 / 104)
    fitted = memory_cap.ActivationModel.fit([4, 16, 64], WIDTH, HIDDEN, "cpu")
    assert fitted.measured == [peak_step_bytes([n], WIDTH, HIDDEN) for n in (4, 16, 64)]
    assert fitted.per_token >= 0 and fitted.per_token_squared >= 0 and fitted.fixed >= 0
    with pytest.raises(ValueError, match=r"3 distinct lengths.*\[4, 16\]"):
        memory_cap.ActivationModel.fit([4, 16, 16], WIDTH, HIDDEN, "cpu")


@pytest.fixture(scope="module")
def comparison():
    steps = measured.measure_balanced_steps(
        {"lognormal": LengthDistribution("lognormal", median=24, sigma=1.0)},
        measured.StepConfig([W], local_batch_size=4, max_length=64, width=WIDTH, hidden=HIDDEN, repeats=1),
    )
    token_run = measured.measure_capped(steps, "lognormal", W, 1.0)
    model = memory_cap.ActivationModel.fit([4, 16, 32, 64], WIDTH, HIDDEN, "cpu")
    lengths = steps.lengths[("lognormal", W)]
    return lengths, token_run, memory_cap.compare_caps(lengths, token_run, model, steps.config, 1.0)


def test_the_bytes_cap_holds_on_the_model_and_reuses_the_token_caps_measurements(comparison):
    lengths, token_run, c = comparison
    per_sample = c.model.sample_bytes(lengths)
    assert c.mean_bytes == pytest.approx(sum(per_sample) / W)
    assert max(c.modelled_bytes["bytes cap"]) <= c.bytes_cap
    assert c.bytes_cap >= c.mean_bytes
    for label in c.steps:  # every partition holds every sample once: the same total
        assert sum(c.modelled_bytes[label]) == pytest.approx(sum(per_sample))
        assert sum(c.steps[label].tokens) == sum(lengths)
    assert c.steps["uncapped"] is token_run.steps["uncapped"]
    assert c.steps["token cap"] is token_run.steps["kk_swap"]
    assert c.token_cap == token_run.cap
    if not c.binds():
        assert c.steps["bytes cap"] is c.steps["uncapped"]
    low, high = c.cost_range("bytes cap")
    assert low <= c.cost("bytes cap") <= high
    table = memory_cap.cap_table([token_run], [c])
    assert not (table["lowers_peak"] & ~table["binds"]).any()  # only a binding cap lowers a peak
    assert table.loc[("lognormal", "none", "uncapped"), "peak_mib"] == c.largest_peak_mib("uncapped")

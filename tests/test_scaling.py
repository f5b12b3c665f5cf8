"""embnb.scaling: the batch sweep's fit and verdict, checked against times made from a known
fixed + per-work law (the fit must recover it) and against numpy's least squares; the copy bandwidth
on this CPU (no timed assertion)."""

import math

import numpy as np
import pytest

from embnb.scaling import (
    MAX_FIXED_SHARE,
    NOT_COMPARED,
    SWEEP_FACTORS,
    check_scaling,
    copy_bandwidth,
    fit_fixed_cost,
    measure_scaling,
    sweep_batches,
    sweep_clock,
)

BATCHES = sweep_batches(32)  # 32, 128, 512


def law(fixed_s, per_work_s, work):
    return [fixed_s + per_work_s * w for w in work]


def test_the_sweep_is_a_base_batch_4x_and_16x_it():
    assert SWEEP_FACTORS == (1, 4, 16) and BATCHES == [32, 128, 512]
    assert MAX_FIXED_SHARE == {"flops": 0.10, "bytes": 0.20}


def test_the_fit_recovers_a_known_fixed_and_per_work_law():
    work = [b * 3e9 for b in BATCHES]  # FLOPs growing with the batch
    fit = fit_fixed_cost(work, law(2e-3, 1e-12, work))
    assert fit.fixed_s == pytest.approx(2e-3) and fit.per_work_s == pytest.approx(1e-12)
    assert fit.seconds(1e12) == pytest.approx(2e-3 + 1.0)


def test_the_fit_is_ordinary_least_squares_on_noisy_times():
    work = [1.0, 2.0, 4.0, 8.0, 16.0]
    seconds = [1.3, 1.9, 3.2, 5.1, 9.4]
    slope, intercept = np.polyfit(work, seconds, 1)  # numpy's least squares: the oracle
    fit = fit_fixed_cost(work, seconds)
    assert (fit.per_work_s, fit.fixed_s) == pytest.approx((slope, intercept))


def test_the_check_picks_the_smallest_batch_whose_fixed_share_is_under_the_limit():
    work = [b * 1e9 for b in BATCHES]
    # fixed 10 ms, 1 ms per 32 samples' worth of work: shares 10/11, 10/14, 10/26 at 32, 128, 512
    seconds = law(10e-3, 1e-3 / 32e9, work)
    check = check_scaling(
        BATCHES, work, [[t, t * 1.01, t * 0.99] for t in seconds], "bytes", max_fixed_share=0.4
    )
    assert check.median_s == pytest.approx(seconds)
    assert check.fixed_share == pytest.approx([10 / 11, 10 / 14, 10 / 26])
    assert check.chosen_batch == 512 and check.verdict == "compared at batch 512"
    assert check.achieved_rate == pytest.approx([w / t for w, t in zip(work, seconds)])
    record = check.as_dict()
    assert record["chosen_batch"] == 512 and record["rate_unit"] == "bytes/s"
    assert record["fit"]["fixed_s"] == pytest.approx(10e-3) and record["of_reference"] is None
    # at the 20% for bytes, no batch passes: overhead-bound, never a comparison
    strict = check_scaling(BATCHES, work, [[t] for t in seconds], "bytes")
    assert strict.max_fixed_share == 0.20 and strict.chosen_batch is None and strict.verdict == NOT_COMPARED
    rated = check_scaling(BATCHES, work, [[t] for t in seconds], "bytes", reference_rate=2e12)
    assert rated.as_dict()["of_reference"] == pytest.approx([r / 2e12 for r in rated.achieved_rate])


def test_time_flat_in_work_is_overhead_bound_and_time_proportional_to_work_passes_at_the_base():
    work = [b * 2e9 for b in BATCHES]
    flat = check_scaling(BATCHES, work, [[5e-3], [5e-3], [5e-3]], "flops")
    assert flat.fit.per_work_s == 0 and flat.fixed_share == pytest.approx([1, 1, 1])
    assert flat.verdict == NOT_COMPARED
    proportional = check_scaling(BATCHES, work, [[w * 1e-14] for w in work], "flops")
    assert proportional.fit.fixed_s == pytest.approx(0, abs=1e-15) and proportional.chosen_batch == 32


@pytest.mark.parametrize(
    "args, error, message",
    [
        (
            ([32, 128], [1.0], [[1.0], [2.0]], "flops"),
            ValueError,
            "one work and one list of seconds per batch",
        ),
        (
            ([128, 32], [1.0, 2.0], [[1.0], [2.0]], "flops"),
            ValueError,
            "ascending and distinct, got \\[128, 32\\]",
        ),
        (([32, 128], [1.0, 2.0], [[1.0], []], "flops"), ValueError, r"seconds\[1\] must hold"),
        (([32, 128], [1.0, 2.0], [[1.0], [0.0]], "flops"), ValueError, r"seconds\[1\] must hold"),
        (([32, 128], [1.0, 1.0], [[1.0], [2.0]], "flops"), ValueError, "two different values"),
        (([32, 128], [1.0, 2.0], [[1.0], [2.0]], "tokens"), ValueError, "tokens"),
        (([32, 128], [1.0, math.nan], [[1.0], [2.0]], "flops"), ValueError, r"work\[1\]"),
        (([0, 128], [1.0, 2.0], [[1.0], [2.0]], "flops"), ValueError, r"batches\[0\]"),
    ],
)
def test_bad_sweeps_are_refused_naming_the_value(args, error, message):
    with pytest.raises(error, match=message):
        check_scaling(*args)
    with pytest.raises(ValueError, match="max_fixed_share"):
        check_scaling([1, 2], [1.0, 2.0], [[1.0], [2.0]], "flops", max_fixed_share=0)
    with pytest.raises(ValueError, match=r"factors\[1\]"):
        sweep_batches(8, (1, 0))


def test_the_copy_bandwidth_of_this_cpu_is_a_positive_rate():
    rate = copy_bandwidth("cpu", nbytes=1 << 22, repeats=3)
    assert math.isfinite(rate) and rate > 0
    with pytest.raises(ValueError, match="nbytes"):
        copy_bandwidth("cpu", nbytes=2)


def test_measure_scaling_times_each_batchs_step_in_rounds_and_checks_them():
    calls = []

    def step(batch):
        return lambda: (calls.append(batch), sum(i * i for i in range(2_000 * batch)))

    check = measure_scaling({b: step(b) for b in (16, 1, 4)}, [1.0, 4.0, 16.0], "flops", repeats=2)
    assert calls == [1, 4, 16] * 3  # a warm-up each, then two rounds in batch order
    assert check.batches == [1, 4, 16] and [len(s) for s in check.seconds] == [2, 2, 2]
    assert sweep_clock("cpu") == "thread" and sweep_clock("cuda") == "device"
    assert check.verdict in (NOT_COMPARED, f"compared at batch {check.chosen_batch}")  # whatever it says

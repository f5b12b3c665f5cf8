"""embnb.timing: the stopwatch, paired ratios over repeats, median and
interleaved timing."""

import math
import subprocess
import sys
import time

import pytest
import torch

from embnb.timing import (
    PhaseTime,
    Ratio,
    Stopwatch,
    interleaved_phases,
    interleaved_seconds,
    median_seconds,
    paired_difference,
    paired_ratio,
    t_quantile_975,
    time_phase,
)


def test_paired_ratio_divides_pair_by_pair_then_takes_median_and_range():
    # repeat by repeat: 10/5 = 2, 9/6 = 1.5, 12/4 = 3
    ratio = paired_ratio([10.0, 9.0, 12.0], [5.0, 6.0, 4.0])
    assert ratio == Ratio(median=2.0, low=1.5, high=3.0, repeats=3)
    assert str(ratio) == "2.00x (1.50-3.00 over 3)"
    assert ratio.as_dict() == {"median": 2.0, "low": 1.5, "high": 3.0, "repeats": 3}
    # not the ratio of medians (9.5 / 5.0 here would be 1.9 over two pairs)
    assert paired_ratio([10.0, 9.0], [4.0, 6.0]).median == pytest.approx((2.5 + 1.5) / 2)


@pytest.mark.parametrize(
    "numerators, denominators, message",
    [
        ([1.0], [1.0, 2.0], "same number"),
        ([], [], "same number"),
        ([1.0, 1.0], [1.0, 0.0], "must be > 0"),
    ],
)
def test_paired_ratio_rejects_unpaired_or_zero_timings(numerators, denominators, message):
    with pytest.raises(ValueError, match=message):
        paired_ratio(numerators, denominators)


def test_median_seconds_times_the_call_it_is_given():
    calls = []
    seconds = median_seconds(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 7 and 0 <= seconds < 1
    # a call of known length: never timed shorter than it sleeps (no upper bound on a shared machine)
    assert median_seconds(lambda: time.sleep(0.02), repeats=3, warmup=0) >= 0.02


def test_median_seconds_with_a_budget_times_one_call_not_a_block():
    calls = []
    seconds = median_seconds(lambda: (calls.append(1), time.sleep(0.005)), warmup=1, budget_s=0.1)
    assert seconds >= 0.005  # per call, though several calls may be timed together
    assert len(calls) >= 1 + 0.1 / 0.02  # the warm-up, then calls summing to about the budget (loose)


def test_median_seconds_keeps_the_callers_thread_count():
    """torch.utils.benchmark.Timer runs at one thread unless told; both modes keep the caller's."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = set()
        median_seconds(lambda: seen.add(torch.get_num_threads()), repeats=2, warmup=0)
        median_seconds(lambda: seen.add(torch.get_num_threads()), warmup=0, budget_s=0.01)
    finally:
        torch.set_num_threads(before)
    assert seen == {2}


def _t_cdf(t, df, steps=20000):
    """Student's t CDF at t > 0 by Simpson's rule on its density (an oracle
    independent of scipy's quantile function)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    h = t / steps
    total = sum(
        (1 if i in (0, steps) else 4 if i % 2 else 2) * c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2)
        for i in range(steps + 1)
    )
    return 0.5 + total * h / 3


@pytest.mark.parametrize("df", [1, 2, 4, 9, 29, 31, 60, 200])
def test_t_quantile_is_the_975_point_of_students_t(df):
    assert _t_cdf(t_quantile_975(df), df) == pytest.approx(0.975, abs=2e-5)


def test_paired_difference_mean_interval_and_range():
    # differences 1, 2, 3: mean 2, sample sd 1, half-width t(2) / sqrt(3)
    diff = paired_difference([11.0, 12.0, 13.0], [10.0, 10.0, 10.0])
    half = t_quantile_975(2) / math.sqrt(3)
    assert (diff.mean, diff.low, diff.high, diff.repeats) == (2.0, 1.0, 3.0, 3)
    assert (diff.ci_low, diff.ci_high) == pytest.approx((2 - half, 2 + half))
    assert diff.excludes_zero is False  # 2 - 4.303 / 1.732 < 0
    assert paired_difference([5.0, 5.1, 4.9, 5.0], [1.0, 1.0, 1.0, 1.0]).excludes_zero is True
    one = paired_difference([3.0], [1.0])
    assert one.mean == 2.0 and math.isnan(one.ci_low) and not one.excludes_zero
    with pytest.raises(ValueError, match="same number"):
        paired_difference([1.0], [])


def test_timing_writes_nothing_on_stderr():
    """torch.utils.benchmark imports torch.utils.cpp_extension, which logs "No
    CUDA runtime is found" on a CUDA build of torch without a GPU (the min
    stack); embnb.timing holds that log back, in a fresh process."""
    code = (
        "import embnb.timing as t; t.median_seconds(lambda: None, repeats=3); "
        "t.median_seconds(lambda: None, budget_s=0.01)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_the_stopwatch_times_wall_and_this_threads_cpu_and_sums_its_blocks():
    watch = Stopwatch()
    with watch:
        time.sleep(0.05)  # wall time passes, this thread's CPU time barely does
    assert watch.wall_s >= 0.05 and watch.end - watch.start == watch.wall_s
    assert 0 <= watch.cpu_s < watch.wall_s
    first = watch.wall_s
    with watch:
        sum(i * i for i in range(200_000))  # CPU work on this thread
    assert watch.cpu_s > 0 and watch.total_s == pytest.approx(first + watch.wall_s)


def test_interleaved_seconds_runs_the_calls_in_turn_and_restores_the_threads():
    order, before = [], torch.get_num_threads()
    calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "ref")}
    times, threads = interleaved_seconds(calls, repeats=3, warmup=1, threads=1, first_rounds_only={"ref": 1})
    assert threads == 1 and torch.get_num_threads() == before
    assert order == ["a", "b", "ref"] + ["a", "b", "ref"] + ["a", "b"] * 2  # warm-up, then rounds
    assert [len(times[n]) for n in ("a", "b", "ref")] == [3, 3, 1]


def test_time_phase_on_a_cpu_reads_wall_and_thread_time_around_the_call():
    calls = []
    slept = time_phase(lambda: (calls.append(1), time.sleep(0.03)))
    assert calls == [1] and isinstance(slept, PhaseTime)
    # a sleep passes wall time, not this thread's CPU time; nothing is queued on a CPU
    assert slept.seconds >= 0.03 and slept.enqueue_s == slept.seconds and slept.thread_s < 0.02
    busy = time_phase(lambda: sum(i * i for i in range(300_000)), device="cpu")
    assert (
        busy.thread_s > 0 and busy.value("thread") == busy.thread_s and busy.value("device") == busy.seconds
    )
    with pytest.raises(ValueError, match="clock must be one of .*'device'.*got 'wall'"):
        busy.value("wall")


def test_interleaved_phases_runs_the_rounds_of_interleaved_seconds_read_by_time_phase():
    order = []
    calls = {
        "sleeps": lambda: (order.append("sleeps"), time.sleep(0.01)),
        "ref": lambda: order.append("ref"),
    }
    times, threads = interleaved_phases(calls, repeats=3, warmup=1, threads=1, first_rounds_only={"ref": 2})
    assert threads == 1 and order == ["sleeps", "ref"] * 3 + ["sleeps"]  # warm-up, then 3 rounds
    assert [len(times["sleeps"]), len(times["ref"])] == [3, 2]
    assert all(isinstance(t, PhaseTime) and t.seconds >= 0.01 for t in times["sleeps"])
    # paired round by round, as the CPU benches pair interleaved_seconds' rounds
    ratio = paired_ratio([t.seconds for t in times["sleeps"][:2]], [t.seconds for t in times["ref"]])
    assert ratio.low > 1 and ratio.repeats == 2


@pytest.mark.cuda
def test_time_phase_on_a_gpu_times_the_queued_work_with_events_not_the_launch():
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    time_phase(lambda: a @ a, device)  # cuBLAS' first call loads its kernels
    timed = time_phase(lambda: [a @ a for _ in range(20)], device)
    # 20 matmuls of 2 * 4096^3 FLOPs: launching them takes far less than running them
    assert timed.enqueue_s < timed.seconds and timed.thread_s <= timed.enqueue_s + 1e-3
    with Stopwatch(device) as watch:
        [a @ a for _ in range(20)]
    assert watch.wall_s >= timed.enqueue_s  # the synchronized block waits for the GPU

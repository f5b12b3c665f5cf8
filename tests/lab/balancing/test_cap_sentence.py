"""CappedRun.cap_sentence on runs built by hand: what the cap was, whether
it had to be raised and whether it binds, and what it cost where it does."""

from embnb.lab.balancing.measured import CappedRun, RankStep


def _step(ms, tokens, flops):
    return RankStep(ms, ms, ms, ms, tokens, flops)


def _run(cap, asked, kk_swap_tokens):
    uncapped = _step([4.0, 2.0], [120, 80], [10.0, 6.0])
    steps = {
        "uncapped": uncapped,
        "greedy_lpt": _step([5.0, 2.0], [100, 100], [11.0, 5.0]),
        "karmarkar_karp": _step([4.4, 2.0], [100, 100], [10.5, 5.5]),
        "kk_swap": uncapped if kk_swap_tokens is None else _step([4.2, 2.0], kk_swap_tokens, [10.4, 5.6]),
    }
    peaks = {label: [2**20, 2**21] for label in steps}
    return CappedRun("lognormal", 2, cap, 100.0, steps, peaks, asked)


def test_a_binding_cap_reports_kk_swaps_cost_and_every_methods_range():
    sentence = _run(cap=105.0, asked=1.05, kk_swap_tokens=[100, 100]).cap_sentence()
    assert "token cap 1.05x the mean (as asked)" in sentence
    # KK + swaps: 4.2 / 4.0 measured, 10.4 / 10 by FLOPs; every method: 4.2/4 .. 5/4
    # one repeat each: the range is the ratio itself
    assert (
        "it binds: KK + swaps under it cost 1.05x measured (repeats 1.05-1.05x), 1.040x by the FLOP model"
        in sentence
    )
    assert "(every capped method: 1.05x-1.25x measured)" in sentence
    assert "largest peak memory 2.00 MiB uncapped, 2.00-2.00 MiB capped" in sentence


def test_a_raised_cap_that_the_uncapped_partition_meets_changes_nothing():
    sentence = _run(cap=130.0, asked=1.02, kk_swap_tokens=None).cap_sentence()
    assert "token cap 1.30x the mean (asked 1.02x, raised to fit an equal-count partition)" in sentence
    assert "never binds" in sentence and "cost" not in sentence

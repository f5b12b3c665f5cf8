"""embnb.timing: paired ratios over repeats, and median timing."""

import pytest

from embnb.timing import Ratio, median_seconds, paired_ratio


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

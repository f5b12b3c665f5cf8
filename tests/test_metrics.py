"""Tests for embnb.metrics: hand-checked ratios, then random cases against
plain-Python arithmetic."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from embnb.metrics import max_over_mean, spearman


def test_ratios_hand_checked():
    assert max_over_mean([3, 0, 1, 0]) == pytest.approx(3 / 1.0)
    assert max_over_mean([2, 4]) == pytest.approx(4 / 3)
    assert max_over_mean(torch.tensor([5, 5, 5])) == 1.0
    assert isinstance(max_over_mean(torch.tensor([1, 2])), float)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=20).filter(any))
def test_random_ratios_match_python(counts):
    mean = sum(counts) / len(counts)
    assert max_over_mean(counts) == pytest.approx(max(counts) / mean)


def test_max_over_mean_rejects_empty_and_zero_mean():
    with pytest.raises(ValueError, match="counts is empty"):
        max_over_mean([])
    with pytest.raises(ValueError, match="mean of counts is 0"):
        max_over_mean(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"counts must be 1-D, got shape \(1, 2\)"):
        max_over_mean([[1, 2]])


def test_spearman_against_its_formula():
    rng = random.Random(0)
    x = rng.sample(range(1000), 9)
    y = rng.sample(range(1000), 9)
    rank = {v: i + 1 for i, v in enumerate(sorted(x))}, {v: i + 1 for i, v in enumerate(sorted(y))}
    d2 = sum((rank[0][a] - rank[1][b]) ** 2 for a, b in zip(x, y))
    assert spearman(x, y) == pytest.approx(1 - 6 * d2 / (9 * (81 - 1)))
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))  # ties: mean ranks
    assert math.isnan(spearman([1, 1], [1, 2]))

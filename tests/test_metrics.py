"""Tests for embnb.metrics: hand-checked cases, then random cases against a
plain-Python Counter computation."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from embnb.metrics import RankLoad, max_over_mean, rank_load, spread_over_mean


def counter_load(keys: list[int], ranks: list[int], world_size: int):
    """Reference: per-rank key count and distinct-key count, by Counter."""
    per_rank = Counter(ranks)
    distinct = Counter(rank for _, rank in set(zip(keys, ranks)))
    return (
        [per_rank[r] for r in range(world_size)],
        [distinct[r] for r in range(world_size)],
    )


def test_hand_checked_load():
    # rank 0 gets 5,5,7 (2 distinct); rank 2 gets 9; ranks 1 and 3 nothing.
    load = rank_load([5, 9, 5, 7], [0, 2, 0, 0], world_size=4)
    assert isinstance(load, RankLoad)
    assert load.key_counts.tolist() == [3, 0, 1, 0]
    assert load.unique_counts.tolist() == [2, 0, 1, 0]
    assert load.key_counts.dtype == load.unique_counts.dtype == torch.int64


def test_same_key_on_two_ranks_counts_on_both():
    load = rank_load([4, 4, 4], [1, 0, 1], world_size=2)
    assert load.unique_counts.tolist() == [1, 1]


def test_empty_input_gives_zeros():
    load = rank_load(torch.empty(0, dtype=torch.int64), [], world_size=3)
    assert load.key_counts.tolist() == [0, 0, 0]
    assert load.unique_counts.tolist() == [0, 0, 0]


def test_extreme_keys_do_not_overflow():
    big = 2**63 - 1
    load = rank_load([big, -big - 1, big], [1, 1, 1], world_size=2)
    assert load.unique_counts.tolist() == [0, 2]


def test_ratios_hand_checked():
    assert max_over_mean([3, 0, 1, 0]) == pytest.approx(3 / 1.0)
    assert spread_over_mean([3, 0, 1, 0]) == pytest.approx(3 / 1.0)
    assert max_over_mean([2, 4]) == pytest.approx(4 / 3)
    assert spread_over_mean([2, 4]) == pytest.approx(2 / 3)
    assert max_over_mean(torch.tensor([5, 5, 5])) == 1.0
    assert spread_over_mean(torch.tensor([5, 5, 5])) == 0.0
    assert isinstance(max_over_mean(torch.tensor([1, 2])), float)


@settings(max_examples=60, deadline=None)
@given(
    world_size=st.integers(1, 9),
    pairs=st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 99)), max_size=200),
)
def test_random_load_matches_counter(world_size, pairs):
    keys = [k for k, _ in pairs]
    ranks = [r % world_size for _, r in pairs]
    load = rank_load(torch.tensor(keys, dtype=torch.int64), ranks, world_size)
    expected_counts, expected_unique = counter_load(keys, ranks, world_size)
    assert load.key_counts.tolist() == expected_counts
    assert load.unique_counts.tolist() == expected_unique


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=20).filter(any))
def test_random_ratios_match_python(counts):
    mean = sum(counts) / len(counts)
    assert max_over_mean(counts) == pytest.approx(max(counts) / mean)
    assert spread_over_mean(counts) == pytest.approx((max(counts) - min(counts)) / mean)


def test_large_random_case_matches_counter():
    gen = torch.Generator().manual_seed(1)
    keys = torch.randint(0, 500, (20_000,), generator=gen)
    ranks = torch.randint(0, 8, (20_000,), generator=gen)
    load = rank_load(keys, ranks, 8)
    expected = counter_load(keys.tolist(), ranks.tolist(), 8)
    assert (load.key_counts.tolist(), load.unique_counts.tolist()) == expected


@pytest.mark.parametrize("bad_rank", [-1, 4, 17])
def test_rank_out_of_range_names_value(bad_rank):
    with pytest.raises(ValueError, match=rf"rank {bad_rank} is outside \[0, 4\)"):
        rank_load([1, 2, 3], [0, bad_rank, 1], world_size=4)


def test_length_mismatch_names_lengths():
    with pytest.raises(ValueError, match="3 != 2"):
        rank_load([1, 2, 3], [0, 1], world_size=2)


def test_bad_world_size_and_dtype():
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        rank_load([1], [0], world_size=0)
    with pytest.raises(ValueError, match="ranks must hold integers"):
        rank_load([1], [0.5], world_size=2)
    with pytest.raises(ValueError, match=r"keys must be 1-D, got shape \(1, 1\)"):
        rank_load([[1]], [0], world_size=2)


@pytest.mark.parametrize("ratio", [max_over_mean, spread_over_mean])
def test_ratios_reject_empty_and_zero_mean(ratio):
    with pytest.raises(ValueError, match="counts is empty"):
        ratio([])
    with pytest.raises(ValueError, match="mean of counts is 0"):
        ratio(torch.zeros(4, dtype=torch.int64))

"""Tests for embnb.data: each key pattern's statistical property against an
expectation computed here from first principles."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from embnb.data import (
    PATTERNS,
    make_keys,
    snowflake_ids,
    strided_ids,
    tagged_ids,
    uniform_ids,
    zipf_cdf,
    zipf_ids,
    zipf_lengths,
)
from embnb.metrics import max_over_mean

N = 100_000


def within_sigmas(observed: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    """Is a binomial(n, p) count within `sigmas` standard deviations of n*p?"""
    return abs(observed - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


# --- every pattern ---------------------------------------------------------


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_shape_dtype_and_determinism(pattern):
    keys = make_keys(pattern, 1000, seed=3)
    assert keys.dtype == torch.int64 and keys.shape == (1000,)
    assert bool((keys >= 0).all())
    assert torch.equal(keys, make_keys(pattern, 1000, seed=3))
    assert make_keys(pattern, 0).shape == (0,)


@pytest.mark.parametrize("pattern", sorted(set(PATTERNS) - {"sequential"}))
def test_different_seeds_differ(pattern):
    first = make_keys(pattern, 1000, seed=0)
    assert not torch.equal(first, make_keys(pattern, 1000, seed=1))


def test_make_keys_errors_name_the_value():
    with pytest.raises(ValueError, match="'nope'.*uniform, sequential, strided"):
        make_keys("nope", 10)
    with pytest.raises(ValueError, match="num_keys must be an int >= 0, got -3"):
        make_keys("uniform", -3)
    with pytest.raises(ValueError, match="stride must be an int >= 1, got 0"):
        make_keys("strided", 10, stride=0)


def test_make_keys_passes_options():
    assert torch.equal(
        make_keys("strided", 50, seed=2, stride=4, offset=3),
        strided_ids(50, seed=2, stride=4, offset=3),
    )


# --- one property per pattern ------------------------------------------------


def test_uniform_is_uniform():
    space = 2**40
    keys = uniform_ids(N, seed=5)
    assert 0 <= int(keys.min()) and int(keys.max()) < space
    # Mean of U[0, space): space/2, standard error space / sqrt(12 N).
    mean_error = space / math.sqrt(12 * N)
    assert abs(keys.double().mean().item() - space / 2) < 5 * mean_error
    residue_counts = torch.bincount(keys % 8, minlength=8)
    assert all(within_sigmas(int(c), N, 1 / 8) for c in residue_counts)


def test_sequential_counts_up_from_start():
    assert make_keys("sequential", 5, start=40).tolist() == [
        40,
        41,
        42,
        43,
        44,
    ]


@pytest.mark.parametrize("stride,offset", [(12, 0), (8, 5), (6, 1), (1, 0)])
def test_strided_has_one_residue_and_random_multiples(stride, offset):
    keys = strided_ids(N, stride=stride, offset=offset, seed=1)
    assert bool((keys % stride == offset).all())
    assert torch.unique(keys).numel() > 0.99 * N  # random, not repeated
    # the multiples k are uniform: their residues mod 7 are 1/7 each
    multiples = (keys - offset) // stride
    assert all(within_sigmas(int(c), N, 1 / 7) for c in torch.bincount(multiples % 7, minlength=7))


def test_strided_rejects_offset_outside_stride():
    with pytest.raises(ValueError, match=r"offset must be an int in \[0, 3\], got 4"):
        strided_ids(10, stride=4, offset=4)


def test_tagged_low_bits_are_tags():
    tags = (1, 2, 5)
    keys = tagged_ids(N, tag_bits=3, tags=tags, seed=2)
    low = keys & 0b111
    for tag in tags:
        assert within_sigmas(int((low == tag).sum()), N, 1 / len(tags))
    assert int(sum((low == t).sum() for t in tags)) == N
    assert torch.unique(keys >> 3).numel() > 0.99 * N  # high bits random


def test_tagged_rejects_tag_that_does_not_fit():
    with pytest.raises(ValueError, match="tag 9 does not fit in tag_bits=3"):
        tagged_ids(10, tag_bits=3, tags=(1, 9))


def test_snowflake_mostly_multiples_of_4096():
    keys = snowflake_ids(N, seed=4)
    assert (keys % 4096 == 0).double().mean().item() > 0.9
    millis = keys >> 22
    assert bool((millis[1:] >= millis[:-1]).all())  # made in time order
    # Default 0.05 ids/ms: N ids span about N / 0.05 ms.
    span = int(millis[-1] - millis[0])
    assert abs(span - N / 0.05) < 0.05 * N / 0.05
    workers = (keys >> 12) & 1023
    assert set(workers.unique().tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize("num_workers", [1, 4])
def test_snowflake_sequence_zero_fraction_matches_poisson(num_workers):
    # Each (ms, worker) cell gets Poisson(mu) ids, mu = rate / workers; one of
    # them has sequence 0 when the cell is non-empty: (1 - e^-mu) / mu.
    keys = snowflake_ids(N, seed=6, ids_per_ms=1.0, num_workers=num_workers)
    mu = 1.0 / num_workers
    expected = (1 - math.exp(-mu)) / mu
    assert abs((keys % 4096 == 0).double().mean().item() - expected) < 0.01
    assert int((keys & 4095).max()) < 4096 // 2  # sequence stays small


def zipf_share(rank: int, vocab_size: int, alpha: float) -> float:
    """Share of the rank-th hottest id, straight from the Zipf formula."""
    normalizer = math.fsum(k**-alpha for k in range(1, vocab_size + 1))
    return rank**-alpha / normalizer


def test_zipf_top_keys_have_zipf_share():
    vocab_size, alpha = 50_000, 1.1
    keys = zipf_ids(N, alpha=alpha, vocab_size=vocab_size, seed=7)
    counts = torch.bincount(keys, minlength=vocab_size)
    top = torch.sort(counts, descending=True).values[:3]
    for rank, count in enumerate(top.tolist(), start=1):
        assert within_sigmas(count, N, zipf_share(rank, vocab_size, alpha))
    # Scattered: the hottest ids are not simply 0, 1, 2.
    hottest = torch.argsort(counts, descending=True)[:3]
    assert hottest.tolist() != [0, 1, 2]


def test_zipf_hot_key_defeats_any_routing():
    # Route each distinct id to a random rank (an ideal hash). The hot id's
    # rank still carries its whole share: max/mean >= share * world_size.
    world_size, vocab_size, alpha = 8, 100_000, 1.2
    keys = zipf_ids(N, alpha=alpha, vocab_size=vocab_size)
    ideal_hash = torch.randint(0, world_size, (vocab_size,), generator=torch.Generator().manual_seed(9))
    counts = torch.bincount(ideal_hash[keys], minlength=world_size)
    bound = zipf_share(1, vocab_size, alpha) * world_size
    assert bound > 1.5
    assert max_over_mean(counts) >= 0.95 * bound


def _inverse_cdf_draws(num, alpha, support, gen):
    """The documented draw: uniforms from `gen`, each the first rank whose CDF reaches it (numpy's
    cumulative sum and search, independent of torch's)."""
    weights = np.arange(1, support + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(weights / weights.sum())
    uniform = torch.rand(num, generator=gen, dtype=torch.float64).numpy()
    return torch.from_numpy(np.minimum(np.searchsorted(cdf, uniform, side="left"), support - 1))


def test_zipf_draws_are_the_inverse_cdf_draws_of_the_seed_and_reuse_the_tables_cdf():
    vocab_size, alpha, seed = 5_000, 1.2, 11
    gen = torch.Generator().manual_seed(seed)
    ranks = _inverse_cdf_draws(4_000, alpha, vocab_size, gen)
    names = torch.randperm(vocab_size, generator=gen)  # drawn after the ranks, from the same generator
    before = zipf_cdf.cache_info()
    first = zipf_ids(4_000, seed=seed, alpha=alpha, vocab_size=vocab_size)
    assert torch.equal(first, names[ranks])
    second = zipf_ids(4_000, seed=seed, alpha=alpha, vocab_size=vocab_size)
    assert torch.equal(second, first)
    after = zipf_cdf.cache_info()
    assert after.hits >= before.hits + 1  # the second call reused the table's CDF
    assert zipf_cdf(vocab_size, alpha) is zipf_cdf(vocab_size, alpha)
    lengths = zipf_lengths(3_000, 1.5, max_length=700, seed=4)
    assert torch.equal(lengths, _inverse_cdf_draws(3_000, 1.5, 700, torch.Generator().manual_seed(4)) + 1)


def test_zipf_ids_with_a_table_seed_keep_the_tables_hot_ids_from_batch_to_batch():
    vocab_size, alpha = 2_000, 1.2
    table = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(99))
    batches = [zipf_ids(3_000, seed=s, alpha=alpha, vocab_size=vocab_size, table_seed=99) for s in (1, 2)]
    for seed, batch in zip((1, 2), batches):
        ranks = _inverse_cdf_draws(3_000, alpha, vocab_size, torch.Generator().manual_seed(seed))
        assert torch.equal(batch, table[ranks])
    hottest = [int(torch.bincount(b, minlength=vocab_size).argmax()) for b in batches]
    assert hottest == [int(table[0])] * 2  # the same hot id in both batches
    plain = [zipf_ids(3_000, seed=s, alpha=alpha, vocab_size=vocab_size) for s in (1, 2)]
    assert int(torch.bincount(plain[0]).argmax()) != int(torch.bincount(plain[1]).argmax())
    with pytest.raises(ValueError, match="table_seed"):
        zipf_ids(10, table_seed=-1)

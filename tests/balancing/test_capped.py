"""Balancing under a memory cap: the cap holds (a plain sum is the oracle),
counts stay equal, the cap changes a partition only where it binds, and a
capped optimum is never better than the uncapped one (brute force)."""

import itertools
import random

import pytest

from embnb.balancing.capped import CAPPED_METHODS, balance_capped, minimum_cap
from embnb.balancing.lengths import LengthDistribution
from embnb.balancing.partition import greedy_lpt, karmarkar_karp, kk_swap
from embnb.balancing.workloads import attention_block_flops

UNCAPPED = {"greedy_lpt": greedy_lpt, "karmarkar_karp": karmarkar_karp, "kk_swap": kk_swap}


def _batch(kind, num_samples, seed):
    lengths = LengthDistribution(kind).draw(num_samples, max_length=2048, seed=seed)
    return attention_block_flops(lengths, 16, 32).tolist(), lengths.tolist()


def greedy_capped(workloads, tokens, num_parts, cap):
    """The oracle of the library's capped greedy, written here: equal counts, the biggest workload
    first, to the lightest part that still has room for one more sample and for its tokens under
    `cap`; ValueError where no part has room (the library then repairs)."""
    per_part = len(workloads) // num_parts
    parts = [[] for _ in range(num_parts)]
    loads, held = [0.0] * num_parts, [0.0] * num_parts
    for i in sorted(range(len(workloads)), key=lambda i: (-workloads[i], i)):
        room = [p for p in range(num_parts) if len(parts[p]) < per_part and held[p] + tokens[i] <= cap]
        if not room:
            raise ValueError(f"no part has room for sample {i} ({tokens[i]} tokens) under cap {cap}")
        p = min(room, key=lambda p: (loads[p], p))  # the lightest part with room
        parts[p].append(i)
        loads[p] += workloads[i]
        held[p] += tokens[i]
    return [sorted(part) for part in parts]


def _max_sum(values, parts):
    return max(sum(values[i] for i in part) for part in parts)


def _cases():
    for kind, (num_samples, num_parts), seed in itertools.product(
        ("zipf", "lognormal"), ((64, 8), (130, 16), (256, 64)), (0, 1)
    ):
        flops, tokens = _batch(kind, num_samples, seed)
        mean = sum(tokens) / num_parts
        for factor in (1.03, 1.1, 1.5):
            yield kind, flops, tokens, num_parts, max(factor * mean, minimum_cap(tokens, num_parts))


@pytest.mark.parametrize("method", CAPPED_METHODS)
def test_the_cap_holds_and_counts_stay_equal(method):
    checked = 0
    for _, flops, tokens, num_parts, cap in _cases():
        try:
            parts = balance_capped(flops, tokens, num_parts, cap, method)
        except ValueError as error:  # allowed only with the cap named
            assert f"cap {cap:g}" in str(error)
            continue
        checked += 1
        assert sorted(i for part in parts for i in part) == list(range(len(tokens)))
        sizes = [len(part) for part in parts]
        assert max(sizes) - min(sizes) <= 1 and len(parts) == num_parts
        for part in parts:  # the oracle: a plain sum
            total = 0
            for i in part:
                total += tokens[i]
            assert total <= cap
    assert checked >= 30


@pytest.mark.parametrize("method", CAPPED_METHODS)
def test_capped_is_better_than_uncapped_only_where_the_uncapped_broke_the_cap(method):
    better, unchanged = 0, 0
    for _, flops, tokens, num_parts, cap in _cases():
        uncapped = UNCAPPED[method](flops, num_parts)
        try:
            capped = balance_capped(flops, tokens, num_parts, cap, method)
        except ValueError:
            continue
        fits = _max_sum(tokens, uncapped) <= cap
        if fits:  # the cap does not bind: the same partition
            assert sorted(map(sorted, capped)) == sorted(map(sorted, uncapped))
            unchanged += 1
        if _max_sum(flops, capped) < _max_sum(flops, uncapped) * (1 - 1e-12):
            assert not fits  # a heuristic's other local optimum, reached only through the repair
            better += 1
    assert unchanged > 0


def test_the_capped_optimum_is_never_below_the_uncapped_optimum():
    rng = random.Random(0)
    for _ in range(40):
        tokens = [rng.randint(1, 30) for _ in range(8)]
        flops = [t * t + 5 * t for t in tokens]
        cap = rng.uniform(minimum_cap(tokens, 2), sum(tokens))

        def best(limit, flops=flops, tokens=tokens):
            options = [
                max(sum(flops[i] for i in side), sum(flops) - sum(flops[i] for i in side))
                for side in itertools.combinations(range(8), 4)
                if max(sum(tokens[i] for i in side), sum(tokens) - sum(tokens[i] for i in side)) <= limit
            ]
            return min(options) if options else None

        capped = best(cap)
        if capped is not None:
            assert capped >= best(float("inf"))
            for method in CAPPED_METHODS:  # no heuristic beats the capped optimum
                try:
                    parts = balance_capped(flops, tokens, 2, cap, method)
                except ValueError:
                    continue
                assert _max_sum(flops, parts) >= capped


def test_library_greedy_is_the_reference_where_no_part_runs_out_of_room():
    compared = 0
    for _, flops, tokens, num_parts, cap in _cases():
        if len(tokens) % num_parts:
            continue
        try:
            expected = greedy_capped(flops, tokens, num_parts, cap)
        except ValueError:
            continue
        assert balance_capped(flops, tokens, num_parts, cap, "greedy_lpt") == expected
        compared += 1
    assert compared >= 10


def test_bad_caps_are_named():
    flops, tokens = [9.0, 4.0, 1.0, 1.0], [10, 5, 1, 1]
    with pytest.raises(ValueError, match="cap 5 is below 11"):
        balance_capped(flops, tokens, 2, 5)
    with pytest.raises(ValueError, match="method"):
        balance_capped(flops, tokens, 2, 20, method="lpt")
    with pytest.raises(ValueError, match="tokens has 3 samples, workloads 4"):
        balance_capped(flops, tokens[:3], 2, 20)
    assert minimum_cap(tokens, 2) == 11  # the longest sample and the shortest other one

"""embnb.balancing.reference (the KK shown in notebook 04) gives the same
partition as the library's Python KK and the native op on distinct workloads."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embnb.balancing import partition
from embnb.balancing.reference import kk_equal_count
from embnb.native import loader


def as_parts(parts):
    return sorted(tuple(sorted(p)) for p in parts)


@settings(max_examples=100, deadline=None)
@given(num_parts=st.integers(1, 8), groups=st.integers(1, 12), seed=st.integers(0, 10**6))
def test_readable_kk_is_the_librarys_kk(num_parts, groups, seed):
    rng = random.Random(seed)
    workloads = [rng.uniform(0, 1000) for _ in range(num_parts * groups)]  # distinct: no tie-breaks
    parts = kk_equal_count(workloads, num_parts)
    assert all(len(p) == groups for p in parts)
    assert as_parts(parts) == as_parts(partition.balance(workloads, num_parts, "karmarkar_karp", "python"))


@pytest.mark.skipif(not loader.available(), reason="native op unavailable")
def test_readable_kk_is_the_native_kk():
    rng = random.Random(7)
    for num_parts, groups in ((4, 16), (8, 64), (64, 8)):
        workloads = [rng.paretovariate(1.5) for _ in range(num_parts * groups)]
        native = partition.balance(workloads, num_parts, "karmarkar_karp", "native")
        assert as_parts(kk_equal_count(workloads, num_parts)) == as_parts(native)

"""embnb.lab.balancing.reference (the KK shown in notebook 04) gives the same
partition as the library's Python KK and the native op on distinct workloads."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from embnb.balancing import partition
from embnb.balancing.workloads import equal_size_lower_bound
from embnb.cuda import loader
from embnb.lab.balancing.reference import kk_equal_count, page_core_agrees


def as_parts(parts):
    return sorted(tuple(sorted(p)) for p in parts)


@settings(max_examples=100, deadline=None)
@given(num_parts=st.integers(1, 8), groups=st.integers(1, 12), seed=st.integers(0, 10**6))
def test_readable_kk_is_the_librarys_kk(num_parts, groups, seed):
    rng = random.Random(seed)
    workloads = [rng.uniform(0, 1000) for _ in range(num_parts * groups)]  # distinct: no tie-breaks
    parts = kk_equal_count(workloads, num_parts)
    assert all(len(p) == groups for p in parts)
    assert as_parts(parts) == as_parts(
        partition.balance(workloads, num_parts, "karmarkar_karp", native=False)
    )


def test_readable_kk_is_the_native_kk():
    assert loader.available(), loader.failure()  # the native op is part of the build: never skip it
    rng = random.Random(7)
    for num_parts, groups in ((4, 16), (8, 64), (64, 8)):
        workloads = [rng.paretovariate(1.5) for _ in range(num_parts * groups)]
        native = partition.balance(workloads, num_parts, "karmarkar_karp", native=True)
        assert as_parts(kk_equal_count(workloads, num_parts)) == as_parts(native)


def test_trace_of_the_worked_example_by_hand():
    # 8 items into 2 parts. Sorted pairs (1,2) (3,5) (8,13) (40,100) have spreads
    # 1, 2, 5, 60: the widest two merge first, heaviest set with the lightest.
    workloads = [13, 1, 100, 5, 40, 2, 8, 3]
    trace = []
    parts = kk_equal_count(workloads, 2, trace)
    sums = [[round(s) for s, _ in merged] for _, _, merged in trace]
    assert sums == [[108, 53], [111, 58], [112, 60]]
    first, second, _ = trace[0]
    assert [s for s, _ in first] == [100, 40] and [s for s, _ in second] == [13, 8]
    assert sorted(sum(workloads[i] for i in p) for p in parts) == [60, 112]
    # the part holding 100 holds 3 more items, at least 1 + 2 + 3: no equal-count
    # split beats 106, and KK + swaps (8 <-> 2) reaches it
    assert equal_size_lower_bound(workloads, 2) == 106
    swapped = partition.balance(workloads, 2, "kk_swap", native=False)
    assert sorted(sum(workloads[i] for i in p) for p in swapped) == [66, 106]


def test_page_core_agrees_with_the_librarys_partition_and_says_so_when_it_does_not():
    rng = random.Random(3)
    workloads = [rng.paretovariate(1.5) for _ in range(48)]
    library = partition.balance(workloads, 4, "kk_swap", native=False)
    kk = partition.balance(workloads, 4, "karmarkar_karp", native=False)
    assert page_core_agrees(workloads, 4, kk, library, library) == {
        "kk_partition": True,
        "kk_swap_partition": True,
        "kk_swap_native": True,
        "kk_swap_max_load": True,
        "worker_ranks": True,
    }
    # a wrong page: plain KK where KK + swaps belongs, and ranks handed each other's parts
    wrong = page_core_agrees(workloads, 4, library, kk, library[::-1])
    assert wrong["kk_swap_partition"] is False and wrong["worker_ranks"] is False
    assert wrong["kk_swap_max_load"] is False  # KK's largest part is heavier than the swaps'
    assert wrong["kk_partition"] is False

"""embnb.balancing.partition and workloads: partitions checked against brute force, the textbook KK,
numberpartitioning, the lower bounds, FLOPs counted by torch, and the native
op against the Python reference."""

import gc
import itertools
import math
import random
import sys
import threading

import numberpartitioning
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from embnb.balancing import partition as balancer
from embnb.balancing import workloads as workload_measures
from embnb.balancing.training import AttentionBlock
from embnb.cuda import loader
from embnb.data import zipf_lengths

BALANCERS = ["contiguous", "greedy_lpt", "karmarkar_karp", "kk_swap"]


def loads(workloads, parts):
    return [sum(workloads[i] for i in part) for part in parts]


def assert_partition(parts, num_items, num_parts, equal_size=True):
    assert len(parts) == num_parts
    assert sorted(i for part in parts for i in part) == list(range(num_items))
    assert all(part == sorted(part) for part in parts)
    if equal_size:
        sizes = [len(part) for part in parts]
        assert max(sizes) - min(sizes) <= 1


def brute_force_best(workloads, num_parts, equal_size):
    """The smallest possible largest part, by trying every assignment."""
    n = len(workloads)
    sizes_ok = (lambda sizes: max(sizes) - min(sizes) <= 1) if equal_size else (lambda sizes: True)
    best = math.inf
    for assignment in itertools.product(range(num_parts), repeat=n):
        sizes = [assignment.count(p) for p in range(num_parts)]
        if sizes_ok(sizes):
            part_loads = [0] * num_parts
            for i, p in enumerate(assignment):
                part_loads[p] += workloads[i]
            best = min(best, max(part_loads))
    return best


def classic_differencing(numbers):
    """Two-way KK as in the textbook: replace the two largest by their difference."""
    numbers = sorted(numbers)
    while len(numbers) > 1:
        a, b = numbers.pop(), numbers.pop()
        numbers.append(a - b)
        numbers.sort()
    return numbers[0]


@pytest.fixture(scope="module")
def native():
    assert loader.available(), f"the native KK did not build: {loader.failure()}"
    return True


def test_textbook_example_kk_differs_by_2_and_swaps_reach_the_optimum():
    # Largest differencing on {8,7,6,5,4} ends with difference 2; {8,7} vs {6,5,4} is perfect.
    workloads = [8, 7, 6, 5, 4]
    kk = balancer.karmarkar_karp(workloads, 2, equal_size=False)
    assert sorted(loads(workloads, kk)) == [14, 16]
    assert brute_force_best(workloads, 2, equal_size=False) == 15
    refined = balancer.refine_by_swaps(workloads, kk)
    assert [len(p) for p in refined] == [len(p) for p in kk]  # swaps keep the sizes
    assert max(loads(workloads, refined)) <= 16


@pytest.mark.parametrize("seed", range(4))
def test_two_way_kk_ends_at_the_classic_difference_like_numberpartitioning(seed):
    gen = torch.Generator().manual_seed(seed)
    workloads = torch.randint(1, 1000, (41,), generator=gen).tolist()
    parts = balancer.karmarkar_karp(workloads, 2, equal_size=False)
    ours = loads(workloads, parts)
    theirs = numberpartitioning.karmarkar_karp(workloads, 2).sizes
    assert max(ours) - min(ours) == classic_differencing(workloads) == max(theirs) - min(theirs)


@pytest.mark.parametrize("num_parts", [2, 3, 5])
def test_lpt_without_equal_size_matches_numberpartitioning_greedy(num_parts):
    workloads = zipf_lengths(300, 1.5, 512, seed=num_parts).tolist()
    ours = balancer.greedy_lpt(workloads, num_parts, equal_size=False)
    theirs = numberpartitioning.greedy([int(w) for w in workloads], num_parts, return_indices=True).partition
    assert ours == [sorted(p) for p in theirs]


@pytest.mark.parametrize("num_items, num_parts", [(6, 2), (7, 2), (7, 3), (8, 3), (8, 4), (5, 8)])
@pytest.mark.parametrize("seed", range(3))
def test_every_method_is_valid_and_never_beats_brute_force(num_items, num_parts, seed):
    gen = torch.Generator().manual_seed(seed)
    workloads = torch.randint(0, 20, (num_items,), generator=gen).tolist()
    best = brute_force_best(workloads, num_parts, equal_size=True)
    # The bounds are bounds: no equal-size partition goes below them.
    assert (
        workload_measures.lower_bound(workloads, num_parts)
        <= workload_measures.equal_size_lower_bound(workloads, num_parts)
        <= best
    )
    for method in BALANCERS:
        parts = balancer.METHODS[method](workloads, num_parts)
        assert_partition(parts, num_items, num_parts)
        assert max(loads(workloads, parts)) >= best, method
    kk = balancer.karmarkar_karp(workloads, num_parts)
    assert max(loads(workloads, balancer.kk_swap(workloads, num_parts))) <= max(loads(workloads, kk))


def test_kk_swap_leaves_no_improving_swap_for_the_heaviest_part():
    workloads = zipf_lengths(512, 1.5, 2048, seed=3).tolist()
    parts = balancer.kk_swap(workloads, 8)
    part_loads = loads(workloads, parts)
    heavy = max(range(8), key=lambda p: part_loads[p])
    for light in range(8):
        gap = part_loads[heavy] - part_loads[light]
        for a in parts[heavy]:
            for b in parts[light]:
                assert not 0 < workloads[a] - workloads[b] < gap, (a, b)


@pytest.mark.parametrize("num_samples, num_parts", [(1024, 8), (2048, 64), (4096, 8), (4096, 64)])
def test_default_balancer_within_1_percent_of_the_lower_bound_on_zipf_batches(native, num_samples, num_parts):
    for seed in range(3):
        lengths = zipf_lengths(num_samples, 1.5, seed=seed)
        parts = balancer.balance(lengths, num_parts)
        assert_partition(parts, num_samples, num_parts)
        result = workload_measures.imbalance(lengths, parts)
        assert result["gap_to_lower_bound"] <= 0.01, (seed, result)
        plain = workload_measures.imbalance(lengths, balancer.karmarkar_karp(lengths, num_parts))
        assert result["max_load"] <= plain["max_load"]


@pytest.mark.parametrize(
    "workloads",
    [
        list(range(1, 12)),
        [100] + [1] * 10,  # the big item's part must not collect the padding
        [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2],  # real zeros tie with the padding
    ],
)
def test_padding_keeps_part_sizes_within_one(workloads):
    # 11 items into 5 parts: sizes 3, 2, 2, 2, 2 (and 4 padding items)
    for method in BALANCERS:
        parts = balancer.METHODS[method](workloads, 5)
        assert_partition(parts, 11, 5)
        assert sorted(len(p) for p in parts) == [2, 2, 2, 2, 3], method
    assert balancer.karmarkar_karp([5.0], 3) == [[0], [], []]


def test_imbalance_by_hand():
    workloads = [4, 3, 2, 1]
    even = workload_measures.imbalance(workloads, [[0, 3], [1, 2]])
    assert even["max_over_mean"] == 1.0 and even["gap_to_lower_bound"] == 0.0
    skewed = workload_measures.imbalance(workloads, [[0, 1], [2, 3]])
    assert skewed["max_load"] == 7 and skewed["lower_bound"] == 5
    assert skewed["max_over_mean"] == pytest.approx(1.4) and skewed["gap_to_lower_bound"] == pytest.approx(
        0.4
    )
    # Equal counts: the part with 100 also holds one other item, at least 1.
    assert workload_measures.equal_size_lower_bound([100, 1, 1, 1], 2) == 101
    assert workload_measures.lower_bound([100, 1, 1, 1], 2) == 100


def test_attention_flops_by_hand_and_counted_by_torch():
    # L=3, d=2, f=8: 3 * (8*4 + 4*2*8) + 4*2*9 = 3 * 96 + 72 = 360
    assert workload_measures.attention_block_flops([3], 2, 8).tolist() == [360.0]
    assert workload_measures.attention_block_flops([0, 1], 4, 16).tolist() == [
        0.0,
        1 * (8 * 16 + 4 * 4 * 16) + 4 * 4,
    ]
    block = AttentionBlock(embedding_dim=16, ffn_dim=48, num_heads=2)
    lengths = [1, 5, 17]
    tokens = torch.randn(sum(lengths), 16)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        block(tokens, lengths)
    expected = workload_measures.attention_block_flops(lengths, 16, 48).sum().item()
    assert counter.get_total_flops() == expected


def test_crossover_length_is_where_torchs_attention_flops_equal_the_rest():
    # torch's counter on the block, split by operator: the attention matmuls
    # (bmm, inside scaled_dot_product_attention) against the Linear layers (addmm)
    d, f = 16, 48
    length = workload_measures.crossover_length(d, f)
    block = AttentionBlock(embedding_dim=d, ffn_dim=f, num_heads=2)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        block(torch.randn(length, d), [length])
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert set(by_op) == {"aten.addmm", "aten.bmm"}
    assert by_op["aten.bmm"] == by_op["aten.addmm"] > 0


def test_zipf_lengths_are_deterministic_heavy_tailed_and_in_range():
    lengths = zipf_lengths(20_000, 1.5, 1000, seed=7)
    assert torch.equal(lengths, zipf_lengths(20_000, 1.5, 1000, seed=7))
    assert lengths.min() >= 1 and lengths.max() <= 1000
    share_of_ones = (lengths == 1).double().mean().item()
    expected = 1 / sum(k**-1.5 for k in range(1, 1001))
    assert abs(share_of_ones - expected) < 0.02  # 20k draws: a few standard errors


@settings(max_examples=150, deadline=None)
@given(
    workloads=st.lists(st.integers(0, 6), min_size=1, max_size=60),  # small ints: many ties
    num_parts=st.integers(1, 9),
    equal_size=st.booleans(),
    method=st.sampled_from(["karmarkar_karp", "kk_swap"]),
)
def test_native_gives_exactly_the_python_partition(native, workloads, num_parts, equal_size, method):
    python = balancer.balance(workloads, num_parts, method, native=False, equal_size=equal_size)
    assert balancer.balance(workloads, num_parts, method, native=True, equal_size=equal_size) == python
    assert_partition(python, len(workloads), num_parts, equal_size)


@pytest.mark.parametrize("num_samples, num_parts", [(1000, 8), (4096, 64), (3000, 7)])
def test_native_matches_python_on_zipf_and_flops(native, num_samples, num_parts):
    lengths = zipf_lengths(num_samples, 1.5, seed=num_parts)
    flops = workload_measures.attention_block_flops(lengths, 64, 256)
    for workloads in (lengths, flops, torch.rand(num_samples, dtype=torch.float64)):
        for method in ("karmarkar_karp", "kk_swap"):
            assert balancer.balance(workloads, num_parts, method, native=True) == balancer.balance(
                workloads, num_parts, method, native=False
            ), method


def test_native_op_runs_without_the_gil(native):
    """With a huge switch interval a thread keeps the GIL until it blocks or
    drops it. The main thread, woken by the worker just before the call,
    only gets to run while the worker is inside the op if the op released
    the GIL; with the Python KK it runs only after the worker is done."""

    def main_thread_ran_during(fn):
        entered, done = threading.Event(), threading.Event()

        def worker():
            entered.set()
            fn()
            done.set()

        old = sys.getswitchinterval()
        gc.collect()
        gc.disable()  # a collection can run finalizers that do I/O and so drop the GIL
        sys.setswitchinterval(1000.0)
        try:
            thread = threading.Thread(target=worker)
            thread.start()
            entered.wait()
            ran_during = not done.is_set()
            thread.join()
        finally:
            sys.setswitchinterval(old)
            gc.enable()
        return ran_during

    big = torch.rand(1_000_000, dtype=torch.float64)
    op = torch.ops.embnb.karmarkar_karp  # called right away: no other Python between
    # Woken, the main thread still waits for a core: on a loaded machine the op
    # can end first. Holding the GIL it could never run during the op, so one
    # of a few tries suffices.
    assert any(main_thread_ran_during(lambda: op(big, 64, True, True)) for _ in range(5))
    # The control: the Python KK's core (no torch calls, which drop the GIL
    # briefly) keeps the main thread out until it is done. A thread of the test
    # runner that waited for the GIL before the interval changed can still force
    # one switch, so one of a few tries must keep the main thread out; a KK that
    # dropped the GIL would let it in on every try (it runs for about 0.1 s).
    python_input = big[:20_000].tolist()
    python_kk = lambda: balancer._kk_sets(python_input, 64, True, len(python_input))  # noqa: E731
    assert not all(main_thread_ran_during(python_kk) for _ in range(3))


@pytest.mark.parametrize("use_native", [False, True])
@pytest.mark.parametrize(
    "workloads, num_parts, match",
    [
        ([1, 2], 0, "num_parts must be an int >= 1, got 0"),
        ([1, 2], -3, "got -3"),
        ([1, -2, 3], 2, r"workloads\[1\] = -2"),
        ([1, float("nan")], 2, r"workloads\[1\] = nan"),
        ([float("inf")], 2, r"workloads\[0\] = inf"),
        ([], 2, "workloads is empty"),
        ([[1, 2], [3, 4]], 2, r"workloads must be 1-D, got shape \(2, 2\)"),
        (["a", "b"], 2, "workloads must be a 1-D sequence of numbers"),
    ],
)
def test_bad_input_is_named(native, use_native, workloads, num_parts, match):
    with pytest.raises(ValueError, match=match):
        balancer.balance(workloads, num_parts, "kk_swap", native=use_native)


@pytest.mark.parametrize("use_native", [False, True])
@pytest.mark.parametrize("num_parts", [2.5, True, "2"])
def test_a_num_parts_that_is_no_int_is_a_type_error(native, use_native, num_parts):
    with pytest.raises(TypeError, match=f"num_parts must be an int >= 1, got {type(num_parts).__name__}"):
        balancer.balance([1, 2], num_parts, "kk_swap", native=use_native)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="method 'best' is not one of"):
        balancer.balance([1], 1, "best")
    for switch in ("native", "gpu", 1):
        with pytest.raises(TypeError, match=f"native must be True .* got {type(switch).__name__} {switch!r}"):
            balancer.balance([1], 1, "kk_swap", native=switch)
    with pytest.raises(ValueError, match="'greedy_lpt' has no native version"):
        balancer.balance([1], 1, "greedy_lpt", native=True)
    with pytest.raises(ValueError, match=r"missing \[2\], repeated \[1\]"):
        workload_measures.imbalance([1, 2, 3], [[0, 1], [1]])
    with pytest.raises(ValueError, match=r"out of range \[7\]"):
        balancer.refine_by_swaps([1, 2], [[0, 1, 7]])
    with pytest.raises(ValueError, match="lengths must be finite and >= 0; lengths\\[1\\] = -1"):
        workload_measures.attention_block_flops([2, -1], 8, 8)
    with pytest.raises(ValueError, match="max_length must be an int >= 1, got 0"):
        zipf_lengths(4, max_length=0)


@pytest.mark.parametrize("use_native", [False, True])
@pytest.mark.parametrize("method", ["karmarkar_karp", "kk_swap"])
def test_zero_workloads_leave_no_part_empty(native, use_native, method):
    # verl's KK guarantees a non-empty part per rank when items >= parts;
    # before the fix this gave [[1, 2], [], [0]].
    parts = balancer.balance([0, 0, 0], 3, method, native=use_native, equal_size=False)
    assert sorted(map(sorted, parts)) == [[0], [1], [2]]


@settings(max_examples=200, deadline=None)
@given(
    workloads=st.lists(st.sampled_from([0, 0, 0, 1, 2, 5]), min_size=1, max_size=24),
    num_parts=st.integers(1, 8),
    equal_size=st.booleans(),
)
def test_kk_never_leaves_a_part_empty_when_items_suffice(native, workloads, num_parts, equal_size):
    """Many zeros and ties (where sums alone cannot order the sets): with at
    least as many items as parts no part is empty, both backends agree."""
    for method in ("karmarkar_karp", "kk_swap"):
        python = balancer.balance(workloads, num_parts, method, native=False, equal_size=equal_size)
        assert_partition(python, len(workloads), num_parts, equal_size)
        if len(workloads) >= num_parts:
            assert all(python), (workloads, num_parts, python)
        assert balancer.balance(workloads, num_parts, method, native=True, equal_size=equal_size) == python


def _best_max_load(workloads, num_parts, equal_counts):
    """The optimum by brute force: every assignment of items to parts (with
    equal counts: only those whose counts differ by at most one)."""
    best = math.inf
    for assignment in itertools.product(range(num_parts), repeat=len(workloads)):
        counts = [assignment.count(p) for p in range(num_parts)]
        if equal_counts and max(counts) - min(counts) > 1:
            continue
        loads = [0.0] * num_parts
        for item, part in zip(workloads, assignment):
            loads[part] += item
        best = min(best, max(loads))
    return best


@pytest.mark.parametrize("num_items, num_parts", [(8, 2), (7, 3)])
def test_kk_swaps_is_optimal_on_most_tiny_batches_and_lpt_keeps_grahams_bound(num_items, num_parts):
    rng = random.Random(num_items * 10 + num_parts)
    instances = [[rng.paretovariate(1.5) for _ in range(num_items)] for _ in range(60)]
    optimal = 0
    for workloads in instances:
        best_equal = _best_max_load(workloads, num_parts, equal_counts=True)
        kk = max(
            sum(workloads[i] for i in p)
            for p in balancer.balance(workloads, num_parts, "kk_swap", native=False)
        )
        assert kk >= best_equal * (1 - 1e-12)  # never better than the optimum (that would be a bug)
        optimal += kk <= best_equal * (1 + 1e-12)
        # Graham: LPT without the count constraint is within 4/3 - 1/(3k) of that optimum
        best_free = _best_max_load(workloads, num_parts, equal_counts=False)
        lpt = balancer.balance(workloads, num_parts, "greedy_lpt", native=False, equal_size=False)
        assert max(sum(workloads[i] for i in p) for p in lpt) <= (4 / 3 - 1 / (3 * num_parts)) * best_free * (
            1 + 1e-12
        )
    assert optimal >= 0.9 * len(instances), f"KK + swaps optimal on {optimal} of {len(instances)}"

"""embnb.lab.balancing.core: the check notebook 04's page runs on its own KK and swaps, and the
trace table of its worked example, on inputs whose answers are worked out by hand."""

import random

from embnb.balancing import partition
from embnb.lab.balancing.core import page_core_agrees, trace_table


def test_page_core_agrees_with_the_librarys_partition_and_says_so_when_it_does_not():
    rng = random.Random(3)
    workloads = [rng.paretovariate(1.5) for _ in range(48)]
    library = partition.balance(workloads, 4, "kk_swap", native=False)
    kk = partition.balance(workloads, 4, "karmarkar_karp", native=False)
    assert page_core_agrees(workloads, 4, kk, library, library) == dict.fromkeys(
        ["kk_partition", "kk_swap_partition", "kk_swap_native", "kk_swap_max_load", "worker_ranks"], True
    )
    # a wrong page: plain KK where KK + swaps belongs, and ranks handed each other's parts
    wrong = page_core_agrees(workloads, 4, library, kk, library[::-1])
    assert wrong["kk_swap_partition"] is False and wrong["worker_ranks"] is False
    assert wrong["kk_swap_max_load"] is False  # KK's largest part is heavier than the swaps'
    assert wrong["kk_partition"] is False


def test_trace_table_of_the_worked_example_by_hand():
    # [13, 1, 100, 5, 40, 2, 8, 3] into 2: the states (40, 100) and (8, 13) have the widest
    # spreads (60, 5); the heaviest set of one merges with the lightest of the other
    workloads = [13, 1, 100, 5, 40, 2, 8, 3]
    first, second = [[100, [2]], [40, [4]]], [[13, [0]], [8, [6]]]
    merged = [[108, [2, 6]], [53, [4, 0]]]
    table = trace_table([(first, second, merged)], workloads)
    assert table.index.tolist() == [1]
    row = table.iloc[0]
    assert row["first (widest spread)"] == "100 [100]  40 [40]"
    assert row["merged"] == "108 [8, 100]  53 [13, 40]" and row["spread"] == 55

"""Notebook 02's page-core check: it passes a right core and fails a wrong one."""

import pytest
import torch

from embnb.lab.columnwise import core as reference


def by_counting(shard_ranks):
    """Shard s's position: the shards on lower ranks, then its own rank's earlier shards."""
    return [
        sum(r < rank for r in shard_ranks) + shard_ranks[:s].count(rank) for s, rank in enumerate(shard_ranks)
    ]


def stitch_with(permute_of):
    return lambda outputs, shard_ranks: torch.cat([outputs[p] for p in permute_of(shard_ranks)], dim=-1)


def arrival_order(shard_ranks):  # the classic mistake: the arrival order used as the permute
    return sorted(range(len(shard_ranks)), key=lambda s: (shard_ranks[s], s))


def test_all_placements_counts_every_assignment():
    assert len(reference.all_placements(3, 2)) == 2 + 4 + 8
    assert [0, 1, 1] in reference.all_placements(3, 2)


def test_a_right_core_passes_and_the_arrival_order_fails_both_checks():
    placements = reference.all_placements(4, 3)
    assert reference.page_core_agrees(by_counting, stitch_with(by_counting), placements) == {
        "permute": True,
        "stitch": True,
    }
    wrong = reference.page_core_agrees(arrival_order, stitch_with(arrival_order), placements)
    assert wrong == {"permute": False, "stitch": False}  # [1, 0, 0, 1] tells them apart


def test_a_stitch_that_ignores_the_permute_fails():
    naive = lambda outputs, shard_ranks: torch.cat(list(outputs), dim=-1)  # noqa: E731
    checks = reference.page_core_agrees(by_counting, naive, reference.all_placements(3, 2))
    assert checks == {"permute": True, "stitch": False}


def test_no_placement_is_an_error():
    with pytest.raises(ValueError, match="placements is empty"):
        reference.page_core_agrees(by_counting, stitch_with(by_counting), [])

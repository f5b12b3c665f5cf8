"""Notebook 02's check of the core it writes on its page: the permute and
the stitch it drives, against `embnb.columnwise.placement` on every
placement of a few shards."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch

from embnb.columnwise import placement

__all__ = ["all_placements", "page_core_agrees"]


def all_placements(max_shards: int, world_size: int) -> list[list[int]]:
    """Every shard_ranks of 1..max_shards shards on ranks 0..world_size-1."""
    return [list(p) for n in range(1, max_shards + 1) for p in itertools.product(range(world_size), repeat=n)]


def page_core_agrees(
    page_permute: Callable[[list[int]], list[int]],
    page_stitch: Callable[[list[torch.Tensor], list[int]], torch.Tensor],
    placements: Sequence[Sequence[int]],
) -> dict[str, bool]:
    """Whether notebook 02's page (`page_permute(shard_ranks)`,
    `page_stitch(rank_ordered_outputs, shard_ranks)`) agrees with the
    library on every placement: the permute with `cw_permute_indices`, and
    the stitched row with the row the shards were cut from (each column
    holds its own index, so any misplaced column shows)."""
    if not placements:
        raise ValueError("placements is empty: nothing to check")
    permute_ok = stitch_ok = True
    for shard_ranks in map(list, placements):
        permute_ok &= list(page_permute(shard_ranks)) == placement.cw_permute_indices(shard_ranks)
        row = torch.arange(2 * len(shard_ranks)).view(1, -1)  # two columns per shard
        arrived = placement.rank_ordered_shard_outputs(row, shard_ranks)
        stitch_ok &= torch.equal(page_stitch(arrived, shard_ranks), row)
    return {"permute": bool(permute_ok), "stitch": bool(stitch_ok)}

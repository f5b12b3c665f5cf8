"""Column-wise (CW) placement maths: which shard arrives where, and how to
stitch the shards back in column order. Pure torch; no torchrec, no ranks.

A table's columns are cut into shards, shard `s` placed on rank
`shard_ranks[s]`. Lookups come back ordered by rank, not by column: with
`shard_ranks = [0, 1, 0]` they arrive as (s0, s2, s1). The permute indices
(`[0, 2, 1]`) put them back in column order before the concatenation.

    >>> cw_permute_indices([0, 1, 0])
    [0, 2, 1]
    >>> rank_order([1, 0, 0, 1]), cw_permute_indices([1, 0, 0, 1])
    ([1, 2, 0, 3], [2, 0, 1, 3])
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from embnb._checks import check_int

__all__ = [
    "check_shard_ranks",
    "rank_order",
    "cw_permute_indices",
    "check_permute_answer",
    "equal_widths",
    "check_widths",
    "column_offsets",
    "stitch_cw",
    "concat_in_rank_order",
    "rank_ordered_shard_outputs",
]


def _per_shard_ints(name: str, values: Sequence[int], item: str, low: int) -> list[int]:
    """`values` (one int per shard, each >= `low`) as a list, else a TypeError or ValueError."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(
            f"{name} must be a list with a {item} per shard, got {type(values).__name__} {values!r}"
        )
    values = list(values)
    if not values:
        raise ValueError(f"{name} is empty: a column-wise table needs at least one shard")
    for s, value in enumerate(values):
        check_int(f"{name} {values}: the {item} of shard {s}", value, low=low)
    return values


def check_shard_ranks(shard_ranks: Sequence[int], world_size: int | None = None) -> list[int]:
    """`shard_ranks` as a list of ints, or an error naming what is wrong
    (TypeError for a wrong type, ValueError for a wrong value)."""
    ranks = _per_shard_ints("shard_ranks", shard_ranks, "rank", low=0)
    if world_size is not None:
        check_int("world_size", world_size, low=1)
        too_big = [r for r in ranks if r >= world_size]
        if too_big:
            raise ValueError(
                f"shard_ranks {ranks} has rank {too_big[0]} >= world_size {world_size}; "
                f"ranks must be in 0..{world_size - 1}"
            )
    return ranks


def rank_order(shard_ranks: Sequence[int]) -> list[int]:
    """Shard indices in the order their outputs arrive: by rank, then by shard
    index (a rank returns its shards in column order). [0, 1, 0] -> [0, 2, 1]."""
    ranks = check_shard_ranks(shard_ranks)
    return sorted(range(len(ranks)), key=lambda s: (ranks[s], s))


def cw_permute_indices(shard_ranks: Sequence[int], world_size: int | None = None) -> list[int]:
    """For each shard in column order, its position among the rank-ordered
    outputs: `stitched = cat([outputs[p] for p in permute], dim=1)`.

    torchrec's rule (ShardedEmbeddingCollection._generate_permute_indices_per_feature):
    position i of sorted(shard_ranks) belongs to the i-th shard, in column
    order, of the rank there. It is the inverse of `rank_order`; the two
    coincide for [0, 1, 0] but not for [1, 0, 0, 1] ([2, 0, 1, 3] vs [1, 2, 0, 3]).
    """
    order = rank_order(check_shard_ranks(shard_ranks, world_size))
    return [order.index(s) for s in range(len(order))]


def check_permute_answer(shard_ranks: Sequence[int], answer: Sequence[int] | None) -> str:
    """A reader's permute for `shard_ranks`, checked: what is right, or the
    first shard whose position is wrong and why. Never raises on the answer."""
    ranks = check_shard_ranks(shard_ranks)
    if answer is None:
        return f"write your permute for shard_ranks {ranks} (one position per shard) and run the cell again"
    expected = cw_permute_indices(ranks)
    answer = list(answer)
    if answer == expected:
        return f"correct: permute {expected}"
    if len(answer) != len(ranks):
        return f"not yet: {len(ranks)} shards need {len(ranks)} positions, got {len(answer)}"
    s = next(i for i, (a, e) in enumerate(zip(answer, expected)) if a != e)
    lower = sum(r < ranks[s] for r in ranks)
    earlier = ranks[:s].count(ranks[s])
    return (
        f"not yet: shard s{s} (rank {ranks[s]}) comes after the {lower} shard(s) on lower ranks and the "
        f"{earlier} earlier shard(s) on its own rank, not at position {answer[s]}"
    )


def equal_widths(embedding_dim: int, num_shards: int) -> list[int]:
    """torchrec's CW split: `num_shards` shards of `embedding_dim // num_shards` columns."""
    check_int("embedding_dim", embedding_dim, low=1)
    check_int("num_shards", num_shards, low=1)
    if embedding_dim % num_shards:
        raise ValueError(
            f"embedding_dim {embedding_dim} is not divisible into {num_shards} equal shards; "
            f"pick a shard count dividing it or give widths explicitly"
        )
    return [embedding_dim // num_shards] * num_shards


def check_widths(widths: Sequence[int], embedding_dim: int, num_shards: int | None = None) -> list[int]:
    """Shard widths as a list: positive ints summing to `embedding_dim`, else
    a TypeError (not a list of ints) or ValueError naming what is wrong."""
    widths = _per_shard_ints("widths", widths, "width", low=1)
    if num_shards is not None and len(widths) != num_shards:
        raise ValueError(f"widths {widths} has {len(widths)} entries for {num_shards} shards")
    if sum(widths) != embedding_dim:
        raise ValueError(f"widths {widths} sum to {sum(widths)}, not the embedding_dim {embedding_dim}")
    return widths


def column_offsets(widths: Sequence[int]) -> list[int]:
    """The first column of each shard: [2, 7, 3] -> [0, 2, 9]."""
    return list(itertools.accumulate(widths[:-1], initial=0))


def stitch_cw(rank_ordered_outputs: Sequence[torch.Tensor], shard_ranks: Sequence[int]) -> torch.Tensor:
    """Put rank-ordered shard outputs back in column order and concatenate them
    along the embedding (last) dim. Shards may have different widths."""
    ranks = check_shard_ranks(shard_ranks)
    if len(rank_ordered_outputs) != len(ranks):
        raise ValueError(
            f"got {len(rank_ordered_outputs)} shard outputs for shard_ranks {ranks} ({len(ranks)} shards)"
        )
    leading = {tuple(t.shape[:-1]) for t in rank_ordered_outputs}
    if len(leading) > 1:
        raise ValueError(f"shard outputs differ in their leading dims: {sorted(leading)}")
    permute = cw_permute_indices(ranks)
    return torch.cat([rank_ordered_outputs[p] for p in permute], dim=-1)


def concat_in_rank_order(rank_ordered_outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The naive stitching: concatenate in arrival order. Right only when
    `shard_ranks` is sorted; kept to show what goes wrong otherwise."""
    if not rank_ordered_outputs:
        raise ValueError("no shard outputs to concatenate")
    return torch.cat(list(rank_ordered_outputs), dim=-1)


def rank_ordered_shard_outputs(
    rows: torch.Tensor,
    shard_ranks: Sequence[int],
    widths: Sequence[int] | None = None,
) -> list[torch.Tensor]:
    """Cut looked-up `rows` ([n, D]) into column shards and return them in the
    order the ranks would send them back (`rank_order`); no communication."""
    ranks = check_shard_ranks(shard_ranks)
    dim = rows.shape[-1]
    widths = equal_widths(dim, len(ranks)) if widths is None else check_widths(widths, dim, len(ranks))
    shards = torch.split(rows, widths, dim=-1)
    return [shards[s] for s in rank_order(ranks)]

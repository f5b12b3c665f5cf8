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

from collections import defaultdict, deque
from collections.abc import Sequence

import torch

__all__ = [
    "check_shard_ranks",
    "rank_order",
    "cw_permute_indices",
    "equal_widths",
    "check_widths",
    "column_offsets",
    "stitch_cw",
    "concat_in_rank_order",
    "rank_ordered_shard_outputs",
]


def check_shard_ranks(shard_ranks: Sequence[int], world_size: int | None = None) -> list[int]:
    """`shard_ranks` as a list of ints, or a ValueError naming what is wrong."""
    if isinstance(shard_ranks, (str, bytes)) or not isinstance(shard_ranks, Sequence):
        raise ValueError(f"shard_ranks must be a list of ranks, got {shard_ranks!r}")
    ranks = list(shard_ranks)
    if not ranks:
        raise ValueError("shard_ranks is empty: a column-wise table needs at least one shard")
    bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int) or r < 0]
    if bad:
        raise ValueError(f"shard_ranks {ranks} has {bad[0]!r}: ranks must be ints >= 0")
    if world_size is not None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
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
    ranks = check_shard_ranks(shard_ranks, world_size)
    positions: dict[int, deque[int]] = defaultdict(deque)
    for position, rank in enumerate(sorted(ranks)):
        positions[rank].append(position)
    return [positions[rank].popleft() for rank in ranks]


def equal_widths(embedding_dim: int, num_shards: int) -> list[int]:
    """torchrec's CW split: `num_shards` shards of `embedding_dim // num_shards` columns."""
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 1:
        raise ValueError(f"embedding_dim must be an int >= 1, got {embedding_dim!r}")
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be an int >= 1, got {num_shards!r}")
    if embedding_dim % num_shards:
        raise ValueError(
            f"embedding_dim {embedding_dim} is not divisible into {num_shards} equal shards; "
            f"pick a shard count dividing it or give widths explicitly"
        )
    return [embedding_dim // num_shards] * num_shards


def check_widths(widths: Sequence[int], embedding_dim: int, num_shards: int | None = None) -> list[int]:
    """Shard widths as a list, or a ValueError: positive ints summing to `embedding_dim`."""
    if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence) or not widths:
        raise ValueError(f"widths must be a non-empty list of column counts, got {widths!r}")
    widths = list(widths)
    bad = [w for w in widths if isinstance(w, bool) or not isinstance(w, int) or w < 1]
    if bad:
        raise ValueError(f"widths {widths} has {bad[0]!r}: each shard needs an int >= 1 columns")
    if num_shards is not None and len(widths) != num_shards:
        raise ValueError(f"widths {widths} has {len(widths)} entries for {num_shards} shards")
    if sum(widths) != embedding_dim:
        raise ValueError(f"widths {widths} sum to {sum(widths)}, not the embedding_dim {embedding_dim}")
    return widths


def column_offsets(widths: Sequence[int]) -> list[int]:
    """The first column of each shard: [2, 7, 3] -> [0, 2, 9]."""
    offsets = [0]
    for w in widths[:-1]:
        offsets.append(offsets[-1] + w)
    return offsets


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

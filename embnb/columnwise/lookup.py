"""embnb's own column-wise lookup over a process group, any shard widths.

Every rank of the group calls `cw_sequence_lookup` together with its ids and
the column shards it holds (`local_shards` cuts them from a full weight): ids
go once to each rank holding a shard, each rank looks them up in its shards, the slices come back
in rank order and are stitched with the permute indices
(`embnb.columnwise.placement`). Unlike torchrec's EmbeddingCollection, the
shards may differ in width.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from embnb.collectives import exchange
from embnb.columnwise.placement import check_shard_ranks, check_widths, column_offsets, rank_order, stitch_cw

__all__ = ["local_shards", "cw_sequence_lookup"]


def local_shards(
    weight: torch.Tensor, shard_ranks: Sequence[int], widths: Sequence[int], rank: int
) -> dict[int, torch.Tensor]:
    """The column shards of `weight` ([num_embeddings, sum(widths)]) that
    `rank` holds, by shard index: what `cw_sequence_lookup` takes."""
    offsets = column_offsets(widths)
    return {
        s: weight[:, offsets[s] : offsets[s] + widths[s]].clone()
        for s in range(len(shard_ranks))
        if shard_ranks[s] == rank
    }


def cw_sequence_lookup(
    ids: torch.Tensor,
    local_shards: Mapping[int, torch.Tensor],
    shard_ranks: Sequence[int],
    widths: Sequence[int],
    group: dist.ProcessGroup | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Column-wise lookup of this rank's `ids` in one table, over `group`.

    `local_shards[s]` is column shard `s` ([num_embeddings, widths[s]]) for
    each shard this rank holds. Every rank of `group` calls this together:
    ids go to every rank (all_to_all), each rank looks them up in its shards,
    the shard outputs come back (all_to_all) in rank order and are stitched.
    `dtype` is the weights' (a rank holding no shard still receives rows).
    Returns (rows [len(ids), D], the rank-ordered shard outputs).
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    ranks = check_shard_ranks(shard_ranks, world_size)
    widths = check_widths(widths, sum(widths), len(ranks))
    mine = [s for s in range(len(ranks)) if ranks[s] == rank]
    if sorted(local_shards) != mine:
        raise ValueError(f"rank {rank} holds shards {sorted(local_shards)}; shard_ranks {ranks} say {mine}")
    wrong = {s: t.shape[1] for s, t in local_shards.items() if t.shape[1] != widths[s]}
    if wrong:
        raise ValueError(f"local shards have widths {wrong}; widths {widths} say otherwise")
    device = ids.device

    # 1. Each rank's ids go once to each rank holding a shard (CW shards
    # cover all rows); ranks without a shard get nothing. First the counts.
    owners = sorted(set(ranks))
    send_counts = [ids.numel() if r in owners else 0 for r in range(world_size)]
    counts = exchange(
        torch.tensor(send_counts, device=device), [1] * world_size, [1] * world_size, group
    ).tolist()
    all_ids = exchange(ids.repeat(len(owners)), send_counts, counts, group)

    # 2. Look them up in the shards held here, in shard (column) order: rows of all sources at once.
    if mine:
        send = torch.cat([local_shards[s][all_ids] for s in mine], dim=1)
    else:
        send = torch.empty(len(all_ids), 0, dtype=dtype, device=device)

    # 3. Send each requester its rows; they arrive ordered by owner rank, each owner's in column order.
    n = ids.numel()
    owner_widths = [sum(widths[s] for s in range(len(ranks)) if ranks[s] == r) for r in range(world_size)]
    recv = exchange(
        send.reshape(-1), [c * send.shape[1] for c in counts], [n * w for w in owner_widths], group
    )
    per_owner = torch.split(recv, [n * w for w in owner_widths])
    arrived = torch.cat([chunk.view(n, w) for chunk, w in zip(per_owner, owner_widths)], dim=1)
    rank_ordered = list(torch.split(arrived, [widths[s] for s in rank_order(ranks)], dim=1))
    return stitch_cw(rank_ordered, ranks), rank_ordered

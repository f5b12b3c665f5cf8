"""A row-wise sharded table's `[storage_rows, dim]` rows, whole (what `embnb.rowwise.convert_rows`
converts), gathered from the ranks (`gather_rows`) or loaded onto them (`load_rows`, through the module's
`load_state_dict`, so its routing check runs). torchrec holds such a table as a ShardedTensor whose rank r
shard is a contiguous block of storage rows. For tests, examples and checkpoint conversion of tables that
fit in one rank's memory; DCP is the path for big tables.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["weight_key", "gather_rows", "load_rows"]


def weight_key(module: nn.Module, table: str) -> str:
    """The state dict key of `table`'s weight in an EBC or EC (sharded or not; a routed table's key
    ends with its layout, `TableLayout.key_suffix`)."""
    keys = [k for k in module.state_dict() if k.split("@")[0].endswith(f".{table}.weight")]
    if len(keys) != 1:
        raise ValueError(f"table {table!r}: expected one weight in the state dict, found {keys}")
    return keys[0]


def gather_rows(module: nn.Module, table: str, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """`table`'s `[storage_rows, dim]` rows in storage order, on every rank. Collective."""
    weight = module.state_dict()[weight_key(module, table)]
    shards = weight.local_shards()
    if len(shards) != 1:
        raise ValueError(f"table {table!r} has {len(shards)} shards on this rank; row-wise sharding has one")
    local, offset = shards[0].tensor, int(shards[0].metadata.shard_offsets[0])
    world = dist.get_world_size(group)
    # on the rows' device: nccl gathers only CUDA tensors
    sizes = [torch.zeros(2, dtype=torch.int64, device=local.device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([offset, local.shape[0]], device=local.device), group=group)
    block = max(int(s[1]) for s in sizes)
    padded = local.new_zeros((block, local.shape[1]))
    padded[: local.shape[0]] = local.detach()
    blocks = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(blocks, padded, group=group)
    out = local.new_zeros((int(weight.size(0)), local.shape[1]))
    for (start, count), rows in zip((s.tolist() for s in sizes), blocks):
        out[start : start + count] = rows[:count]
    return out


def load_rows(module: nn.Module, table: str, rows: torch.Tensor) -> None:
    """Load `rows` (`[storage_rows, dim]`, storage order) into `table`; each rank takes its block."""
    state = module.state_dict()
    weight = state[weight_key(module, table)]
    if tuple(rows.shape) != tuple(weight.size()):
        held = tuple(weight.size())
        raise ValueError(f"table {table!r} holds {held} storage rows, got {tuple(rows.shape)}")
    for shard in weight.local_shards():
        start, count = int(shard.metadata.shard_offsets[0]), int(shard.metadata.shard_sizes[0])
        shard.tensor.detach().copy_(rows[start : start + count])
    module.load_state_dict(state)

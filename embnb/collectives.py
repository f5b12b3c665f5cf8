"""Collectives on a rank's process group, where the group's backend needs
their tensors: on the rank's GPU with nccl, through host memory with gloo
(also for ranks that share one GPU); `embnb.dist.collective_device` decides.

    all_reduce_(tensor)                        # summed over the group, in place
    all_gather_flat(tensor)                    # every rank's tensor, in rank order
    exchange(send, send_splits, recv_splits)   # all_to_all_single with uneven splits
    collective_seconds(fn, repeats)            # a collective timed alike on every rank
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from embnb.dist import collective_device, rank_device
from embnb.timing import Stopwatch

__all__ = ["all_reduce_", "all_gather_flat", "exchange", "collective_seconds"]


def all_reduce_(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum `tensor` over the group, in place, through host memory when the
    backend needs it there (ranks sharing a GPU talk over gloo)."""
    staged = tensor.to(collective_device(group))  # `tensor` itself where the backend takes it
    dist.all_reduce(staged, group=group)
    return tensor if staged is tensor else tensor.copy_(staged)


def all_gather_flat(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Every rank's `tensor` flattened and concatenated in rank order (same
    size on every rank), on `tensor`'s device: one all-gather into a flat
    tensor (gloo wants the flat form), through host memory when the
    backend needs it there."""
    flat = tensor.contiguous().view(-1).to(collective_device(group))
    out = flat.new_empty(dist.get_world_size(group) * flat.numel())
    _all_gather_into(out, flat, group=group)
    return out.to(tensor.device)


# torch 2.13 renamed all_gather_into_tensor to all_gather_single (the old name
# warns there); torch 2.11, the oldest supported, has only the old name.
_all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def exchange(
    send: torch.Tensor,
    send_splits: Sequence[int],
    recv_splits: Sequence[int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """`all_to_all_single` along dim 0 with uneven splits: rank r receives
    `recv_splits[s]` rows from each rank s, in rank order, on `send`'s
    device; through host memory when the backend needs it there."""
    where = collective_device(group)
    staged = send.contiguous().to(where)
    recv = staged.new_empty((sum(recv_splits), *send.shape[1:]))
    dist.all_to_all_single(recv, staged, list(recv_splits), list(send_splits), group=group)
    return recv.to(send.device)


def collective_seconds(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall time of `fn()` on this rank, `repeats` times, each call started
    together on every rank (a barrier first) and timed until the rank's GPU,
    if any, has run it."""
    times = []
    for _ in range(repeats):
        dist.barrier()
        with Stopwatch(rank_device()) as watch:  # the GPU waited for at the end (nothing queued before)
            fn()
        times.append(watch.wall_s)
    return times

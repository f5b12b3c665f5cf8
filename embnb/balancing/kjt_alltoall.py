"""Exchange a balanced batch with all-to-alls: each rank receives only the samples of its own part
(O(B) bytes), where the all-gather exchange (`allgather_kjt`, then `select_samples`) hands every rank
the whole global batch (O(W x B)). Every rank knows every part (they all ran the same KK), so
`alltoall_kjt` needs two all-to-alls: the samples' lengths, then their bytes. `exchange_bytes`
counts either exchange's bytes from sizes alone, for W = 64 without 64 ranks.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb._checks import check_int
from embnb.balancing.kjt_gather import (
    _as_bytes,
    _check_kjts,
    _from_bytes,
    _item_bytes,
    _unpack_kjt,
    allgather_kjt,
    random_kjts,
    same_kjt,
    select_samples,
)
from embnb.balancing.partition import balance, check_partition
from embnb.collectives import all_gather_flat, collective_seconds, exchange
from embnb.data import zipf_lengths
from embnb.dist import rank_device

__all__ = [
    "alltoall_kjt",
    "owners",
    "exchange_bytes",
    "batch_exchange_bytes",
    "zipf_batch",
    "compare_exchanges",
]

LENGTH_BYTES = 8  # lengths travel as int64


def owners(parts: Sequence[Sequence[int]], num_samples: int) -> torch.Tensor:
    """The part of each global sample (int64, `num_samples` long). Raises ValueError unless `parts`
    is a partition of range(num_samples) (`partition.check_partition`)."""
    check_partition(parts, num_samples)
    index = torch.as_tensor([i for part in parts for i in part], dtype=torch.int64)
    owner = torch.empty(num_samples, dtype=torch.int64)
    owner[index] = torch.repeat_interleave(torch.arange(len(parts)), torch.tensor([len(p) for p in parts]))
    return owner


def _keys_by_sample(kjts: Sequence[KeyedJaggedTensor]) -> torch.Tensor:
    """(stride, total keys) int64: the length of every key of every KJT, per sample."""
    return torch.cat([kjt.lengths().to(torch.int64).view(len(kjt.keys()), -1).t() for kjt in kjts], dim=1)


def alltoall_kjt(
    kjts: Sequence[KeyedJaggedTensor],
    dense: torch.Tensor,
    parts: Sequence[Sequence[int]],
    group: dist.ProcessGroup | None = None,
    stats: dict[str, int] | None = None,
) -> tuple[list[KeyedJaggedTensor], torch.Tensor]:
    """This rank's part of the global batch, in two all-to-alls.

    Every rank passes KJTs with the same keys, stride B and dtypes, `dense`
    with B rows, and the same `parts` (W lists of global sample indices,
    rank r's sample j being r * B + j). Returns the KJTs and dense rows of
    the samples `parts[rank]`, in that order: identical to
    `select_samples(allgather_kjt(kjts)[i], parts[rank])`. `stats`, when
    given, receives "received_bytes" (both receive buffers).
    """
    stride = _check_batch(kjts, dense)
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if len(parts) != world_size:
        raise ValueError(f"need one part per rank: {world_size} ranks, {len(parts)} parts")
    owner = owners(parts, world_size * stride)
    mine = owner[rank * stride : (rank + 1) * stride]
    send_order = torch.argsort(mine, stable=True)  # by destination, then by sample
    send_counts = torch.bincount(mine, minlength=world_size).tolist()
    mine_global = torch.as_tensor(list(parts[rank]), dtype=torch.int64)
    recv_counts = torch.bincount(mine_global // stride, minlength=world_size).tolist()

    # 1. lengths of every sample sent, one row per sample
    lengths = _keys_by_sample(kjts)
    recv_lengths = exchange(lengths[send_order].to(dense.device), send_counts, recv_counts, group).cpu()

    # 2. bytes, one chunk per destination: per KJT values then weights, then dense rows
    send, chunk_sizes = _pack(kjts, dense, send_order.split(send_counts))
    key_counts = [len(kjt.keys()) for kjt in kjts]
    per_source = [rows.split(key_counts, dim=1) for rows in recv_lengths.split(recv_counts)]
    dense_bytes = dense.shape[1] * dense.element_size()
    recv_sizes = [
        sum(int(block.sum()) * b for block, b in zip(blocks, _item_bytes(kjts))) + n * dense_bytes
        for blocks, n in zip(per_source, recv_counts)
    ]
    received = exchange(send.to(dense.device), chunk_sizes, recv_sizes, group)
    if stats is not None:
        stats["received_bytes"] = recv_lengths.numel() * LENGTH_BYTES + received.numel()

    # Rebuild: received samples are in ascending global order (by source, then index)
    sources = received.split(recv_sizes)
    offsets = [0] * world_size  # how far each source's bytes are read
    local = [
        _unpack_kjt(
            kjt, [blocks[i] for blocks in per_source], sources, offsets, len(mine_global), dense.device
        )
        for i, kjt in enumerate(kjts)
    ]
    local_dense = torch.cat(
        [
            _from_bytes(sources[s][offsets[s] :], dense.dtype).view(-1, dense.shape[1])
            for s in range(world_size)
        ]
    )
    order = torch.argsort(mine_global)
    if not torch.equal(order, torch.arange(len(order))):  # a part not in ascending order
        position = torch.empty_like(order)  # where each part entry sits among the received
        position[order] = torch.arange(len(order))
        local = [select_samples(kjt, position) for kjt in local]
        local_dense = local_dense[position.to(local_dense.device)]
    return local, local_dense


def _check_batch(kjts: Sequence[KeyedJaggedTensor], dense: torch.Tensor) -> int:
    """The batch's stride, once the KJTs and dense rows are checked to agree on it."""
    _check_kjts(kjts)
    stride = kjts[0].stride()
    for i, kjt in enumerate(kjts):
        if kjt.stride() != stride:
            raise ValueError(
                f"kjts[{i}] has stride {kjt.stride()}, kjts[0] has {stride}: need one batch size"
            )
    if dense.dim() != 2 or dense.shape[0] != stride:
        raise ValueError(f"dense must have one row per sample ({stride}), got shape {tuple(dense.shape)}")
    return stride


def _pack(
    kjts: Sequence[KeyedJaggedTensor], dense: torch.Tensor, per_destination: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, list[int]]:
    """The bytes sent, one chunk per destination (each KJT's values then
    weights, then the dense rows of the samples it gets), and each chunk's size."""
    dense_bytes = dense.shape[1] * dense.element_size()
    chunks, chunk_sizes = [], []
    for samples in per_destination:
        picked = [select_samples(kjt, samples) for kjt in kjts]
        pieces = [
            _as_bytes(t) for kjt in picked for t in (kjt.values(), kjt.weights_or_none()) if t is not None
        ]
        chunks += pieces + [_as_bytes(dense[samples.to(dense.device)]).reshape(-1)]
        chunk_sizes.append(sum(p.numel() for p in pieces) + samples.numel() * dense_bytes)
    send = torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.uint8, device=dense.device)
    return send, chunk_sizes


def exchange_bytes(
    lengths: torch.Tensor, item_bytes: Sequence[int], dense_row_bytes: int, parts: Sequence[Sequence[int]]
) -> dict[str, dict[str, float]]:
    """Bytes in a rank's receive buffers per exchange, from sizes alone.

    `lengths` is (W, B, keys): each rank's per-sample length of every key
    (all KJTs' keys side by side); `item_bytes[k]` the bytes per value of
    key k (value plus weight); `dense_row_bytes` a sample's dense row.

    - "allgather": every rank receives every rank's lengths (8 bytes each),
      W copies of the largest rank's payload (values, weights: the padded
      byte all-gather of `allgather_kjt`) and every rank's dense rows;
    - "alltoall": a rank receives the lengths, payload and dense rows of
      the samples of its own part (`alltoall_kjt`).

    Returns {"allgather": {"max": ..., "mean": ...}, "alltoall": {...}},
    max and mean over ranks; own data counted where the collective's
    receive buffer holds it (both do).
    """
    if lengths.dim() != 3 or lengths.shape[2] != len(item_bytes):
        raise ValueError(
            f"lengths must be (ranks, samples, keys) with {len(item_bytes)} keys, got {tuple(lengths.shape)}"
        )
    world_size, stride, num_keys = lengths.shape
    per_sample = (lengths.to(torch.int64) * torch.as_tensor(list(item_bytes))).sum(dim=2).reshape(-1)
    owner = owners(parts, world_size * stride)
    row = num_keys * LENGTH_BYTES + dense_row_bytes  # lengths and dense row of one sample
    payload_max = max(int(per_sample[r * stride : (r + 1) * stride].sum()) for r in range(world_size))
    allgather = world_size * stride * row + world_size * payload_max
    alltoall = [int((owner == d).sum()) * row + int(per_sample[owner == d].sum()) for d in range(world_size)]
    return {
        "allgather": {"max": float(allgather), "mean": float(allgather)},
        "alltoall": {"max": float(max(alltoall)), "mean": statistics.fmean(alltoall)},
    }


def batch_exchange_bytes(
    batches: Sequence[tuple[Sequence[KeyedJaggedTensor], torch.Tensor]], parts: Sequence[Sequence[int]]
) -> dict[str, dict[str, float]]:
    """`exchange_bytes` of W ranks' batches (rank r's KJTs and dense rows)."""
    kjts, dense = batches[0]
    per_key = [b for kjt, b in zip(kjts, _item_bytes(kjts)) for _ in kjt.keys()]
    lengths = torch.stack([_keys_by_sample(rank_kjts) for rank_kjts, _ in batches])
    return exchange_bytes(lengths, per_key, dense.shape[1] * dense.element_size(), parts)


def zipf_batch(
    rank: int, batch_size: int, num_kjts: int = 2, keys_per_kjt: int = 2, max_length: int = 512, seed: int = 0
) -> tuple[list[KeyedJaggedTensor], torch.Tensor, torch.Tensor]:
    """A rank's batch of sequence features: sample j has a Zipf(1.5) length
    L_j, and every key of every KJT holds L_j ids (an item history, its
    categories, ...); the last KJT is weighted. Returns (kjts, dense rows
    (B, 1) float64 labels, workloads = L_j as float64)."""
    check_int("batch_size", batch_size, low=1)
    lengths = zipf_lengths(batch_size, 1.5, max_length, seed * 100_003 + rank)
    kjts = random_kjts(rank, num_kjts, keys_per_kjt, batch_size, seed=seed, lengths=lengths)
    gen = torch.Generator().manual_seed(seed * 100_003 + rank)
    labels = torch.rand(batch_size, 1, generator=gen, dtype=torch.float64)
    return kjts, labels, lengths.to(torch.float64)


def compare_exchanges(
    rank: int,
    world_size: int,
    batch_size: int = 64,
    num_kjts: int = 2,
    keys_per_kjt: int = 2,
    max_length: int = 512,
    repeats: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """Per rank (under embnb.dist.launch): balance a `zipf_batch` with KK,
    then exchange it both ways. Returns whether both gave identical
    batches, each exchange's seconds (median, low, high over `repeats`
    after one warm-up) and the bytes `alltoall_kjt` received."""
    device = rank_device()
    kjts, dense, workloads = zipf_batch(rank, batch_size, num_kjts, keys_per_kjt, max_length, seed)
    kjts, dense = [kjt.to(device) for kjt in kjts], dense.to(device)
    parts = balance(all_gather_flat(workloads), world_size)
    mine = torch.tensor(parts[rank], device=device)

    def by_allgather() -> tuple[list[KeyedJaggedTensor], torch.Tensor]:
        gathered = allgather_kjt(kjts)
        return [select_samples(kjt, mine) for kjt in gathered], all_gather_flat(dense).view(-1, 1)[mine]

    stats: dict[str, int] = {}
    runs = {"allgather": by_allgather, "alltoall": lambda: alltoall_kjt(kjts, dense, parts, stats=stats)}
    outputs = {name: run() for name, run in runs.items()}  # also the warm-up
    seconds = {}
    for name, run in runs.items():
        times = collective_seconds(run, repeats)
        seconds[name] = {"median": statistics.median(times), "low": min(times), "high": max(times)}
    (a_kjts, a_dense), (b_kjts, b_dense) = outputs["allgather"], outputs["alltoall"]
    identical = torch.equal(a_dense, b_dense) and all(same_kjt(a, b) for a, b in zip(a_kjts, b_kjts))
    return {"identical": identical, "seconds": seconds, "alltoall_bytes": stats["received_bytes"]}

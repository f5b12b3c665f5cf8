"""Gather the KeyedJaggedTensors of a batch from every rank in two collectives.

Gathering key by key costs two or three collectives per key (lengths, values, weights), each with a
fixed latency that dominates small payloads. `allgather_kjt` sends every key's lengths in one
all-gather, then every KJT's values and weights as one byte buffer padded to the largest rank's (the
lengths say where each rank's bytes end), and returns what `allgather_kjt_per_key`, the naive
reference, returns.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import sys
from collections import Counter
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb._stderr import native_stderr
from embnb.collectives import all_gather_flat, collective_seconds
from embnb.dist import rank_device

__all__ = [
    "allgather_kjt",
    "allgather_kjt_per_key",
    "select_samples",
    "same_kjt",
    "count_collectives",
    "random_kjts",
    "compare_gathers",
]


def _check_kjts(kjts: Sequence[KeyedJaggedTensor]) -> None:
    if isinstance(kjts, KeyedJaggedTensor):
        raise TypeError("kjts must be a list of KeyedJaggedTensors; wrap a single one in a list")
    if len(kjts) == 0:
        raise ValueError("kjts is empty: nothing to gather")
    for i, kjt in enumerate(kjts):
        if not isinstance(kjt, KeyedJaggedTensor):
            raise TypeError(f"kjts[{i}] is a {type(kjt).__name__}, not a KeyedJaggedTensor")
        if kjt.variable_stride_per_key():
            raise ValueError(
                f"kjts[{i}] has a variable stride per key; only one batch size per KJT is supported"
            )


def _all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """(world_size, *tensor.shape): every rank's tensor, same size everywhere."""
    return all_gather_flat(tensor, group).view(dist.get_world_size(group), *tensor.shape)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)


def _from_bytes(buffer: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return buffer.clone().view(dtype)  # clone: aligned storage for the wider dtype


def _item_bytes(kjts: Sequence[KeyedJaggedTensor]) -> list[int]:
    """Bytes per value of each KJT: its value plus its weight, if weighted."""
    return [
        kjt.values().element_size()
        + (kjt.weights().element_size() if kjt.weights_or_none() is not None else 0)
        for kjt in kjts
    ]


def allgather_kjt(
    kjts: Sequence[KeyedJaggedTensor], group: dist.ProcessGroup | None = None
) -> list[KeyedJaggedTensor]:
    """Every rank's KJTs as one global batch each, with two collectives.

    Each rank passes the same number of KJTs, with the same keys, batch size
    (stride) and dtypes; the number of values per key may differ. Returns,
    for each KJT, one with stride world_size * stride where rank r's sample
    j is sample r * stride + j: identical to `allgather_kjt_per_key`.
    """
    _check_kjts(kjts)
    world_size = dist.get_world_size(group)
    # 1. All lengths at once; int64 so KJTs with int32 lengths can share it.
    lengths = torch.cat([kjt.lengths().to(torch.int64) for kjt in kjts])
    all_lengths = _all_gather(lengths, group)  # (world_size, total lengths)
    # 2. Values and weights of every KJT as bytes: rank r's chunk holds, per
    # KJT, its values then its weights; sizes follow from the lengths.
    sizes = [kjt.lengths().numel() for kjt in kjts]
    per_kjt_lengths = all_lengths.split(sizes, dim=1)
    value_counts = torch.stack(
        [lengths.sum(dim=1) for lengths in per_kjt_lengths], dim=1
    ).tolist()  # [rank][kjt]
    item_bytes = _item_bytes(kjts)
    rank_bytes = [sum(c * b for c, b in zip(counts, item_bytes)) for counts in value_counts]
    device = kjts[0].values().device
    local = torch.zeros(max(rank_bytes), dtype=torch.uint8, device=device)
    pieces = [_as_bytes(t) for kjt in kjts for t in (kjt.values(), kjt.weights_or_none()) if t is not None]
    if pieces:
        local_bytes = torch.cat(pieces)
        local[: local_bytes.numel()] = local_bytes
    all_bytes = _all_gather(local, group)  # (world_size, max bytes)
    return [
        _rebuild(kjt, j, per_kjt_lengths[j], all_bytes, value_counts, item_bytes, world_size)
        for j, kjt in enumerate(kjts)
    ]


def _rebuild(
    kjt: KeyedJaggedTensor,
    j: int,
    lengths: torch.Tensor,
    all_bytes: torch.Tensor,
    value_counts: list[list[int]],
    item_bytes: list[int],
    world_size: int,
) -> KeyedJaggedTensor:
    """KJT j of the global batch from every rank's lengths and bytes."""
    keys, stride = kjt.keys(), kjt.stride()
    value_size = kjt.values().element_size()
    has_weights = kjt.weights_or_none() is not None
    values, weights = [], []
    for rank in range(world_size):
        start = sum(c * b for c, b in zip(value_counts[rank][:j], item_bytes[:j]))
        count = value_counts[rank][j]
        end = start + count * value_size
        values.append(_from_bytes(all_bytes[rank, start:end], kjt.values().dtype))
        if has_weights:
            w_end = end + count * kjt.weights().element_size()
            weights.append(_from_bytes(all_bytes[rank, end:w_end], kjt.weights().dtype))
    # Every rank's lengths are key-major ([rank][key][sample]); the global
    # KJT wants [key][rank][sample]. The reorder is plain torch, so it runs
    # on any device: torchrec's KJT.permute needs fbgemm's kernels there.
    num_keys = len(keys)
    rank_key_lengths = lengths.reshape(world_size, num_keys, stride).to(torch.int64)
    key_rank_lengths = rank_key_lengths.transpose(0, 1)
    block_lengths = rank_key_lengths.sum(dim=2)  # [rank][key], values per block
    source_starts = (torch.cumsum(block_lengths.reshape(-1), 0) - block_lengths.reshape(-1)).view_as(
        block_lengths
    )
    # blocks in key-major order
    source = _segments(source_starts.t().reshape(-1), block_lengths.t().reshape(-1))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.cat(values)[source],
        lengths=key_rank_lengths.reshape(-1).to(kjt.lengths().dtype),
        weights=torch.cat(weights)[source] if has_weights else None,
        stride=stride * world_size,
    )


def allgather_kjt_per_key(
    kjts: Sequence[KeyedJaggedTensor], group: dist.ProcessGroup | None = None
) -> list[KeyedJaggedTensor]:
    """The naive reference: per KJT, per key, gather the lengths, then the
    values (padded to the largest rank's), then the weights: 2-3 collectives
    per key. Same result as `allgather_kjt`."""
    _check_kjts(kjts)
    gathered = []
    for kjt in kjts:
        lengths, values, weights = [], [], []
        for key in kjt.keys():
            jt = kjt[key]
            key_lengths = [t for t in _all_gather(jt.lengths(), group)]
            counts = [int(lengths.sum()) for lengths in key_lengths]
            lengths += key_lengths
            values += _gather_padded(jt.values(), counts, group)
            if jt.weights_or_none() is not None:
                weights += _gather_padded(jt.weights(), counts, group)
        gathered.append(
            KeyedJaggedTensor.from_lengths_sync(
                keys=kjt.keys(),
                values=torch.cat(values),
                lengths=torch.cat(lengths),
                weights=torch.cat(weights) if weights else None,
                stride=kjt.stride() * dist.get_world_size(group),
            )
        )
    return gathered


def _gather_padded(tensor: torch.Tensor, counts: list[int], group) -> list[torch.Tensor]:
    padded = torch.zeros(max(counts), dtype=tensor.dtype, device=tensor.device)
    padded[: tensor.numel()] = tensor
    return [row[:count] for row, count in zip(_all_gather(padded, group), counts)]


def same_kjt(a: KeyedJaggedTensor, b: KeyedJaggedTensor) -> bool:
    """Whether two KJTs hold the same keys, stride, lengths, values and weights."""
    return (
        a.keys() == b.keys()
        and a.stride() == b.stride()
        and torch.equal(a.lengths(), b.lengths())
        and torch.equal(a.values(), b.values())
        and (a.weights_or_none() is None) == (b.weights_or_none() is None)
        and (a.weights_or_none() is None or torch.equal(a.weights(), b.weights()))
    )


def _segments(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The indices of segments, one after another: segment s is starts[s], ..., starts[s] +
    lengths[s] - 1 (int64; an output index i of segment s reads starts[s] + i - its output start)."""
    lengths = lengths.to(torch.int64)
    out_starts = torch.cumsum(lengths, 0) - lengths
    offsets = torch.arange(int(lengths.sum()), device=lengths.device)
    return torch.repeat_interleave(starts - out_starts, lengths) + offsets


def select_samples(kjt: KeyedJaggedTensor, indices: torch.Tensor | Sequence[int]) -> KeyedJaggedTensor:
    """The samples `indices` of `kjt` (every key), in that order."""
    stride, num_keys = kjt.stride(), len(kjt.keys())
    indices = torch.as_tensor(indices, dtype=torch.int64, device=kjt.values().device)
    if indices.numel() and (indices.min() < 0 or indices.max() >= stride):
        bad = indices[(indices < 0) | (indices >= stride)][0].item()
        raise ValueError(f"sample index {bad} is outside the batch of {stride} samples")
    lengths = kjt.lengths().view(num_keys, stride)
    # Offsets from the lengths in torch: KJT.offsets() needs fbgemm's kernels on the device.
    flat = kjt.lengths().to(torch.int64)
    starts = (torch.cumsum(flat, 0) - flat).view(num_keys, stride)
    picked_lengths = lengths[:, indices].reshape(-1)
    source = _segments(starts[:, indices].reshape(-1), picked_lengths)
    weights = kjt.weights_or_none()
    return KeyedJaggedTensor.from_lengths_sync(
        keys=kjt.keys(),
        values=kjt.values()[source],
        lengths=picked_lengths,
        weights=weights[source] if weights is not None else None,
        stride=indices.numel(),
    )


@contextlib.contextmanager
def count_collectives() -> Iterator[Counter]:
    """Count the collectives that run inside the block, by the profiler's
    "gloo:..." / "nccl:..." communication events (one per collective call).

        with count_collectives() as calls:
            allgather_kjt(kjts)
        calls["all_gather"]  # -> 2
    """
    from torch.profiler import ProfilerActivity, profile

    calls: Counter = Counter()
    prof = profile(activities=[ProfilerActivity.CPU])
    # Kineto writes a "USDT: ... profiler_start/stop" line to stderr at both
    # ends: drop those two, keep anything else it says; the block runs unfiltered.
    with _without_stderr_lines("USDT:"):
        prof.__enter__()
    try:
        yield calls
    finally:
        with _without_stderr_lines("USDT:"):
            prof.__exit__(None, None, None)
    backends = ("gloo:", "nccl:")
    calls.update(event.name.split(":", 1)[1] for event in prof.events() if event.name.startswith(backends))


@contextlib.contextmanager
def _without_stderr_lines(prefix: str) -> Iterator[None]:
    """Pass on every line native code writes to stderr in the block, but
    those that start with `prefix`."""
    with native_stderr() as lines:
        yield
    kept = [line for line in lines if not line.startswith(prefix)]
    if kept:
        sys.stderr.write("".join(kept))


def random_kjts(
    rank: int,
    num_kjts: int = 3,
    keys_per_kjt: int = 4,
    batch_size: int = 64,
    max_length: int = 8,
    seed: int = 0,
    weighted: bool = True,
    lengths: torch.Tensor | None = None,
) -> list[KeyedJaggedTensor]:
    """A batch of `num_kjts` KJTs with `keys_per_kjt` keys each, random
    lengths in [0, max_length] (or, given `lengths`, one per sample, those
    of every key), random int64 ids below 2**40, the last KJT weighted
    (float32 in [0, 1)) when `weighted`."""
    gen = torch.Generator().manual_seed(seed * 100_003 + rank)
    kjts = []
    for j in range(num_kjts):
        if lengths is None:
            key_lengths = torch.randint(0, max_length + 1, (keys_per_kjt * batch_size,), generator=gen)
        else:
            key_lengths = lengths.repeat(keys_per_kjt)
        num_values = int(key_lengths.sum())
        kjts.append(
            KeyedJaggedTensor.from_lengths_sync(
                keys=[f"f{j}_{k}" for k in range(keys_per_kjt)],
                values=torch.randint(0, 2**40, (num_values,), generator=gen),
                lengths=key_lengths,
                weights=torch.rand(num_values, generator=gen) if weighted and j == num_kjts - 1 else None,
            )
        )
    return kjts


def compare_gathers(
    rank: int,
    world_size: int,
    num_kjts: int = 3,
    keys_per_kjt: int = 4,
    batch_size: int = 64,
    repeats: int = 5,
    seed: int = 0,
) -> dict[str, object]:
    """Per rank (under embnb.dist.launch): gather a `random_kjts` batch with
    `allgather_kjt` and `allgather_kjt_per_key`; the collective calls of
    each, whether the results are identical, and each one's median seconds."""
    device = rank_device()
    kjts = [kjt.to(device) for kjt in random_kjts(rank, num_kjts, keys_per_kjt, batch_size, seed=seed)]
    results, calls, seconds = {}, {}, {}
    for name, gather in (("fused", allgather_kjt), ("per_key", allgather_kjt_per_key)):
        with count_collectives() as counted:
            results[name] = gather(kjts)
        calls[name] = sum(counted.values())
        seconds[name] = statistics.median(collective_seconds(functools.partial(gather, kjts), repeats))
    identical = all(same_kjt(a, b) for a, b in zip(results["fused"], results["per_key"]))
    return {
        "rank": rank,
        "calls": calls,
        "seconds": seconds,
        "identical": identical,
        "num_kjts": num_kjts,
        "keys_per_kjt": keys_per_kjt,
    }

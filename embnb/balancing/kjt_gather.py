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
    per_kjt_lengths = all_lengths.split([kjt.lengths().numel() for kjt in kjts], dim=1)
    item_bytes = _item_bytes(kjts)
    rank_bytes = [
        sum(int(lengths[rank].sum()) * b for lengths, b in zip(per_kjt_lengths, item_bytes))
        for rank in range(world_size)
    ]
    local = torch.zeros(max(rank_bytes), dtype=torch.uint8, device=kjts[0].values().device)
    pieces = [_as_bytes(t) for kjt in kjts for t in (kjt.values(), kjt.weights_or_none()) if t is not None]
    if pieces:
        local_bytes = torch.cat(pieces)
        local[: local_bytes.numel()] = local_bytes
    sources = list(_all_gather(local, group))  # (world_size, max bytes): rank r's chunk
    offsets = [0] * world_size
    return [  # every rank's samples of a key in rank order: the global batch
        _unpack_kjt(
            kjt,
            [rank_lengths.view(len(kjt.keys()), -1).t() for rank_lengths in lengths],
            sources,
            offsets,
            world_size * kjt.stride(),
            local.device,
        )
        for kjt, lengths in zip(kjts, per_kjt_lengths)
    ]


def _unpack_kjt(
    kjt: KeyedJaggedTensor,
    blocks: Sequence[torch.Tensor],
    sources: Sequence[torch.Tensor],
    offsets: list[int],
    stride: int,
    device: torch.device,
) -> KeyedJaggedTensor:
    """One KJT of the samples every source sent, key by key in source order (plain
    torch, so any device: torchrec's KJT.permute needs fbgemm's kernels there):
    `blocks[s]` holds the lengths (samples from source s, keys) and `sources[s]`
    the bytes, read from `offsets[s]` on (advanced past this KJT's values and
    weights)."""
    values, weights, key_lengths = [], [], []
    for s, block in enumerate(blocks):
        count, per_key = int(block.sum()), block.sum(0).tolist()
        start = offsets[s]
        end = start + count * kjt.values().element_size()
        values.append(_from_bytes(sources[s][start:end], kjt.values().dtype).split(per_key))
        if kjt.weights_or_none() is not None:
            w_end = end + count * kjt.weights().element_size()
            weights.append(_from_bytes(sources[s][end:w_end], kjt.weights().dtype).split(per_key))
            end = w_end
        offsets[s] = end
        key_lengths.append(block.t())
    keys = range(len(kjt.keys()))

    def by_key(per_source: list) -> torch.Tensor:  # key-major, then source
        return torch.cat([per_source[s][f] for f in keys for s in range(len(blocks))])

    return KeyedJaggedTensor.from_lengths_sync(
        keys=kjt.keys(),
        values=by_key(values),
        lengths=by_key(key_lengths).to(kjt.lengths().dtype).to(device),
        weights=by_key(weights) if weights else None,
        stride=stride,
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
    return {"calls": calls, "seconds": seconds, "identical": identical}

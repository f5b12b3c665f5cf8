"""The balanced shuffle's signature gather (`embnb.balancing.shuffle`): before
any collective whose sizes depend on the batch, every rank all-gathers
(batch size, checksum), 2 int64 per rank, and checks what every rank sent,
so every rank raises the same error or none does. A rank with no batch to
shuffle sends a code instead of a size: `NO_BATCH` where its batches ended,
`TROUBLE` where its input is bad or its loader raised; only then do the ranks
gather each rank's description (one `all_gather_object`), so the normal path
costs one small gather per shuffle and nothing more.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb.collectives import all_gather_flat

NO_BATCH = -1  # the batch size a rank whose batches ended sends
TROUBLE = -2  # the batch size a rank sends whose input is bad or whose loader raised


class RanksDiffer(ValueError):
    """A check of values every rank gathered: it fails alike on every rank,
    so `finish()` can raise it later, as a ValueError, on every rank."""


def input_problem(kjt: Any, dense: Any, workloads: Any, rank: int) -> str | None:
    """What is wrong with `start()`'s input on `rank` (None: nothing): a KJT
    of `stride` samples, `dense` float rows of shape (stride, width),
    `workloads` of shape (stride,)."""
    wanted = {"kjt": KeyedJaggedTensor, "dense": torch.Tensor, "workloads": torch.Tensor}
    given = {"kjt": kjt, "dense": dense, "workloads": workloads}
    wrong = [
        f"{name} of type {type(given[name]).__name__}"
        for name, kind in wanted.items()
        if not isinstance(given[name], kind)
    ]
    if wrong:
        return (
            f"rank {rank} passed {', '.join(wrong)}, where start() needs a KeyedJaggedTensor, "
            "dense rows and workloads as tensors"
        )
    stride = kjt.stride()
    if workloads.shape == (stride,) and dense.dim() == 2 and dense.shape[0] == stride:
        return None
    return (
        f"rank {rank} passed stride {stride}, workloads {tuple(workloads.shape)}, "
        f"dense {tuple(dense.shape)}, "
        "where start() needs one workload and one dense row per sample (workloads of shape (stride,), "
        "dense of shape (stride, width))"
    )


def gather_sizes(
    group: dist.ProcessGroup | None, size: int, checksum: int = 0, device: torch.device | None = None
) -> torch.Tensor:
    """Every rank's (batch size or code, signature checksum): one small
    all-gather; int64 (ranks, 2) on the CPU."""
    mine = torch.tensor([size, checksum], dtype=torch.int64, device=device)
    return all_gather_flat(mine, group).view(-1, 2).cpu()


def check_sizes(
    gathered: torch.Tensor, step: int, group: dist.ProcessGroup | None, problem: str | None
) -> None:
    """The same RanksDiffer on every rank where some rank sent `TROUBLE` (then
    every rank gathers each one's `problem`, this rank's included), where some
    rank has no batch (`NO_BATCH`) or where the batch sizes differ: every
    rank sees the same sizes, so every rank takes the same branch."""
    sizes = gathered[:, 0].tolist()
    if TROUBLE in sizes:
        problems: list[Any] = [None] * len(sizes)
        dist.all_gather_object(problems, problem, group=group)  # every rank is here
        described = "; ".join(p for p in problems if p is not None)
        raise RanksDiffer(f"every rank stops at batch {step}: {described}")
    ended = [rank for rank, size in enumerate(sizes) if size == NO_BATCH]
    if ended and len(ended) < len(sizes):
        going = [rank for rank in range(len(sizes)) if rank not in ended]
        raise RanksDiffer(
            f"ranks {ended} have no batch {step} (their batches ended) while ranks {going} have one; "
            "BalancedShuffle needs as many batches on every rank (e.g. a DistributedSampler with "
            "drop_last=True and DataLoader(drop_last=True))"
        )
    if len(set(sizes)) > 1:
        raise RanksDiffer(
            f"batch sizes differ across ranks: {sizes} samples on ranks 0..{len(sizes) - 1}; "
            "BalancedShuffle needs the same number of samples on every rank (drop or pad the "
            "partial last batch, e.g. DataLoader(drop_last=True))"
        )


def check_same_batch(
    kjt: KeyedJaggedTensor, dense: torch.Tensor, step: int, group: dist.ProcessGroup | None
) -> None:
    """One small all-gather of (batch size, a checksum of keys, dtypes and
    dense width): every rank raises the same RanksDiffer where they differ,
    before any collective whose sizes would not match."""
    weights = None if kjt.weights_or_none() is None else kjt.weights().dtype
    signature = (
        f"keys {kjt.keys()}, values {kjt.values().dtype}, lengths {kjt.lengths().dtype}, "
        f"weights {weights}, dense width {dense.shape[1]} {dense.dtype}"
    )
    gathered = gather_sizes(group, kjt.stride(), zlib.crc32(signature.encode()), dense.device)
    check_sizes(gathered, step, group, None)
    if len(set(gathered[:, 1].tolist())) > 1:
        signatures: list[Any] = [None] * len(gathered)
        dist.all_gather_object(signatures, signature, group=group)  # every rank is here
        described = "; ".join(f"rank {r}: {s}" for r, s in enumerate(signatures))
        raise RanksDiffer(
            f"batches differ across ranks ({described}); BalancedShuffle needs the same KJT keys, "
            "dtypes and dense width on every rank"
        )

"""The balanced shuffle: move every sample of the global batch to the rank
that Karmarkar-Karp (`embnb.balancing.partition.balance`) assigns it to.

1. `start(kjt, dense, workloads)`: one all-gather of every rank's per-sample
   workloads (with the dense per-sample features and labels riding along),
   then KK, in a one-worker background thread when `overlap` is on;
2. the caller runs the current step's forward and backward meanwhile;
3. `finish()`: wait for the parts, all-gather the KJTs in two collectives
   (`embnb.balancing.kjt_gather.allgather_kjt`) and keep this rank's samples.

Every rank computes the same parts from the same gathered workloads, so no
broadcast is needed. The native KK releases the GIL, so the thread does not
stall the training loop's Python; the pure-Python KK does (compare both).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb._checks import check_choice
from embnb.balancing.kjt_gather import allgather_kjt, select_samples
from embnb.balancing.partition import METHODS, balance
from embnb.balancing.timeline import Timeline
from embnb.dist import all_gather_flat

__all__ = ["BalancedShuffle"]


class BalancedShuffle:
    """All-gather workloads, KK (in a background thread with `overlap`),
    exchange samples. Use as a context manager so the thread is shut down.

        with BalancedShuffle(timeline, overlap=True) as shuffle:
            shuffle.start(kjt, dense, workloads, step)   # returns at once
            ...                                          # forward, backward
            kjt, dense = shuffle.finish()                # this rank's part
    """

    def __init__(
        self,
        timeline: Timeline,
        overlap: bool = True,
        method: str = "kk_swap",
        kk_backend: str = "auto",
        group: dist.ProcessGroup | None = None,
        fail_in_kk: bool = False,
    ) -> None:
        check_choice("method", method, tuple(METHODS))
        self.timeline, self.overlap, self.method = timeline, overlap, method
        self.kk_backend, self.group, self.fail_in_kk = kk_backend, group, fail_in_kk
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embnb-kk") if overlap else None
        self._pending: tuple | None = None

    def __enter__(self) -> BalancedShuffle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def _partition(self, workloads: torch.Tensor, step: int, iteration: int) -> list[list[int]]:
        thread = "kk" if threading.current_thread() is not threading.main_thread() else "main"
        start = time.perf_counter()
        if self.fail_in_kk:
            raise RuntimeError(f"deliberate failure in the KK thread of rank {self.rank} at step {step}")
        parts = balance(workloads, self.world_size, self.method, self.kk_backend)
        self.timeline.add("kk", step, start, time.perf_counter(), thread=thread, iteration=iteration)
        return parts

    def start(self, kjt: KeyedJaggedTensor, dense: torch.Tensor, workloads: torch.Tensor, step: int) -> None:
        """Gather every rank's workloads (and dense rows); start KK."""
        if self._pending is not None:
            raise RuntimeError("start() called twice without finish()")
        if workloads.shape != (kjt.stride(),) or dense.shape[0] != kjt.stride():
            raise ValueError(
                f"need one workload and one dense row per sample: stride {kjt.stride()}, "
                f"workloads {tuple(workloads.shape)}, dense {tuple(dense.shape)}"
            )
        with self.timeline.span("gather_workloads", step):
            rows = torch.cat([workloads.to(torch.float64).unsqueeze(1), dense.to(torch.float64)], dim=1)
            gathered = all_gather_flat(rows, self.group).view(-1, rows.shape[1])
            all_workloads = gathered[:, 0].cpu().clone()  # KK runs on the CPU
        if self.overlap:
            parts: Future | list = self._executor.submit(
                self._partition, all_workloads, step, self.timeline.iteration
            )
        else:
            parts = self._partition(all_workloads, step, self.timeline.iteration)
        self._pending = (kjt, gathered[:, 1:].to(dense.dtype), parts, step)

    def finish(self) -> tuple[KeyedJaggedTensor, torch.Tensor]:
        """Wait for KK, then exchange: this rank's KJT and dense rows."""
        if self._pending is None:
            raise RuntimeError("finish() called before start()")
        kjt, all_dense, parts, step = self._pending
        self._pending = None
        if isinstance(parts, Future):
            with self.timeline.span("wait_kk", step):
                parts = parts.result()  # re-raises an error of the KK thread
        with self.timeline.span("exchange", step, all_dense.device):
            mine = torch.tensor(parts[self.rank], dtype=torch.int64, device=all_dense.device)
            (global_kjt,) = allgather_kjt([kjt], self.group)
            local = select_samples(global_kjt, mine)
        return local, all_dense[mine]

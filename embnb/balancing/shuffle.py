"""The balanced shuffle: move every sample of the global batch to the rank that Karmarkar-Karp
(`embnb.balancing.partition.balance`) assigns it to, in three phases: gather_workloads (one
all-gather of every rank's per-sample workloads; with the "allgather" exchange the dense rows ride
along), kk (every rank computes the same parts, so nothing is broadcast) and exchange (`allgather_kjt`
then this rank's samples, or `alltoall_kjt`). With `overlap` they run in a background worker for
batch s+1 while step s computes.

docs/balancing.md gives, with their sources, the rules the class enforces: where the collectives may
be issued (`collective_thread`: a worker on the default group aborts gloo, NCCL refuses two threads;
"caller" is NVIDIA recsys-examples' design, commit 7cf45752), and the signature gather that makes
every rank raise the same ValueError from `finish()` where the ranks' batches differ or a loader ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch as TorchrecBatch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb._checks import check_bool, check_choice, check_native
from embnb.balancing.kjt_alltoall import alltoall_kjt
from embnb.balancing.kjt_gather import allgather_kjt, select_samples
from embnb.balancing.partition import METHODS, balance
from embnb.balancing.timeline import Timeline
from embnb.collectives import all_gather_flat
from embnb.dist import collective_device

__all__ = ["EXCHANGES", "COLLECTIVE_THREADS", "BalancedShuffle"]

EXCHANGES = ("allgather", "alltoall")
COLLECTIVE_THREADS = ("auto", "worker", "caller")
_NO_BATCH = -1  # the batch size a rank whose batches ended sends
_END = object()  # what batches() takes from a loader that has ended
Batch = tuple[KeyedJaggedTensor, torch.Tensor]


class _RanksDiffer(ValueError):
    """A check of values every rank gathered: it fails alike on every rank,
    so `finish()` can raise it later, as a ValueError, on every rank."""


class BalancedShuffle:
    """Gather workloads, KK, exchange samples: in a background worker with
    `overlap`. Use as a context manager so the worker is shut down.

        group = dist.new_group(backend="gloo")   # the shuffle's own, made once on every rank
        with BalancedShuffle(timeline, overlap=True, group=group) as shuffle:
            shuffle.start(kjt, dense, workloads, step)   # returns at once
            ...                                          # forward, backward, optimizer
            kjt, dense = shuffle.finish()

    Args:
        timeline: where each phase's span is recorded (a new one if None).
        overlap: run the shuffle in a background worker between `start()` and
            `finish()`; False runs it inside `start()`.
        method: a name of `embnb.balancing.partition.METHODS`.
        native_kk: KK natively: None where it loads, True or an error, False Python.
        exchange: "allgather" or "alltoall".
        group: the process group of the shuffle's collectives (None: the default
            group). With `overlap` and "worker" it must not be the default group
            unless `step_collectives=False`.
        step_collectives: whether the training step may issue collectives on
            `group` while the shuffle runs (between `start()` and `finish()`).
            Pass False only for a loop that issues none there: no
            DistributedModelParallel, DDP or SyncBatchNorm forward or backward.
        collective_thread: with `overlap`, where the collectives are issued:
            "worker" (all phases in the worker), "caller" (gathers in `start()`
            and the exchange in `finish()` on the caller's thread, KK alone in
            the worker; safe on any group) or "auto" ("caller" on an NCCL
            group, else "worker").
    """

    def __init__(
        self,
        timeline: Timeline | None = None,
        overlap: bool = True,
        method: str = "kk_swap",
        native_kk: bool | None = None,
        exchange: str = "allgather",
        group: dist.ProcessGroup | None = None,
        step_collectives: bool = True,
        collective_thread: str = "auto",
    ) -> None:
        check_choice("method", method, tuple(METHODS))
        check_choice("exchange", exchange, EXCHANGES)
        check_bool("overlap", overlap)
        check_bool("step_collectives", step_collectives)
        check_choice("collective_thread", collective_thread, COLLECTIVE_THREADS)
        nccl = "nccl" in str(dist.get_backend(group))
        if collective_thread == "auto":
            collective_thread = "caller" if nccl else "worker"
        in_worker = overlap and collective_thread == "worker" and step_collectives
        if in_worker and (group is None or group == dist.group.WORLD):
            raise ValueError(
                "BalancedShuffle(overlap=True) on the default process group: its worker's collectives "
                "would interleave with the training step's on the same group (DistributedModelParallel's "
                "all-to-alls, DDP's all-reduce), which aborts gloo and can hang NCCL. Pass a group of its "
                'own, made once on every rank: group=dist.new_group(backend="gloo"); or issue the '
                'collectives on the caller\'s thread: collective_thread="caller"; or, if the step '
                "issues no collective between start() and finish(), say so with step_collectives=False"
            )
        if in_worker and nccl:
            raise ValueError(
                f"BalancedShuffle(collective_thread='worker') on an NCCL group ({dist.get_backend(group)}): "
                "NCCL is not safe with a second communicator driven from another thread while the step "
                'issues its own collectives; pass collective_thread="caller", or a gloo group of its own: '
                'group=dist.new_group(backend="gloo")'
            )
        self.timeline = Timeline() if timeline is None else timeline  # when each phase ran
        self.overlap, self.method = overlap, method
        self.native_kk = check_native("native_kk", native_kk)
        self.exchange, self.group = exchange, group
        self.collective_thread = collective_thread  # "worker" or "caller"
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="embnb-shuffle") if overlap else None
        self._side_streams: dict[threading.Thread, torch.cuda.Stream] = {}  # on a GPU, per thread
        self._pending: _Pending | None = None

    def __enter__(self) -> BalancedShuffle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)

    def start(self, kjt: KeyedJaggedTensor, dense: torch.Tensor, workloads: torch.Tensor, step: int) -> None:
        """Shuffle this batch: in the worker with `overlap`, else now. Where
        the ranks' batches differ, `finish()` raises (in every mode)."""
        if self._pending is not None:
            raise RuntimeError("start() called twice without finish()")
        if workloads.shape != (kjt.stride(),) or dense.dim() != 2 or dense.shape[0] != kjt.stride():
            raise ValueError(
                f"need one workload and one dense row per sample: stride {kjt.stride()}, "
                f"workloads {tuple(workloads.shape)}, dense {tuple(dense.shape)}"
            )
        ready = _recorded_event(dense.device)  # the batch is ready on the caller's stream
        try:
            if self._worker is None:
                self._pending = _Pending(step, done=self._shuffle(kjt, dense, workloads, step, ready))
            elif self.collective_thread == "worker":
                self._pending = _Pending(
                    step, future=self._worker.submit(self._shuffle, kjt, dense, workloads, step, ready)
                )
            else:  # caller: the gather now, KK in the worker, the exchange in finish()
                with self._side_stream(dense.device, ready):
                    gathered = self._gather(kjt, dense, workloads, step)
                    gathered_event = _recorded_event(dense.device)
                future = self._worker.submit(self._kk, gathered, step, gathered_event)
                self._pending = _Pending(step, future=future, inputs=(kjt, dense, gathered))
        except _RanksDiffer as error:  # every rank failed this check: raised by finish(), as in the worker
            self._pending = _Pending(step, error=error)

    def finish(self) -> Batch:
        """This rank's KJT and dense rows (waits for the worker, re-raising its error)."""
        if self._pending is None:
            raise RuntimeError("finish() called before start()")
        if self._pending.ended:
            raise RuntimeError(
                "finish() with no batch started: an abandoned batches() left its end-of-data check"
            )
        shuffled = self._finish()
        assert shuffled is not None  # only an end-of-data check gives None
        return shuffled

    def _finish(self) -> Batch | None:
        """The pending shuffle's batch; None for an end-of-data check that every
        rank passed (all ended); the ValueError every rank raises where the
        ranks' batches differ or some rank's ended."""
        pending, self._pending = self._pending, None
        assert pending is not None
        try:
            if pending.error is not None:
                raise pending.error
            if pending.ended:
                if pending.future is not None:
                    pending.future.result()
                return None
            if pending.done is None:
                with self.timeline.span("wait", pending.step):
                    result = pending.future.result()
        except _RanksDiffer as error:
            raise ValueError(str(error)) from None
        if pending.done is not None:
            kjt, dense, made = pending.done
        elif pending.inputs is None:
            kjt, dense, made = result
        else:  # result: the parts from KK; the exchange here, on the caller's thread
            kjt, dense, gathered = pending.inputs
            with self._side_stream(dense.device, _recorded_event(dense.device)):
                kjt, dense = self._exchange(kjt, dense, gathered, result, pending.step)
                made = _recorded_event(dense.device)
        if made is not None:  # made on a side stream, used on this one
            stream = torch.cuda.current_stream(dense.device)
            stream.wait_event(made)
            for tensor in (dense, kjt.values(), kjt.lengths(), kjt.weights_or_none()):
                if tensor is not None:
                    tensor.record_stream(stream)
        return kjt, dense

    def _shuffle(
        self,
        kjt: KeyedJaggedTensor,
        dense: torch.Tensor,
        workloads: torch.Tensor,
        step: int,
        ready: torch.cuda.Event | None,
    ) -> tuple[KeyedJaggedTensor, torch.Tensor, torch.cuda.Event | None]:
        """All three phases, and the event that marks the result made (on a GPU)."""
        with self._side_stream(dense.device, ready):
            gathered = self._gather(kjt, dense, workloads, step)
            parts = self._kk(gathered, step, None)
            kjt, dense = self._exchange(kjt, dense, gathered, parts, step)
            return kjt, dense, _recorded_event(dense.device)

    def _gather(
        self, kjt: KeyedJaggedTensor, dense: torch.Tensor, workloads: torch.Tensor, step: int
    ) -> torch.Tensor:
        """Every rank's workloads (the first column) and, with "allgather", dense rows."""
        with self.timeline.span("gather_workloads", step, dense.device):
            self._check_same_batch(kjt, dense, step)
            rows = workloads.to(torch.float64).unsqueeze(1)
            if self.exchange == "allgather":  # the dense rows ride along
                rows = torch.cat([rows, dense.to(torch.float64)], dim=1)
            return all_gather_flat(rows, self.group).view(-1, rows.shape[1])

    def _kk(self, gathered: torch.Tensor, step: int, ready: torch.cuda.Event | None) -> list[list[int]]:
        if ready is not None:
            ready.synchronize()  # the gather, issued on the caller's side stream, has landed
        with self.timeline.span("kk", step):
            return balance(gathered[:, 0].cpu(), self.world_size, self.method, native=self.native_kk)

    def _exchange(
        self,
        kjt: KeyedJaggedTensor,
        dense: torch.Tensor,
        gathered: torch.Tensor,
        parts: list[list[int]],
        step: int,
    ) -> Batch:
        with self.timeline.span("exchange", step, dense.device):
            if self.exchange == "alltoall":
                (local,), local_dense = alltoall_kjt([kjt], dense, parts, self.group)
                return local, local_dense
            mine = torch.tensor(parts[self.rank], dtype=torch.int64, device=dense.device)
            (global_kjt,) = allgather_kjt([kjt], self.group)
            return select_samples(global_kjt, mine), gathered[mine, 1:].to(dense.dtype)

    def batches(
        self, batches: Iterable[TorchrecBatch], workloads: Callable[[TorchrecBatch], torch.Tensor]
    ) -> Iterator[TorchrecBatch]:
        """Each torchrec `Batch` of `batches` balanced across ranks, as an
        iterator a `TrainPipelineSparseDist` (or a plain loop) consumes: taking
        batch i starts the shuffle of batch i+1, so with `overlap` it runs while
        the consumer trains on batch i. `workloads(batch)` gives each sample's
        cost (one value per sample). Dense features and labels travel together
        as float64 rows and come back in their own dtypes and shapes. Every
        rank must yield as many batches, each with as many samples. Where the
        shortest rank's `batches` has n, every rank yields n batches, then
        raises the same ValueError when asked for batch n, in every mode ("no
        batch" rides on the next shuffle's signature gather: no collective
        more per step, one small gather after the last batch).

            pipeline = TrainPipelineSparseDist(model, optimizer, device)
            balanced = shuffle.batches(dataloader, lambda b: b.sparse_features["item"].lengths())
            while True:
                pipeline.progress(balanced)   # StopIteration after the last batch
        """
        source = iter(batches)
        layout, step = self._start_next(next(source, _END), workloads, 0), 0
        while True:
            # the next batch loads while the worker shuffles this one
            following = _END if layout is None else next(source, _END)
            shuffled = self._finish()  # where some rank's batches ended here, every rank raises
            if shuffled is None:  # every rank's batches ended at `step`
                return
            next_layout = self._start_next(following, workloads, step + 1)
            yield _unpack_batch(*shuffled, layout)
            layout, step = next_layout, step + 1

    def _start_next(
        self, batch: Any, workloads: Callable[[TorchrecBatch], torch.Tensor], step: int
    ) -> tuple[int, torch.dtype, tuple[int, ...], torch.dtype] | None:
        """Start the shuffle of batch `step` and return its layout, or, where
        this rank's batches ended (`_END`), its end-of-data check (None)."""
        if batch is _END:
            self._start_end(step)
            return None
        dense, labels = batch.dense_features, batch.labels
        size = batch.sparse_features.stride()
        rows = torch.cat([t.reshape(size, -1).to(torch.float64) for t in (dense, labels)], dim=1)
        self.start(batch.sparse_features, rows, workloads(batch).reshape(-1), step)
        return dense.reshape(size, -1).shape[1], dense.dtype, tuple(labels.shape[1:]), labels.dtype

    def _start_end(self, step: int) -> None:
        """This rank has no batch `step`: its "no batch" in the signature gather
        the other ranks' shuffle of batch `step` makes, issued where theirs is
        (the worker, or now on the caller's thread); `_finish()` gives its
        outcome."""
        device = collective_device(self.group)  # on this thread: the rank's GPU under NCCL
        if self._worker is not None and self.collective_thread == "worker":
            self._pending = _Pending(
                step, future=self._worker.submit(self._check_ended, step, device), ended=True
            )
            return
        try:
            self._check_ended(step, device)
            self._pending = _Pending(step, ended=True)
        except _RanksDiffer as error:
            self._pending = _Pending(step, error=error, ended=True)

    def _check_ended(self, step: int, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)  # in the worker too
        self._check_sizes(self._gather_sizes(_NO_BATCH, device=device), step)

    def _gather_sizes(self, size: int, checksum: int = 0, device: torch.device | None = None) -> torch.Tensor:
        """Every rank's (batch size, signature checksum): one small all-gather."""
        mine = torch.tensor([size, checksum], dtype=torch.int64, device=device)
        return all_gather_flat(mine, self.group).view(-1, 2).cpu()

    def _check_sizes(self, gathered: torch.Tensor, step: int) -> None:
        """The same ValueError on every rank where the batch sizes differ or some
        rank has no batch (`_NO_BATCH`): every rank sees the same sizes."""
        sizes = gathered[:, 0].tolist()
        ended = [rank for rank, size in enumerate(sizes) if size == _NO_BATCH]
        if ended and len(ended) < len(sizes):
            going = [rank for rank in range(len(sizes)) if rank not in ended]
            raise _RanksDiffer(
                f"ranks {ended} have no batch {step} (their batches ended) while ranks {going} have one; "
                "BalancedShuffle needs as many batches on every rank (e.g. a DistributedSampler with "
                "drop_last=True and DataLoader(drop_last=True))"
            )
        if len(set(sizes)) > 1:
            raise _RanksDiffer(
                f"batch sizes differ across ranks: {sizes} samples on ranks 0..{len(sizes) - 1}; "
                "BalancedShuffle needs the same number of samples on every rank (drop or pad the "
                "partial last batch, e.g. DataLoader(drop_last=True))"
            )

    def _check_same_batch(self, kjt: KeyedJaggedTensor, dense: torch.Tensor, step: int) -> None:
        """One small all-gather of (batch size, a checksum of keys, dtypes and
        dense width): every rank raises the same ValueError where they differ,
        before any collective whose sizes would not match."""
        weights = None if kjt.weights_or_none() is None else kjt.weights().dtype
        signature = (
            f"keys {kjt.keys()}, values {kjt.values().dtype}, lengths {kjt.lengths().dtype}, "
            f"weights {weights}, dense width {dense.shape[1]} {dense.dtype}"
        )
        gathered = self._gather_sizes(kjt.stride(), zlib.crc32(signature.encode()), dense.device)
        self._check_sizes(gathered, step)
        if len(set(gathered[:, 1].tolist())) > 1:
            signatures: list[Any] = [None] * self.world_size
            dist.all_gather_object(signatures, signature, group=self.group)  # every rank is here
            described = "; ".join(f"rank {r}: {s}" for r, s in enumerate(signatures))
            raise _RanksDiffer(
                f"batches differ across ranks ({described}); BalancedShuffle needs the same KJT keys, "
                "dtypes and dense width on every rank"
            )

    @contextlib.contextmanager
    def _side_stream(self, device: torch.device, ready: torch.cuda.Event | None) -> Iterator[None]:
        """On a GPU the shuffle's work goes on a stream of its own (one per
        thread), after the batch is ready."""
        if ready is None:
            yield
            return
        torch.cuda.set_device(device)
        thread = threading.current_thread()
        if thread not in self._side_streams:
            self._side_streams[thread] = torch.cuda.Stream(device)
        stream = self._side_streams[thread]
        stream.wait_event(ready)
        with torch.cuda.stream(stream):
            yield


@dataclasses.dataclass
class _Pending:
    """A started shuffle: its result (synchronous), or the worker's future and,
    where the caller exchanges, the batch and the gathered rows; or the error
    its check found (every rank's); `ended`: an end-of-data check, no batch."""

    step: int
    done: tuple[KeyedJaggedTensor, torch.Tensor, torch.cuda.Event | None] | None = None
    future: Future | None = None
    inputs: tuple[KeyedJaggedTensor, torch.Tensor, torch.Tensor] | None = None
    error: _RanksDiffer | None = None
    ended: bool = False


def _recorded_event(device: torch.device) -> torch.cuda.Event | None:
    """An event recorded on the current stream, on a GPU (None on the CPU)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def _unpack_batch(
    kjt: KeyedJaggedTensor, rows: torch.Tensor, layout: tuple[int, torch.dtype, tuple[int, ...], torch.dtype]
) -> TorchrecBatch:
    """A torchrec Batch from the shuffled KJT and rows (dense features, then labels)."""
    width, dense_dtype, label_shape, label_dtype = layout
    labels = rows[:, width:].reshape(rows.shape[0], *label_shape)
    return TorchrecBatch(
        dense_features=rows[:, :width].to(dense_dtype), sparse_features=kjt, labels=labels.to(label_dtype)
    )

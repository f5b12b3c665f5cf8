"""The balanced shuffle: move every sample of the global batch to the rank that Karmarkar-Karp
(`embnb.balancing.partition.balance`) assigns it to, in three phases: gather_workloads (one
all-gather of every rank's per-sample workloads; with the "allgather" exchange the dense rows ride
along), kk (every rank computes the same parts, so nothing is broadcast) and exchange (`allgather_kjt`
then this rank's samples, or `alltoall_kjt`). With `overlap` they run in a background worker for
batch s+1 while step s computes.

docs/balancing.md gives, with their sources, the rules the class enforces: where the collectives may
be issued (`collective_thread`: a worker on the default group aborts gloo, NCCL refuses two threads;
"caller" is NVIDIA recsys-examples' design, commit 7cf45752), and the signature gather that makes
every rank raise the same ValueError from `finish()` where the ranks' batches differ, a loader ends or
raises, or one rank's input is bad (`embnb.balancing.shuffle_checks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
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
from embnb.balancing.shuffle_checks import (
    NO_BATCH,
    TROUBLE,
    RanksDiffer,
    check_same_batch,
    check_sizes,
    gather_sizes,
    input_problem,
)
from embnb.balancing.timeline import Timeline
from embnb.collectives import all_gather_flat
from embnb.dist import collective_device

__all__ = ["EXCHANGES", "COLLECTIVE_THREADS", "BalancedShuffle"]

EXCHANGES = ("allgather", "alltoall")
COLLECTIVE_THREADS = ("auto", "worker", "caller")
_END = object()  # what batches() takes from a loader that has ended
Batch = tuple[KeyedJaggedTensor, torch.Tensor]


@dataclasses.dataclass
class _Raised:
    """What batches() takes from a loader that raised: its exception."""

    error: Exception


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
        """Shut the worker down, after the shuffle it runs (every rank runs the
        same one), dropping any shuffle left pending."""
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)
        self._pending = None

    def start(self, kjt: KeyedJaggedTensor, dense: torch.Tensor, workloads: torch.Tensor, step: int) -> None:
        """Shuffle this batch: in the worker with `overlap`, else now.

        kjt: `stride` samples; dense: (stride, width) rows; workloads: (stride,),
        each sample's cost. Where one rank's input has other shapes, or the
        ranks' batches differ, `finish()` raises the same ValueError on every
        rank, naming the rank and what it passed (in every mode: that rank
        still joins the signature gather, so no rank waits). RuntimeError
        where a shuffle is pending (`finish()` not called, or a `batches()`
        iterator left unfinished and not closed).
        """
        if self._pending is not None:
            raise RuntimeError(
                "start() called twice without finish() (or while a batches() iterator left unfinished "
                "holds its next shuffle: close() that iterator)"
            )
        problem = input_problem(kjt, dense, workloads, self.rank)
        if problem is not None:  # raised by finish() on every rank, as where the batches differ
            self._start_without_batch(step, problem)
            return
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
        except RanksDiffer as error:  # every rank failed this check: raised by finish(), as in the worker
            self._pending = _Pending(step, error=error)

    def finish(self) -> Batch:
        """This rank's KJT and dense rows (waits for the worker, re-raising its
        error): the ValueError every rank raises where the ranks' batches
        differ or some rank's input was bad."""
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
        ranks' batches differ, some rank's ended or some rank's was bad; on
        the rank whose loader raised, the loader's own exception."""
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
        except RanksDiffer as error:
            if pending.raised is not None:
                raise pending.raised from None
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

    def _discard(self) -> None:
        """Drop the pending shuffle, after the worker's part of it: where every
        rank leaves `batches()` at the same batch, every rank drops the same
        shuffle, none of its collectives stays in flight, and the caller's
        exchange is issued on no rank."""
        pending, self._pending = self._pending, None
        if pending is not None and pending.future is not None:
            with contextlib.suppress(RanksDiffer):  # every rank's outcome alike, and no batch is wanted
                pending.future.result()

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
            check_same_batch(kjt, dense, step, self.group)
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
        more per step, one small gather after the last batch). Where one
        rank's loader (or `workloads`) raises at batch n, every rank yields
        n batches, then that rank re-raises the exception and the others
        raise a ValueError naming it. Leaving early (every rank at the same
        batch: a `break` that drops the iterator, or its `close()`) drops
        the next batch's shuffle on every rank, nothing left in flight.

            pipeline = TrainPipelineSparseDist(model, optimizer, device)
            balanced = shuffle.batches(dataloader, lambda b: b.sparse_features["item"].lengths())
            while True:
                pipeline.progress(balanced)   # StopIteration after the last batch
        """
        source = _each(batches)
        layout, step = self._start_next(_next_batch(source), workloads, 0), 0
        try:
            while True:
                # the next batch loads while the worker shuffles this one
                following = _END if layout is None else _next_batch(source)
                shuffled = self._finish()  # where some rank's batches ended or failed here, every rank raises
                if shuffled is None:  # every rank's batches ended at `step`
                    return
                next_layout = self._start_next(following, workloads, step + 1)
                yield _unpack_batch(*shuffled, layout)
                layout, step = next_layout, step + 1
        except GeneratorExit:  # the consumer left (every rank at the same batch): nothing stays pending
            self._discard()
            raise

    def _start_next(
        self, batch: Any, workloads: Callable[[TorchrecBatch], torch.Tensor], step: int
    ) -> tuple[int, torch.dtype, tuple[int, ...], torch.dtype] | None:
        """Start the shuffle of batch `step` and return its layout; or, where
        this rank has no batch (its loader ended or raised, or the batch could
        not be read), its "no batch" in the signature gather (None)."""
        if batch is _END:
            self._start_without_batch(step)
            return None
        if isinstance(batch, _Raised):
            error = batch.error
            self._start_without_batch(
                step,
                f"rank {self.rank}'s loader raised {type(error).__name__} at batch {step}: {error}",
                error,
            )
            return None
        try:
            dense, labels = batch.dense_features, batch.labels
            size = batch.sparse_features.stride()
            if dense.shape[0] != size or labels.shape[0] != size:
                raise ValueError(
                    f"a Batch needs one dense row and one label per sample: stride {size}, "
                    f"dense_features {tuple(dense.shape)}, labels {tuple(labels.shape)}"
                )
            rows = torch.cat([t.reshape(size, -1).to(torch.float64) for t in (dense, labels)], dim=1)
            loads = workloads(batch).reshape(-1)
        except Exception as error:  # raised here by finish(); the others name this rank
            problem = f"rank {self.rank}'s batch {step} could not be read ({type(error).__name__}: {error})"
            self._start_without_batch(step, problem, error)
            return None
        self.start(batch.sparse_features, rows, loads, step)
        return dense.reshape(size, -1).shape[1], dense.dtype, tuple(labels.shape[1:]), labels.dtype

    def _start_without_batch(
        self, step: int, problem: str | None = None, raised: Exception | None = None
    ) -> None:
        """This rank has no batch `step` to shuffle: its batches ended (no
        `problem`), or its input is bad or its loader raised (`problem` says
        so; `raised`: what finish() re-raises here). It sends "no batch" or
        "trouble" in the signature gather the other ranks' shuffle of batch
        `step` makes, issued where theirs is (the worker, or now on the
        caller's thread); `_finish()` gives the outcome."""
        device = collective_device(self.group)  # on this thread: the rank's GPU under NCCL
        check = functools.partial(self._check_without_batch, step, device, problem)
        ended = problem is None
        if self._worker is not None and self.collective_thread == "worker":
            self._pending = _Pending(step, future=self._worker.submit(check), ended=ended, raised=raised)
            return
        try:
            check()
            self._pending = _Pending(step, ended=ended)
        except RanksDiffer as error:
            self._pending = _Pending(step, error=error, ended=ended, raised=raised)

    def _check_without_batch(self, step: int, device: torch.device, problem: str | None) -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)  # in the worker too
        code = NO_BATCH if problem is None else TROUBLE
        check_sizes(gather_sizes(self.group, code, device=device), step, self.group, problem)

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
    its check found (every rank's); `ended`: an end-of-data check, no batch;
    `raised`: this rank's loader's exception, re-raised here in place of the
    check's error."""

    step: int
    done: tuple[KeyedJaggedTensor, torch.Tensor, torch.cuda.Event | None] | None = None
    future: Future | None = None
    inputs: tuple[KeyedJaggedTensor, torch.Tensor, torch.Tensor] | None = None
    error: RanksDiffer | None = None
    ended: bool = False
    raised: Exception | None = None


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


def _each(batches: Iterable[TorchrecBatch]) -> Iterator[TorchrecBatch]:
    """`batches`' items; `iter(batches)` runs at the first `next()`, so
    `_next_batch` takes what it raises too."""
    yield from batches


def _next_batch(source: Iterator[TorchrecBatch]) -> Any:
    """The loader's next batch, `_END` after its last, `_Raised` where it raised."""
    try:
        return next(source)
    except StopIteration:
        return _END
    except Exception as error:  # every rank learns it at this batch's signature gather
        return _Raised(error)

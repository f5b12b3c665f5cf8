"""Per-rank functions of tests/balancing/test_shuffle_faults.py (spawned ranks
import them from here): one rank's bad input to `BalancedShuffle.start()`, one
rank's loader raising in `batches()`, and every rank leaving `batches()` early,
in each mode (overlap, collective_thread, exchange), a collective on the
default group standing in for each training step. Each records what it saw;
the tests compare it with what they expect."""

import torch
import torch.distributed as dist
from shuffle_end_ranks import BATCH_SIZE, make_batch

from embnb.balancing import BalancedShuffle

BAD_RANK = 1  # the rank whose input is bad or whose loader raises


class LoaderFailed(RuntimeError):
    """What the failing rank's loader raises (a type no library code raises)."""


def _step() -> None:
    dist.all_reduce(torch.ones(1))  # the training step: every rank joins it, or every rank hangs


def _outcome(error: BaseException | None) -> dict:
    return {"type": None if error is None else type(error).__name__, "message": str(error or "")}


def _shuffles(modes: list):
    """(mode, shuffle) for each mode; with the worker issuing the collectives,
    the shuffle has a gloo group of its own (made once, here)."""
    own_group = dist.new_group(backend="gloo")
    for overlap, thread, exchange in modes:
        in_worker = overlap and thread in ("worker", "auto")
        group = own_group if in_worker else None
        with BalancedShuffle(
            overlap=overlap, group=group, collective_thread=thread, exchange=exchange
        ) as shuffle:
            yield (overlap, thread, exchange), shuffle
    dist.barrier()  # the default group still works
    dist.destroy_process_group(own_group)


def _good_round(rank: int, shuffle: BalancedShuffle, step: int) -> list[int]:
    """One start/step/finish with good input on every rank: the ids this rank gets."""
    batch = make_batch(rank, step)
    kjt = batch.sparse_features
    shuffle.start(kjt, batch.dense_features, kjt.lengths().to(torch.float64), step)
    _step()
    got, _ = shuffle.finish()
    return got.values().tolist()


def bad_input(rank: int, world_size: int, bad: dict[str, tuple], modes: list) -> dict:
    """For each bad input (the dense shape and workload count the bad rank
    passes; the others pass good ones) and mode: start(), a step, finish() on
    every rank; the outcome on each rank, then the ids a good round after it
    gives (every rank in step again)."""
    results = {}
    for mode, shuffle in _shuffles(modes):
        for case, (dense_shape, num_workloads) in bad.items():
            batch = make_batch(rank, 0)
            kjt, dense = batch.sparse_features, batch.dense_features
            workloads = kjt.lengths().to(torch.float64)
            if rank == BAD_RANK:
                dense, workloads = torch.zeros(dense_shape), torch.ones(num_workloads)
            error = None
            try:
                shuffle.start(kjt, dense, workloads, 0)
                _step()
                shuffle.finish()
            except Exception as e:
                error = e
            results[(case, *mode)] = {**_outcome(error), "after": _good_round(rank, shuffle, 1)}
    return results


def _failing_loader(rank: int, length: int, fail_at: int):
    for step in range(length):
        if rank == BAD_RANK and step == fail_at:
            raise LoaderFailed(f"rank {rank}'s disk is gone at batch {step}")
        yield make_batch(rank, step)


def _item_lengths(batch) -> torch.Tensor:
    return batch.sparse_features["item"].lengths().to(torch.float64)


def _failing_workloads(rank: int, fail_at: int):
    def workloads(batch) -> torch.Tensor:
        step = int(batch.sparse_features.values()[0]) % 1000 // 100  # make_batch's ids say it
        if rank == BAD_RANK and step == fail_at:
            raise LoaderFailed(f"rank {rank}'s workloads failed at batch {step}")
        return _item_lengths(batch)

    return workloads


def loader_fails(rank: int, world_size: int, length: int, cases: list[tuple[str, int]], modes: list) -> dict:
    """For each case (what raises on the bad rank, "loader" or "workloads",
    and at which batch) and each mode: the batches every rank took from
    `batches()` and how it ended."""
    results = {}
    for mode, shuffle in _shuffles(modes):
        for where, fail_at in cases:
            loader = _failing_loader(rank, length, fail_at if where == "loader" else length)
            workloads = _failing_workloads(rank, fail_at if where == "workloads" else length)
            taken, error = 0, None
            try:
                for _ in shuffle.batches(loader, workloads):
                    taken += 1
                    _step()
            except Exception as e:
                error = e
            results[(where, fail_at, *mode)] = {**_outcome(error), "taken": taken}
    return results


def leave_early(rank: int, world_size: int, length: int, stop_afters: list[int], modes: list) -> dict:
    """For each number of batches to stop after and each mode: leave
    `batches()` after that many (a `break` that drops the iterator, then an
    explicit `close()` of one still held), then take every batch of a new
    loader with the same shuffle; the ids of that last run's batches, and
    the outcome."""
    results = {}
    for mode, shuffle in _shuffles(modes):
        for stop_after in stop_afters:
            error, ids = None, []
            try:
                loader = [make_batch(rank, s) for s in range(length)]
                for taken, _ in enumerate(shuffle.batches(loader, _item_lengths)):
                    _step()
                    if taken + 1 == stop_after:
                        break
                held = shuffle.batches(loader, _item_lengths)
                for taken, _ in enumerate(held):
                    _step()
                    if taken + 1 == stop_after:
                        break
                held.close()
                for batch in shuffle.batches(loader, _item_lengths):
                    ids.append(sorted(batch.sparse_features.values().tolist()))
                    _step()
            except Exception as e:
                error = e
            results[(stop_after, *mode)] = {**_outcome(error), "ids": ids}
    return results


__all__ = ["BAD_RANK", "BATCH_SIZE", "LoaderFailed", "bad_input", "leave_early", "loader_fails"]

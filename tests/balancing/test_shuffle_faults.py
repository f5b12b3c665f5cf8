"""The balanced shuffle when one rank goes wrong, on 3 real gloo ranks, in
every mode (overlap with each collective_thread, and without; each exchange),
a collective on the default group standing in for each training step, so a
rank that raised alone would leave the others hanging until the launch's
timeout (a LaunchTimeout here, a minute before the process group's):

- one rank's input to `start()` has the wrong shapes: every rank raises the
  same ValueError from `finish()`, naming that rank and its shapes, and the
  next shuffle works;
- one rank's loader (or `workloads`) raises in `batches()`: every rank
  takes the batches before it, then that rank re-raises the exception and
  the others raise a ValueError naming it;
- every rank leaves `batches()` early (a `break`, or `close()` of a held
  iterator): the shuffle takes a new loader's batches, every id once."""

import pytest
import shuffle_end_ranks
import shuffle_fault_ranks
import torch

from embnb.balancing.shuffle import COLLECTIVE_THREADS, EXCHANGES
from embnb.dist import launch_each

WORLD_SIZE = 3
STRIDE = shuffle_fault_ranks.BATCH_SIZE
BAD = shuffle_fault_ranks.BAD_RANK
MODES = [(True, thread, exchange) for thread in COLLECTIVE_THREADS for exchange in EXCHANGES]
MODES += [(False, "auto", exchange) for exchange in EXCHANGES]
FAILURES = [("loader", 0), ("loader", 2), ("workloads", 1)]  # what raises on the bad rank, at which batch
BAD_INPUTS = {  # the bad rank's dense shape and workload count (the good ranks: (4, 2) and 4)
    "few_workloads": ((STRIDE, 2), STRIDE - 1),
    "many_dense_rows": ((STRIDE + 1, 2), STRIDE),
    "flat_dense": ((STRIDE,), STRIDE),
}
LENGTH, STOP_AFTERS = 4, [1, 4]  # stopping after the last: at its end check


@pytest.fixture(scope="module")
def runs():
    calls = [
        (shuffle_fault_ranks.bad_input, (BAD_INPUTS, MODES)),
        (shuffle_fault_ranks.loader_fails, (LENGTH, FAILURES, MODES)),
        (shuffle_fault_ranks.leave_early, (LENGTH, STOP_AFTERS, MODES)),
    ]
    return launch_each(calls, WORLD_SIZE, device="cpu", timeout_s=90)


def _every_id_once(results: list[list[int]], step: int) -> None:
    sent = [shuffle_end_ranks.make_batch(rank, step).sparse_features.values() for rank in range(WORLD_SIZE)]
    assert sorted(i for got in results for i in got) == sorted(torch.cat(sent).tolist())


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.parametrize("mode", MODES)
def test_bad_input_on_one_rank_raises_the_same_error_on_every_rank(runs, case, mode):
    dense_shape, num_workloads = BAD_INPUTS[case]
    results = [per_rank[(case, *mode)] for per_rank in runs[0]]
    assert [r["type"] for r in results] == ["ValueError"] * WORLD_SIZE
    (message,) = {r["message"] for r in results}
    assert f"rank {BAD} passed stride {STRIDE}, workloads ({num_workloads},), dense {dense_shape}" in message
    assert "one workload and one dense row per sample" in message
    _every_id_once([r["after"] for r in results], 1)  # the next shuffle runs on every rank


@pytest.mark.parametrize(("where", "fail_at"), FAILURES)
@pytest.mark.parametrize("mode", MODES)
def test_a_loader_raising_on_one_rank_stops_every_rank_at_that_batch(runs, where, fail_at, mode):
    results = [per_rank[(where, fail_at, *mode)] for per_rank in runs[1]]
    assert [r["taken"] for r in results] == [fail_at] * WORLD_SIZE
    own = f"rank {BAD}'s disk is gone at batch {fail_at}"
    if where == "workloads":
        own = f"rank {BAD}'s workloads failed at batch {fail_at}"
    assert results[BAD] == {"type": "LoaderFailed", "message": own, "taken": fail_at}
    others = [r for rank, r in enumerate(results) if rank != BAD]
    assert [r["type"] for r in others] == ["ValueError"] * (WORLD_SIZE - 1)
    (message,) = {r["message"] for r in others}
    named = f"rank {BAD}'s loader raised LoaderFailed at batch {fail_at}: {own}"
    if where == "workloads":
        named = f"rank {BAD}'s batch {fail_at} could not be read (LoaderFailed: {own})"
    assert named in message


@pytest.mark.parametrize("stop_after", STOP_AFTERS)
@pytest.mark.parametrize("mode", MODES)
def test_leaving_batches_early_leaves_the_shuffle_ready_for_the_next_loader(runs, stop_after, mode):
    results = [per_rank[(stop_after, *mode)] for per_rank in runs[2]]
    assert [(r["type"], r["message"]) for r in results] == [(None, "")] * WORLD_SIZE
    assert [len(r["ids"]) for r in results] == [LENGTH] * WORLD_SIZE
    for step in range(LENGTH):
        _every_id_once([r["ids"][step] for r in results], step)

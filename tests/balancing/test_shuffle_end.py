"""The balanced shuffle's end of data on 3 real gloo ranks, in every
collective_thread mode, with overlap and without: where some rank's loader
is shorter, every rank takes the batches every rank has, then raises the
same ValueError naming the ranks whose loader ended and the batch they lack
(no rank runs a step alone: each step is a collective on the default group,
which would hang); where every loader has as many batches, every batch
arrives and the iteration ends."""

import pytest
import shuffle_end_ranks
import torch

from embnb.balancing.shuffle import COLLECTIVE_THREADS
from embnb.dist import launch_each

WORLD_SIZE = 3
CASES = {  # each rank's loader length
    "one_short": (4, 3, 4),
    "two_short": (4, 3, 2),
    "empty": (2, 0, 2),
    "equal": (3, 3, 3),
}
MODES = [(overlap, thread) for overlap in (True, False) for thread in COLLECTIVE_THREADS]


@pytest.fixture(scope="module")
def runs():
    calls = [(shuffle_end_ranks.end_of_data, (CASES, MODES))]
    (per_rank,) = launch_each(calls, WORLD_SIZE, device="cpu", timeout_s=60)
    return per_rank


@pytest.mark.parametrize("case", [case for case, lengths in CASES.items() if len(set(lengths)) > 1])
@pytest.mark.parametrize(("overlap", "thread"), MODES)
def test_every_rank_raises_the_same_error_at_the_shortest_loaders_end(runs, case, overlap, thread):
    lengths = CASES[case]
    shortest = min(lengths)  # the first batch some rank lacks
    ended = [rank for rank, length in enumerate(lengths) if length == shortest]
    going = [rank for rank in range(WORLD_SIZE) if rank not in ended]
    results = [per_rank[(case, overlap, thread)] for per_rank in runs]
    assert [len(r["ids"]) for r in results] == [shortest] * WORLD_SIZE
    (message,) = {r["error"] for r in results}
    assert message is not None
    assert (
        f"ranks {ended} have no batch {shortest} (their batches ended) while ranks {going} have one"
        in message
    )


@pytest.mark.parametrize(("overlap", "thread"), MODES)
def test_loaders_of_equal_length_end_with_every_batch_taken(runs, overlap, thread):
    lengths = CASES["equal"]
    results = [per_rank[("equal", overlap, thread)] for per_rank in runs]
    assert [r["error"] for r in results] == [None] * WORLD_SIZE
    assert [len(r["ids"]) for r in results] == list(lengths)
    for step in range(lengths[0]):
        sent = [
            shuffle_end_ranks.make_batch(rank, step).sparse_features.values() for rank in range(WORLD_SIZE)
        ]
        received = [torch.tensor(r["ids"][step]) for r in results]
        assert sorted(torch.cat(received).tolist()) == sorted(torch.cat(sent).tolist())  # each id once

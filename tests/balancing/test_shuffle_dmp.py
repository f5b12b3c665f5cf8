"""BalancedShuffle in a torchrec job on 2 real gloo ranks: a
DistributedModelParallel model trains with the shuffle in the background on
a group of its own (no abort), in a plain loop and inside torchrec's
TrainPipelineSparseDist (`BalancedShuffle.batches`), and on the default group
with its collectives on the caller's thread (KK alone in the background), to
the same parameters as with the synchronous shuffle and as without balancing (equal-count parts: the mean
loss of every rank gives the same gradients); the overlapped shuffle refuses
the default group; ranks whose batches differ, or end at different steps,
all raise the same ValueError (where a loader ends early: after the batches
every rank has, before any rank starts a DMP step alone, in every mode)."""

import dmp_ranks
import pytest
import torch

from embnb.dist import launch_each

WORLD_SIZE = 2
LOOPS = ("none", "sync", "overlap", "caller")  # train_dmp's modes
PIPELINES = ("worker", "caller")  # train_pipeline's collective threads
SHORT_RANK, BATCHES = 1, 4  # uneven_loaders: rank 1's loader has BATCHES - 1 batches, rank 0's BATCHES


@pytest.fixture(scope="module")
def runs():
    calls = [(dmp_ranks.train_dmp, (mode,)) for mode in LOOPS]
    calls += [(dmp_ranks.train_pipeline, (thread,)) for thread in PIPELINES]
    calls += [(dmp_ranks.shuffle_errors, ()), (dmp_ranks.uneven_loaders, (SHORT_RANK, BATCHES))]
    results = launch_each(calls, WORLD_SIZE, device="cpu", timeout_s=240)
    names = [*LOOPS, *(f"pipeline_{thread}" for thread in PIPELINES), "errors", "uneven"]
    return dict(zip(names, results))


BALANCED = ("sync", "overlap", "caller", "pipeline_worker", "pipeline_caller")


def test_the_overlapped_shuffle_trains_dmp_like_the_synchronous_one_and_like_no_shuffle(runs):
    for rank in range(WORLD_SIZE):
        want, sync = runs["none"][rank]["weights"], runs["sync"][rank]["weights"]
        assert any(name.startswith("ebc.") for name in want) and any(name.startswith("mlp.") for name in want)
        for mode in BALANCED:
            weights = runs[mode][rank]["weights"]
            assert sorted(weights) == sorted(want), mode
            for name, tensor in weights.items():
                torch.testing.assert_close(tensor, sync[name], msg=lambda m, mode=mode: f"{mode}: {m}")
        for name, tensor in want.items():
            torch.testing.assert_close(sync[name], tensor, rtol=1e-4, atol=1e-6)
    torch.manual_seed(0)
    initial = dmp_ranks.TinyModel(torch.device("cpu")).state_dict()
    trained = runs["overlap"][0]["weights"]
    assert not torch.allclose(trained["mlp.0.weight"], initial["mlp.0.weight"])  # training moved them
    table = "ebc.embedding_bags.t0.weight"  # on rank 0
    assert not torch.allclose(trained[table], initial[table].reshape(-1))


def test_the_shuffle_balanced_the_ids_each_step(runs):
    loader = list(zip(*(r["ids"] for r in runs["none"])))
    for mode in BALANCED:
        per_step = list(zip(*(r["ids"] for r in runs[mode])))
        assert [sum(s) for s in per_step] == [sum(s) for s in loader]  # every id arrives once
        assert runs[mode][0]["ids"] == runs["sync"][0]["ids"], mode


def test_the_overlapped_shuffle_refuses_the_default_group(runs):
    for messages in runs["errors"]:
        message = messages["default_group"]
        assert "default process group" in message and "interleave" in message
        assert 'group=dist.new_group(backend="gloo")' in message and "step_collectives=False" in message
        assert 'collective_thread="caller"' in message
        assert "'sideways'" in messages["bad_thread"] and "'caller'" in messages["bad_thread"]


def test_a_rank_whose_batches_end_first_makes_every_rank_raise(runs):
    (message,) = {messages["ended_early"] for messages in runs["errors"]}
    assert "ranks [1] have no batch 3" in message and "ranks [0] have one" in message


def test_ranks_with_different_batches_all_raise_the_same_error(runs):
    partial = {messages["partial_batch"] for messages in runs["errors"]}
    assert len(partial) == 1
    sizes = [dmp_ranks.BATCH_SIZE, dmp_ranks.BATCH_SIZE - 2]
    assert f"batch sizes differ across ranks: {sizes}" in partial.pop()
    keys = {messages["other_keys"] for messages in runs["errors"]}
    assert len(keys) == 1
    message = keys.pop()
    assert "rank 0: keys ['f0', 'f1', 'f2']" in message and "rank 1: keys ['f0', 'f1']" in message


def test_a_loader_one_batch_short_stops_every_rank_of_a_dmp_job_at_the_same_batch(runs):
    shortest = BATCHES - 1  # rank 1's loader
    want = f"ranks [{SHORT_RANK}] have no batch {shortest} (their batches ended) while ranks [0] have one"
    for name in ("worker", "caller", "sync", "pipeline"):
        results = [per_rank[name] for per_rank in runs["uneven"]]
        assert [r["taken"] for r in results] == [shortest] * WORLD_SIZE, name
        (message,) = {r["error"] for r in results}
        assert message is not None and want in message, name
    assert len({r["pipeline"]["progressed"] for r in runs["uneven"]}) == 1

"""embnb.balancing.overlap on 4 real gloo ranks: balanced training follows the same
trajectory as one process on the whole batch, each rank trains on exactly
the part KK gives it, the timeline is complete, and a failing rank (in its
KK thread or its main thread) ends the launch instead of hanging it."""

import math
import time

import pytest
import torch

from embnb.balancing import overlap
from embnb.balancing import partition as balancer
from embnb.dist import RankError, launch

WORLD_SIZE = 4
TINY = {
    "steps": 3,
    "batch_size": 6,
    "max_length": 48,
    "num_items": 50,
    "num_categories": 5,
    "embedding_dim": 8,
    "ffn_dim": 16,
    "num_heads": 2,
    "lr": 0.05,
    "seed": 3,
}
RUNS = [
    {**TINY, "mode": "none"},
    {**TINY, "mode": "sync", "kk_backend": "python"},
    {**TINY, "mode": "overlap", "kk_backend": "native"},
    {**TINY, "mode": "overlap", "kk_backend": "python"},
]


@pytest.fixture(scope="module")
def runs():
    assert balancer.native_available(), balancer._native_error  # build once, before the ranks load it
    per_rank = launch(overlap.train_modes, WORLD_SIZE, RUNS, backend="gloo", timeout_s=300)
    return [[per_rank[rank][i] for rank in range(WORLD_SIZE)] for i in range(len(RUNS))]


def one_process_training(config):
    """The same model and steps on the whole global batch in this process."""
    config = {**overlap.DEFAULT_CONFIG, **config}
    torch.manual_seed(config["seed"])
    model = overlap.SequenceModel(
        config["num_items"],
        config["num_categories"],
        config["embedding_dim"],
        config["ffn_dim"],
        config["num_heads"],
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    losses = []
    for step in range(config["steps"]):
        optimizer.zero_grad()
        loss = 0
        for rank in range(WORLD_SIZE):
            kjt, labels = overlap.make_local_batch(config, rank, step)
            loss = loss + ((model(kjt) - labels[:, 0].float()) ** 2).sum()
        loss = loss / (WORLD_SIZE * config["batch_size"])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_every_mode_trains_like_one_process_on_the_whole_batch(runs):
    want_losses, want_weights = one_process_training(TINY)
    for run in runs:
        for result in run:
            assert result["losses"] == pytest.approx(want_losses, rel=1e-4), (
                result["mode"],
                result["kk_backend"],
            )
            torch.testing.assert_close(result["weights"], want_weights, rtol=1e-4, atol=1e-5)


def test_each_rank_trains_on_exactly_its_kk_part(runs):
    config = {**overlap.DEFAULT_CONFIG, **TINY}
    for step in range(TINY["steps"]):
        per_rank = [
            overlap.sample_workloads(overlap.make_local_batch(config, r, step)[0], config)
            for r in range(WORLD_SIZE)
        ]
        workloads = torch.cat(per_rank)
        parts = balancer.balance(workloads, WORLD_SIZE, "kk_swap", "python")
        want_balanced = [workloads[p].sum().item() for p in parts]
        want_own = [w.sum().item() for w in per_rank]
        for run in runs:
            got = [result["step_flops"][step] for result in run]
            want = want_own if run[0]["mode"] == "none" else want_balanced
            assert got == pytest.approx(want), (run[0]["mode"], step)


def test_timeline_has_every_phase_and_kk_runs_in_its_thread_when_overlapped(runs):
    steps = range(TINY["steps"])
    for run in runs:
        mode = run[0]["mode"]
        for result in run:
            spans = result["spans"]
            for step in steps:
                phases = {s["phase"] for s in spans if s["step"] == step}
                assert {"load", "forward", "backward"} <= phases
                if mode != "none":
                    assert {"gather_workloads", "kk", "exchange"} <= phases
            for kk in (s for s in spans if s["phase"] == "kk"):
                gather = next(
                    s for s in spans if s["phase"] == "gather_workloads" and s["step"] == kk["step"]
                )
                assert kk["start"] >= gather["end"]  # KK needs the gathered workloads
                assert kk["thread"] == ("kk" if mode == "overlap" else "main")
            assert all(s["end"] >= s["start"] and s["rank"] == result["rank"] for s in spans)
            if mode == "none":
                assert math.isnan(result["hidden_fraction"])
            elif mode == "sync":
                assert result["hidden_fraction"] == 0.0
            else:
                assert 0.0 <= result["hidden_fraction"] <= 1.0
                # one KK per later step ran in the thread while the step computed
                assert len(result["kk_seconds"]) == TINY["steps"] - 1


def test_hidden_fraction_by_hand():
    spans = [
        {"phase": "kk", "step": 1, "start": 0.0, "end": 4.0, "thread": "kk"},
        {"phase": "wait_kk", "step": 1, "start": 3.0, "end": 4.5},  # 1 of 4 exposed
        {"phase": "kk", "step": 2, "start": 10.0, "end": 12.0, "thread": "kk"},
        {"phase": "wait_kk", "step": 2, "start": 13.0, "end": 13.1},  # done before the wait
        {"phase": "kk", "step": 0, "start": 20.0, "end": 30.0, "thread": "kk", "warmup": True},
    ]
    assert overlap.hidden_fraction(spans) == pytest.approx(1 - 1 / 6)
    assert (
        overlap.hidden_fraction([{"phase": "kk", "step": 0, "start": 0.0, "end": 1.0, "thread": "main"}])
        == 0.0
    )
    assert math.isnan(overlap.hidden_fraction([]))


def test_a_failure_in_one_ranks_kk_thread_ends_the_launch():
    # Rank 1's KK thread raises; rank 0 is then blocked in the exchange's
    # all-gather that rank 1 never joins: the launch must still end, naming rank 1.
    start = time.monotonic()
    config = {**TINY, "mode": "overlap", "kk_backend": "python", "fail_rank": 1, "fail_in_kk": True}
    with pytest.raises(RankError) as info:
        launch(overlap.train, 2, config, backend="gloo", timeout_s=240)
    assert info.value.rank == 1
    assert "deliberate failure in the KK thread of rank 1" in str(info.value)
    assert time.monotonic() - start < 200  # stopped, not waited for until the timeout


def test_bad_config_is_named():
    with pytest.raises(ValueError, match=r"unknown config keys \['batchsize'\]"):
        overlap.train(0, 1, {"batchsize": 4})
    with pytest.raises(ValueError, match="mode 'async' is not one of none, sync, overlap"):
        overlap.train(0, 1, {"mode": "async"})
    with pytest.raises(ValueError, match="embedding_dim=10 is not a multiple of num_heads=4"):
        overlap.AttentionBlock(10, 16, 4)

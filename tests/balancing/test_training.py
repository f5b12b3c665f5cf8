"""embnb.balancing.training on 4 real gloo ranks: balanced training follows the same
trajectory as one process on the whole batch, each rank trains on exactly
the part KK gives it, the timeline is complete, and a failing rank (in its
KK thread or its main thread) ends the launch instead of hanging it."""

import dataclasses
import math
import time

import pytest
import torch

from embnb.balancing import partition as balancer
from embnb.balancing import training
from embnb.balancing.timeline import hidden_fraction
from embnb.balancing.training import Faults, TrainConfig
from embnb.dist import RankError, launch, launch_each
from embnb.native import loader

WORLD_SIZE = 4
TINY = TrainConfig(
    steps=3,
    batch_size=6,
    max_length=48,
    num_items=50,
    num_categories=5,
    embedding_dim=8,
    ffn_dim=16,
    num_heads=2,
    lr=0.05,
    seed=3,
)
RUNS = [
    TINY.replace(mode="none"),
    TINY.replace(mode="sync", kk_backend="python"),
    TINY.replace(mode="overlap", kk_backend="native"),
    TINY.replace(mode="overlap", kk_backend="python"),
]


@pytest.fixture(scope="module")
def runs():
    assert loader.available(), loader.failure()  # build once, before the ranks load it
    return launch_each(
        [(training.train, (config,)) for config in RUNS], WORLD_SIZE, device="cpu", timeout_s=300
    )


def one_process_training(config):
    """The same model and steps on the whole global batch in this process."""
    torch.manual_seed(config.seed)
    model = training.SequenceModel(
        config.num_items, config.num_categories, config.embedding_dim, config.ffn_dim, config.num_heads
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    losses = []
    for step in range(config.steps):
        optimizer.zero_grad()
        loss = 0
        for rank in range(WORLD_SIZE):
            kjt, labels = training.make_local_batch(config, rank, step)
            loss = loss + ((model(kjt) - labels[:, 0].float()) ** 2).sum()
        loss = loss / (WORLD_SIZE * config.batch_size)
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
    config = TINY
    for step in range(TINY.steps):
        per_rank = [
            training.sample_workloads(training.make_local_batch(config, r, step)[0], config)
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
    steps = range(TINY.steps)
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
                assert len(result["kk_seconds"]) == TINY.steps - 1


def test_hidden_fraction_by_hand():
    spans = [
        {"phase": "kk", "step": 1, "start": 0.0, "end": 4.0, "thread": "kk"},
        {"phase": "wait_kk", "step": 1, "start": 3.0, "end": 4.5},  # 1 of 4 exposed
        {"phase": "kk", "step": 2, "start": 10.0, "end": 12.0, "thread": "kk"},
        {"phase": "wait_kk", "step": 2, "start": 13.0, "end": 13.1},  # done before the wait
        {"phase": "kk", "step": 0, "start": 20.0, "end": 30.0, "thread": "kk", "warmup": True},
    ]
    assert hidden_fraction(spans) == pytest.approx(1 - 1 / 6)
    assert hidden_fraction([{"phase": "kk", "step": 0, "start": 0.0, "end": 1.0, "thread": "main"}]) == 0.0
    assert math.isnan(hidden_fraction([]))


def test_a_failure_in_one_ranks_kk_thread_ends_the_launch():
    # Rank 1's KK thread raises; rank 0 is then blocked in the exchange's
    # all-gather that rank 1 never joins: the launch must still end, naming rank 1.
    start = time.monotonic()
    config = TINY.replace(mode="overlap", kk_backend="python")
    with pytest.raises(RankError) as info:
        launch(training.train, 2, config, Faults(rank=1, in_kk=True), device="cpu", timeout_s=240)
    assert info.value.rank == 1
    assert "deliberate failure in the KK thread of rank 1" in str(info.value)
    assert time.monotonic() - start < 200  # stopped, not waited for until the timeout


def test_a_failure_in_one_ranks_main_thread_ends_the_launch():
    with pytest.raises(RankError) as info:
        launch(
            training.train, 2, TINY.replace(mode="sync"), Faults(rank=0, step=1), device="cpu", timeout_s=240
        )
    assert info.value.rank == 0
    assert "deliberate failure on rank 0 at step 1" in str(info.value)


def test_bad_config_is_named():
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        TrainConfig(batchsize=4)
    with pytest.raises(ValueError, match="mode 'async' is not one of 'none', 'sync', 'overlap'"):
        TrainConfig(mode="async")
    with pytest.raises(TypeError, match="steps must be an int >= 1, got bool True"):
        TrainConfig(steps=True)
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got -1"):
        TrainConfig(lr=-1)
    with pytest.raises(TypeError, match="config must be a TrainConfig, got dict"):
        training.train(0, 1, {"mode": "none"})
    with pytest.raises(ValueError, match="embedding_dim=10 is not a multiple of num_heads=4"):
        training.AttentionBlock(10, 16, 4)


def test_public_defaults_carry_no_test_hooks():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not {name for name in fields if "fail" in name}


def test_summarize_takes_each_step_at_its_slowest_rank():
    ranks = [
        {
            "mode": "sync",
            "kk_backend": "python",
            "step_seconds": [9.0, 1.0, 3.0],
            "step_flops": [1, 2, 2],
            "spans": [{}],
            "kk_seconds": [0.5],
            "hidden_fraction": 0.0,
        },
        {
            "mode": "sync",
            "kk_backend": "python",
            "step_seconds": [9.0, 2.0, 1.0],
            "step_flops": [1, 2, 6],
            "spans": [{}, {}],
            "kk_seconds": [0.25],
            "hidden_fraction": 0.0,
        },
    ]
    summary = training.summarize(ranks)  # the first step is warm-up
    assert summary.step_seconds == 2.5  # median of the slowest ranks: 2.0 and 3.0
    assert summary.flops_max_over_mean == pytest.approx((1.0 + 6 / 4) / 2)
    assert summary.kk_seconds == 0.375 and summary.num_spans == 3 and summary.hidden_fraction == 0.0


def test_slowest_rank_seconds_sums_each_steps_slowest_rank_after_warm_up():
    ranks = [{"step_seconds": [9.0, 1.0, 3.0, 2.0]}, {"step_seconds": [8.0, 2.0, 1.0, 2.5]}]
    assert training.slowest_rank_seconds(ranks) == 2.0 + 3.0 + 2.5
    assert training.slowest_rank_seconds(ranks, skip_first=0) == 9.0 + 2.0 + 3.0 + 2.5
    one_step = [{"step_seconds": [4.0]}, {"step_seconds": [5.0]}]
    assert training.slowest_rank_seconds(one_step) == 5.0  # never skips every step

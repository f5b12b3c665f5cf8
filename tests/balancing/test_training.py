"""embnb.balancing.training on 4 real gloo ranks: balanced training follows the same
trajectory as one process on the whole batch, each rank trains on exactly
the part KK gives it, the timeline is complete, and a failing rank (in its
KK thread or its main thread) ends the launch instead of hanging it."""

import math
import time

import pytest
import ranks
import torch

from embnb.balancing import partition as balancer
from embnb.balancing import training
from embnb.balancing.timeline import SHUFFLE_PHASES, hidden_fraction, phase_seconds
from embnb.balancing.training import TrainConfig
from embnb.cuda import loader
from embnb.dist import RankError, launch, launch_each

WORLD_SIZE = 4
TINY = TrainConfig(
    steps=4,
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
    TINY.replace(mode="sync", native_kk=False),
    TINY.replace(mode="overlap", native_kk=True),
    TINY.replace(mode="overlap", native_kk=False, exchange="alltoall"),
    TINY.replace(mode="sync", native_kk=True, exchange="alltoall"),
    TINY.replace(mode="overlap", native_kk=True, shuffle_group="own"),
    TINY.replace(mode="overlap", native_kk=True, shuffle_group="caller"),
]
# where each shuffle phase runs, per mode and group: the loop's thread ("main") or the worker
CALLER_THREADS = {"gather_workloads": "main", "kk": "worker", "exchange": "main"}


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
                result["native_kk"],
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
        parts = balancer.balance(workloads, WORLD_SIZE, "kk_swap", native=False)
        want_balanced = [workloads[p].sum().item() for p in parts]
        want_own = [w.sum().item() for w in per_rank]
        for run in runs:
            got = [result["step_flops"][step] for result in run]
            want = want_own if run[0]["mode"] == "none" else want_balanced
            assert got == pytest.approx(want), (run[0]["mode"], step)


def _one(spans, **match):
    found = [s for s in spans if all(s[k] == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def _overlaps(a, b):
    return min(a["end"], b["end"]) > max(a["start"], b["start"])


def test_timeline_has_every_phase_in_the_thread_the_mode_says(runs):
    for run in runs:
        mode = run[0]["mode"]
        for result in run:
            spans = result["spans"]
            for step in range(TINY.steps):
                phases = {s["phase"] for s in spans if s["step"] == step and s["thread"] == "main"}
                assert {"load", "forward", "backward", "all_reduce", "optimizer", "step"} <= phases
                shuffle = {(s["phase"], s["thread"]) for s in spans if s["step"] == step} & {
                    (p, t) for p in SHUFFLE_PHASES for t in ("main", "worker")
                }
                want = {"none": set(), "sync": {(p, "main") for p in SHUFFLE_PHASES}}.get(mode)
                if want is None:  # overlap
                    caller = run[0]["shuffle_group"] == "caller"
                    want = {(p, CALLER_THREADS[p] if caller else "worker") for p in SHUFFLE_PHASES}
                assert shuffle == want, (mode, run[0]["shuffle_group"], step)
            assert all(s["end"] >= s["start"] and s["rank"] == result["rank"] for s in spans)
            if mode == "none":
                assert math.isnan(result["hidden_fraction"])
            elif mode == "sync":
                assert result["hidden_fraction"] == 0.0


def test_every_mode_loads_and_shuffles_one_batch_per_timed_step(runs):
    timed = training.timed_steps(TINY.steps)
    assert list(timed) == list(range(1, TINY.steps - 1))
    for run in runs:
        mode = run[0]["mode"]
        for result in run:
            for phase in ("load", *SHUFFLE_PHASES):
                count = sum(1 for s in result["spans"] if s["phase"] == phase and s["iteration"] in timed)
                want = 0 if mode == "none" and phase != "load" else len(timed)
                assert count == want, (mode, phase)


def test_overlapped_shuffle_of_the_next_batch_runs_inside_the_step_before_it(runs):
    # on the shared group (the own-group run: the test after the next one)
    for run in (r for r in runs if r[0]["mode"] == "overlap" and r[0]["shuffle_group"] == "shared"):
        for result in run:
            spans = result["spans"]
            for i in range(TINY.steps - 1):
                step, next_step = (
                    _one(spans, phase="step", iteration=i),
                    _one(spans, phase="step", iteration=i + 1),
                )
                shuffle = [s for s in spans if s["phase"] in SHUFFLE_PHASES and s["step"] == i + 1]
                assert len(shuffle) == len(SHUFFLE_PHASES) and {s["thread"] for s in shuffle} == {"worker"}
                backward = _one(spans, phase="backward", iteration=i)
                wait = _one(spans, phase="wait", step=i + 1)
                all_reduce = _one(spans, phase="all_reduce", iteration=i)
                # batch i+1 is shuffled after step i began and before it all-reduces ...
                assert all(step["start"] <= s["start"] and s["end"] <= all_reduce["start"] for s in shuffle)
                assert all(s["end"] <= next_step["start"] for s in shuffle)
                # ... and the loop waits for it only once its own compute is done
                assert backward["end"] <= wait["start"] and wait["end"] <= all_reduce["start"]
            # the loop runs no collective on the group while the worker may
            worker = [s for s in spans if s["thread"] == "worker"]
            for reduce in (s for s in spans if s["phase"] == "all_reduce"):
                assert not any(_overlaps(reduce, w) for w in worker)
            assert 0.0 <= result["hidden_fraction"] <= 1.0


def test_synchronous_shuffle_runs_before_the_compute_of_its_step(runs):
    for run in (r for r in runs if r[0]["mode"] == "sync"):
        for result in run:
            spans = result["spans"]
            assert not [s for s in spans if s["thread"] == "worker"]
            for i in range(TINY.steps):
                forward = _one(spans, phase="forward", iteration=i)
                for s in (s for s in spans if s["phase"] in SHUFFLE_PHASES and s["step"] == i):
                    assert s["end"] <= forward["start"] and s["iteration"] == i


def test_own_group_worker_is_waited_for_after_the_optimizer_the_shared_one_before_the_all_reduce(runs):
    by_group = {run[0]["shuffle_group"]: run for run in runs if run[0]["mode"] == "overlap"}
    assert sorted(by_group) == ["caller", "own", "shared"]
    for group, run in ((g, by_group[g]) for g in ("own", "shared")):
        for result in run:
            spans = result["spans"]
            for step in range(1, TINY.steps - 1):
                wait = _one(spans, phase="wait", step=step + 1)
                all_reduce = _one(spans, phase="all_reduce", step=step)
                optimizer = _one(spans, phase="optimizer", step=step)
                shuffle = [s for s in spans if s["phase"] in SHUFFLE_PHASES and s["step"] == step + 1]
                assert {s["thread"] for s in shuffle} == {"worker"}
                if group == "own":  # the worker may run under the all-reduce: waited for after the step
                    assert wait["start"] >= optimizer["end"]
                    assert all(s["end"] <= wait["end"] for s in shuffle)
                else:
                    assert wait["end"] <= all_reduce["start"]


def test_the_callers_thread_gathers_before_the_step_and_exchanges_before_the_all_reduce(runs):
    (run,) = [r for r in runs if r[0]["shuffle_group"] == "caller"]
    for result in run:
        spans = result["spans"]
        for step in range(1, TINY.steps - 1):
            gather = _one(spans, phase="gather_workloads", step=step + 1)
            kk = _one(spans, phase="kk", step=step + 1)
            exchange = _one(spans, phase="exchange", step=step + 1)
            forward = _one(spans, phase="forward", iteration=step)
            all_reduce = _one(spans, phase="all_reduce", iteration=step)
            assert gather["end"] <= forward["start"] and gather["iteration"] == step  # start(), before
            assert gather["end"] <= kk["start"] and kk["end"] <= exchange["start"]
            assert exchange["end"] <= all_reduce["start"]  # finish(), before the all-reduce


def test_a_bad_shuffle_group_is_named():
    with pytest.raises(ValueError, match="shuffle_group 'mine' is not one of 'shared', 'own', 'caller'"):
        TrainConfig(shuffle_group="mine")


def test_hidden_fraction_by_hand():
    spans = [
        {"phase": "gather_workloads", "step": 1, "start": 0.0, "end": 1.0, "thread": "worker"},
        {"phase": "kk", "step": 1, "start": 1.0, "end": 4.0, "thread": "worker"},
        {"phase": "wait", "step": 1, "start": 3.0, "end": 4.5, "thread": "main"},  # 1 of 4 exposed
        {"phase": "exchange", "step": 2, "start": 10.0, "end": 12.0, "thread": "worker"},
        {"phase": "wait", "step": 2, "start": 13.0, "end": 13.1, "thread": "main"},  # done before the wait
        {"phase": "kk", "step": 0, "start": 20.0, "end": 30.0, "thread": "worker", "warmup": True},
        {"phase": "forward", "step": 1, "start": 0.0, "end": 9.0, "thread": "main"},  # not the shuffle's
    ]
    assert hidden_fraction(spans) == pytest.approx(1 - 1 / 6)
    assert hidden_fraction([{"phase": "kk", "step": 0, "start": 0.0, "end": 1.0, "thread": "main"}]) == 0.0
    assert math.isnan(hidden_fraction([]))


def test_phase_seconds_averages_per_iteration_and_rank():
    spans = [
        {"phase": "kk", "iteration": 1, "start": 0.0, "end": 2.0, "thread": "worker", "rank": 0},
        {"phase": "kk", "iteration": 2, "start": 0.0, "end": 4.0, "thread": "worker", "rank": 1},
        {
            "phase": "kk",
            "iteration": 3,
            "start": 0.0,
            "end": 50.0,
            "thread": "worker",
            "rank": 1,
        },  # not asked
        {"phase": "forward", "iteration": 1, "start": 0.0, "end": 8.0, "thread": "main", "rank": 0},
    ]
    # 2 iterations x 2 ranks: (2 + 4) / 4 and 8 / 4
    assert phase_seconds(spans, [1, 2]) == {("worker", "kk"): 1.5, ("main", "forward"): 2.0}


def test_a_failure_in_one_ranks_kk_thread_ends_the_launch():
    # Rank 1's KK thread raises; rank 0 is then blocked in the exchange's
    # all-gather that rank 1 never joins: the launch must still end, naming rank 1.
    timeout_s = 120
    start = time.monotonic()
    config = TINY.replace(mode="overlap", native_kk=False)
    with pytest.raises(RankError) as info:
        launch(ranks.train_failing_in_kk, 2, config, 1, device="cpu", timeout_s=timeout_s)
    assert info.value.rank == 1
    assert "deliberate failure in the KK thread of rank 1" in str(info.value)
    # stopped when rank 1 failed, not when the timeout ran out (a run takes seconds)
    assert time.monotonic() - start < timeout_s / 4


def test_a_failure_in_one_ranks_main_thread_ends_the_launch():
    with pytest.raises(RankError) as info:
        launch(ranks.train_failing_at_step, 2, TINY.replace(mode="sync"), 0, 1, device="cpu", timeout_s=120)
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


def test_slowest_rank_takes_each_timed_steps_slowest_rank():
    ranks = [{"step_seconds": [9.0, 1.0, 3.0, 2.0]}, {"step_seconds": [8.0, 2.0, 1.0, 2.5]}]
    assert training.slowest_rank(ranks) == [2.0, 3.0]
    assert training.slowest_rank(ranks, skip_first=0) == [9.0, 2.0, 3.0]
    one_step = [{"step_flops": [4.0]}, {"step_flops": [5.0]}]
    assert training.slowest_rank(one_step, "step_flops") == [5.0]  # never skips every step
    assert list(training.timed_steps(2)) == [1] and list(training.timed_steps(6, 2)) == [2, 3, 4]

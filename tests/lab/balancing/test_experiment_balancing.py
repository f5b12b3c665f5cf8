"""embnb.lab.balancing.experiment: repeated training runs in one launch, and
the step-time speed-ups computed from them."""

import functools

import pytest

from embnb.balancing.kjt_alltoall import compare_exchanges
from embnb.balancing.training import TrainConfig
from embnb.lab.balancing import experiment

TINY = TrainConfig(
    steps=2, batch_size=4, max_length=32, num_items=20, num_categories=4, embedding_dim=8, ffn_dim=8
)


def test_repeats_run_interleaved_and_each_label_gets_its_own_runs():
    configs = {"plain": TINY.replace(mode="none"), "balanced": TINY.replace(mode="sync")}
    also = {"exchanges": functools.partial(compare_exchanges, batch_size=4)}  # before training
    runs = experiment.run_training(configs, 2, device="cpu", repeats=2, timeout_s=300, also=also)
    assert runs.backend == "gloo" and [r["identical"] for r in runs.also["exchanges"]] == [True, True]
    records = experiment.exchange_records({2: runs.also["exchanges"]})
    assert [(r["exchange"], r["identical"]) for r in records] == [("allgather", True), ("alltoall", True)]
    assert all(0 < r["ms_low"] <= r["ms_median"] <= r["ms_high"] for r in records)
    assert list(runs.per_repeat) == ["plain", "balanced"]
    for label, config in configs.items():
        repeats = runs.per_repeat[label]
        assert len(repeats) == 2
        for ranks in repeats:
            assert [r["rank"] for r in ranks] == [0, 1]
            assert {r["mode"] for r in ranks} == {config.mode}
        # the same global batches every repeat: the same losses
        assert repeats[0][0]["losses"] == pytest.approx(repeats[1][0]["losses"])
    assert runs.same_weights()
    table = runs.table("plain")
    assert table.loc["plain", ["speedup", "speedup_low", "speedup_high"]].tolist() == [1.0, 1.0, 1.0]
    assert table.loc["balanced", "speedup"] > 0 and table.loc["plain", "flops_predict"] == 1.0


def _ranks(*step_seconds):
    return [{"step_seconds": list(s)} for s in step_seconds]


def test_speedups_compare_each_repeat_at_its_slowest_ranks_over_the_timed_steps():
    runs = experiment.TrainingRuns(
        backend="gloo",
        per_repeat={
            # timed steps 1 and 2 (not the warm-up, not the last): repeat 0 takes 4 + 6 = 10 s, repeat 1 12 s
            "none": [_ranks([9, 4, 6, 50], [1, 1, 5, 1]), _ranks([9, 6, 6, 1], [9, 2, 2, 1])],
            # repeat 0 takes 2 + 3 = 5 s, repeat 1 takes 4 + 4 = 8 s
            "kk": [_ranks([0, 2, 3, 1], [0, 1, 2, 1]), _ranks([0, 4, 1, 1], [0, 3, 4, 1])],
        },
    )
    assert runs.step_ms("none") == [5000.0, 6000.0] and runs.step_ms("kk") == [2500.0, 4000.0]
    difference = runs.difference("kk", "none")
    assert (difference.mean, difference.low, difference.high) == (-2250.0, -2500.0, -2000.0)
    with pytest.raises(ValueError, match="reference 'sync' is not a run; runs: \\['none', 'kk'\\]"):
        runs.table("sync")


def test_flops_speedups_divide_the_slowest_ranks_flops():
    def ranks(*flops):
        return [{"step_flops": list(f), "step_seconds": [1.0] * len(f)} for f in flops]

    runs = experiment.TrainingRuns(
        backend="gloo",
        per_repeat={"none": [ranks([0, 8, 6, 99], [0, 2, 2, 0])], "kk": [ranks([0, 5, 4, 0], [0, 5, 4, 99])]},
    )
    # timed steps 1 and 2: (8 + 6) / (5 + 4)
    assert runs.flops_speedups("none") == {"none": 1.0, "kk": pytest.approx(14 / 9)}


def test_bad_repeats_is_named():
    with pytest.raises(ValueError, match="repeats"):
        experiment.run_training({"plain": TINY}, 2, device="cpu", repeats=0)


def test_summaries_add_up_the_shuffle_and_pool_the_hidden_time_over_repeats():
    def span(phase, step, start, end, thread="main"):
        return {"phase": phase, "step": step, "start": start, "end": end, "thread": thread, "warmup": False}

    config = {"mode": "sync", "native_kk": False, "exchange": "allgather", "shuffle_group": "shared"}

    def rank(r, spans):
        return config | {"rank": r, "step_seconds": [1.0] * 4, "spans": spans}

    # repeat 0: the shuffle on the loop's thread (all exposed), step 1: 0.5 + 0.5 on rank 0, 3 on rank 1
    exposed = [
        rank(0, [span("kk", 1, 0.0, 0.5), span("exchange", 1, 0.5, 1.0), span("forward", 1, 1, 9)]),
        rank(1, [span("gather_workloads", 1, 0.0, 3.0)]),
    ]
    # repeat 1: the same phases in the worker, done before the loop waits for them: all hidden
    hidden = [
        dict(r, spans=[dict(s, thread="worker") for s in r["spans"]] + [span("wait", 1, 5.0, 5.1)])
        for r in exposed
    ]
    plain = [rank(r, [span("forward", 1, 0.0, 1.0)]) for r in range(2)]
    runs = experiment.TrainingRuns("gloo", {"balanced": [exposed, hidden], "none": [plain]})
    summaries = runs.summaries()
    # per timed step (4 steps: 1 and 2) and rank (2): (0.5 + 0.5 + 3) / 4, in either repeat
    assert summaries["balanced"] == config | {"shuffle_seconds": pytest.approx(1.0), "hidden_fraction": 0.5}
    assert summaries["none"] == config | {"shuffle_seconds": 0.0, "hidden_fraction": None}

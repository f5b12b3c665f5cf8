"""embnb.balancing.experiment: repeated training runs in one launch, and
the step-time speed-ups computed from them."""

import pytest

from embnb.balancing import experiment
from embnb.balancing.training import TrainConfig
from embnb.timing import Ratio

TINY = TrainConfig(
    steps=2, batch_size=4, max_length=32, num_items=20, num_categories=4, embedding_dim=8, ffn_dim=8
)


def test_repeats_run_interleaved_and_each_label_gets_its_own_runs():
    configs = {"plain": TINY.replace(mode="none"), "balanced": TINY.replace(mode="sync")}
    runs = experiment.run_training(configs, 2, device="cpu", repeats=2, timeout_s=300)
    assert runs.gathers == [] and runs.backend == "gloo"
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
    speedups = runs.speedups("plain")
    assert speedups["plain"] == Ratio(1.0, 1.0, 1.0, 2)
    assert speedups["balanced"].repeats == 2 and speedups["balanced"].median > 0


def _ranks(*step_seconds):
    return [{"step_seconds": list(s)} for s in step_seconds]


def test_speedups_compare_each_repeat_at_its_slowest_ranks():
    runs = experiment.TrainingRuns(
        backend="gloo",
        seconds=0.0,
        gathers=[],
        per_repeat={
            # steps after the first: repeat 0 takes 4 + 6 = 10 s, repeat 1 takes 12 s
            "none": [_ranks([9, 4, 6], [1, 1, 5]), _ranks([9, 6, 6], [9, 2, 2])],
            # repeat 0 takes 2 + 3 = 5 s, repeat 1 takes 4 + 4 = 8 s
            "kk": [_ranks([0, 2, 3], [0, 1, 2]), _ranks([0, 4, 1], [0, 3, 4])],
        },
    )
    speedups = runs.speedups("none")
    assert speedups["kk"] == Ratio(median=(10 / 5 + 12 / 8) / 2, low=1.5, high=2.0, repeats=2)
    with pytest.raises(ValueError, match="reference 'sync' is not a run; runs: \\['none', 'kk'\\]"):
        runs.speedups("sync")


def test_bad_repeats_is_named():
    with pytest.raises(ValueError, match="repeats"):
        experiment.run_training({"plain": TINY}, 2, device="cpu", repeats=0)

"""embnb.lab.planner.measured: what the figure draws and what the world
reports, on plans written here (the notebook test runs real ones)."""

import math

import pytest

from embnb.lab.planner.measured import (
    MeasuredPlan,
    MeasuredWorld,
    MeasureSettings,
    estimate_over_measured,
    measure_device,
    measure_world,
    measured_vs_estimated,
)
from embnb.steptime.kernels import fbgemm_cuda_available


def _plan(name, rating, lookups, estimates, dense=1.0):
    return MeasuredPlan(
        name, rating, "", {"table_wise": 2, "shards": 2}, max(lookups) + dense, max(lookups),
        lookups.index(max(lookups)), 2 * (max(lookups) + dense), lookups, estimates, [0.0] * len(lookups),
    )  # fmt: skip


WORLD = MeasuredWorld(
    2,
    [
        _plan("fast", 1.0, [2.0, 1.0], [1.0, 0.5]),
        MeasuredPlan("no plan", math.nan, "failed: ZeroDivisionError: float division by zero"),
        _plan("slow", 4.0, [8.0, 0.0], [4.0, 0.0]),
    ],
    MeasureSettings(local_batch_size=4),
    device_name="test CPU",
)


def test_world_reports_its_measured_plans():
    assert [p.name for p in WORLD.measured()] == ["fast", "slow"]
    assert WORLD.winner().name == "fast" and WORLD.spearman("lookup_ms") == pytest.approx(1.0)
    assert estimate_over_measured(WORLD) == [0.5, 0.5]
    plans = WORLD.to_json()["plans"]
    assert plans["no plan"]["rating_ms"] is None and plans["fast"]["lookup_per_rank_ms"] == [2.0, 1.0]


def test_figure_draws_each_plan_and_each_rank_with_a_shard():
    fig = measured_vs_estimated([WORLD])
    top, bottom = fig.axes[0], fig.axes[1]
    drawn = [tuple(c.get_offsets()[0]) for c in top.collections]
    assert drawn == [(1.0, 3.0), (1.0, 2.0), (4.0, 9.0), (4.0, 8.0)]  # step, then lookups, per plan
    ranks = [tuple(map(tuple, c.get_offsets())) for c in bottom.collections]
    assert ranks == [((1.0, 2.0), (0.5, 1.0)), ((4.0, 8.0),)]  # the rank with no shard left out
    assert "1 ranks with no shard left out" in bottom.get_title()
    assert "CPU (test CPU)" in fig._suptitle.get_text()  # the figure names its device
    with pytest.raises(ValueError, match="worlds is empty"):
        measured_vs_estimated([])


def test_measure_device_runs_cuda_only_with_fbgemms_cuda_kernels():
    assert measure_device("cpu") == measure_device("cpu") and measure_device("cpu").note == ""
    assert (measure_device("cpu").device, measure_device("cpu").clock) == ("cpu", "cpu")
    for asked in ("cuda", "auto"):
        where = measure_device(asked)
        if fbgemm_cuda_available():
            assert (where.device, where.clock, where.note) == ("cuda", "wall", "")
        else:  # skipped, and says so: never a crash
            assert (where.device, where.clock) == ("cpu", "cpu")
            assert f"device={asked!r}" in where.note and "CUDA measurement is skipped" in where.note
    with pytest.raises(ValueError, match="'gpu' is not one of"):
        measure_device("gpu")
    with pytest.raises(ValueError, match="'auto' is not one of"):
        measure_world(None, 2, MeasureSettings(4, device="auto"))  # measure_device resolves it first

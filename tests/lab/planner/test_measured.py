"""embnb.lab.planner.measured: what the world reports and what its figure draws, on plans written
here (the notebook test runs real ones)."""

import math

import pytest

from embnb.lab.planner.figures import measured_figure
from embnb.lab.planner.measured import (
    MeasuredPlan,
    MeasuredWorld,
    MeasureSettings,
    measure_device,
    measure_world,
)
from embnb.steptime.kernels import fbgemm_cuda_available


def _plan(name, rating, lookups, estimates, rounds, note="", paired=None):
    return MeasuredPlan(
        name, rating, note, {"table_wise": 2, "shards": 2}, sorted(rounds)[len(rounds) // 2], max(lookups),
        lookups.index(max(lookups)), 2 * max(rounds), lookups, estimates, [0.1] * len(lookups), 0, rounds,
        paired,
    )  # fmt: skip


WORLD = MeasuredWorld(
    2,
    [
        _plan("embnb DP", 1.0, [2.0, 1.0], [1.0, 0.5], [3.0, 3.2, 2.9]),
        MeasuredPlan("torchrec DP", math.nan, "failed: ZeroDivisionError: float division by zero"),
        _plan(
            "Greedy",
            1.5,
            [2.5, 1.0],
            [1.5, 0.5],
            [3.1, 3.3, 2.8],
            paired={"mean": 0.03, "ci_low": -0.2, "ci_high": 0.3},
        ),  # fmt: skip
        _plan("all table-wise on 1 rank", 4.0, [8.0, 0.0], [4.0, 0.0], [9.0], note="poor on purpose"),
    ],
    MeasureSettings(local_batch_size=4),
    device_name="test CPU",
)


def test_world_reports_its_measured_plans_as_a_table():
    assert [p.name for p in WORLD.measured()] == ["embnb DP", "Greedy", "all table-wise on 1 rank"]
    assert [p.name for p in WORLD.measured(planners_only=True)] == ["embnb DP", "Greedy"]
    table = WORLD.table()
    assert table.loc["Greedy", "verdict"] == "not told apart" and table.loc["embnb DP", "verdict"] == ""
    assert table.loc["torchrec DP", "verdict"].startswith("failed: ZeroDivisionError")
    assert table.loc["all table-wise on 1 rank", "poor"] and table.loc["Greedy", "step, ms"] == 3.1


def test_figure_gives_the_planners_plans_axes_of_their_own():
    fig = measured_figure(WORLD)
    left, right = fig.axes[:2]
    dots = [tuple(map(tuple, c.get_offsets())) for c in left.collections]
    assert dots == [((0, 3.0), (0, 3.2), (0, 2.9)), ((1, 3.1), (1, 3.3), (1, 2.8))]  # no poor plan there
    assert left.get_ylim()[1] < 4  # the poor plan's 9 ms does not set these axes
    assert [tuple(c.get_offsets()[0]) for c in right.collections] == [(1.0, 3.0), (1.5, 3.1), (4.0, 9.0)]
    assert "CPU (test CPU)" in fig._suptitle.get_text()  # the figure names its device


def test_measure_device_runs_cuda_only_with_fbgemms_cuda_kernels():
    assert measure_device("cpu") == ("cpu", "")
    for asked in ("cuda", "auto"):
        device, note = measure_device(asked)
        if fbgemm_cuda_available():
            assert (device, note) == ("cuda", "")
        else:  # skipped, and says so: never a crash
            assert device == "cpu" and f"device={asked!r}" in note and "CUDA measurement is skipped" in note
    with pytest.raises(ValueError, match="'gpu' is not one of"):
        measure_device("gpu")
    with pytest.raises(ValueError, match="world_size"):
        measure_world(None, 1, MeasureSettings(4))

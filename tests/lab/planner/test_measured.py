"""embnb.lab.planner.candidates.measure_candidates on a tiny model: its rows against the measured
ranks and torchrec's estimates read again, and the figure that gives the planners' plans axes of
their own. No speed is asserted."""

import statistics

import pytest

from embnb.lab.planner.candidates import PLANNERS, POOR, measure_candidates
from embnb.lab.planner.figures import measured_figure
from embnb.lab.planner.models import make_model


@pytest.fixture(scope="module")
def measured():
    model = make_model(6, seed=0, max_rows=2000)
    return measure_candidates(model, 2, 8, 2, device="cpu", warmup=0, hidden=(8,), timeout_s=10)


def test_rows_are_the_measured_ranks_and_torchrecs_estimates(measured):
    rows = {row["plan"]: row for row in measured.rows()}
    assert list(rows)[: len(PLANNERS)] == list(PLANNERS)
    world = measured.world
    for name, row in rows.items():
        candidate = measured.candidates[name]
        assert row["poor"] == (candidate.note == POOR)
        plan = world.plans.get(name)
        if plan is None or not plan.measured:  # e.g. torchrec's DP on a CPU topology
            assert "step_ms" not in row and row["note"], name
            continue
        ranks = plan.times.ranks
        steps = [[r.compute.cpu_s[i] * 1e3 for r in ranks] for i in range(plan.times.repeats)]
        assert row["step_ms_rounds"] == pytest.approx([max(s) for s in steps]), name
        assert row["step_ms"] == pytest.approx(statistics.median(row["step_ms_rounds"])), name
        assert row["lookup_per_rank_ms"] == pytest.approx(
            [statistics.median(r.lookup.cpu_s) * 1e3 for r in ranks]
        )
        # torchrec's rating is its slowest rank's estimated total
        assert row["rating_ms"] == pytest.approx(max(row["estimated_per_rank_ms"])), name
        assert sum(v for k, v in row["shape"].items() if k != "shards") == 6, name
        rounds = 1 if row["poor"] else 2  # the poor plans: measured alone, one timed step
        assert len(row["step_ms_rounds"]) == rounds and plan.interleaved != row["poor"], name
        if row["poor"] or name == "embnb DP":
            assert row["minus_embnb_dp_mean"] is None and row["verdict"] is None, name
        else:
            diffs = [a - b for a, b in zip(row["step_ms_rounds"], rows["embnb DP"]["step_ms_rounds"])]
            assert row["minus_embnb_dp_mean"] == pytest.approx(statistics.fmean(diffs)), name
            told = row["minus_embnb_dp_ci_low"] > 0 or row["minus_embnb_dp_ci_high"] < 0
            assert (name in world.told_apart()) == told, name
    record = measured.record()
    assert record["world_size"] == 2 and record["clock"] == "cpu" and record["rounds"] == 2
    assert record["told_apart"] == world.told_apart()


def test_figure_gives_the_planners_plans_axes_of_their_own(measured):
    fig = measured_figure(measured)
    left, right = fig.axes[:2]
    rows = [r for r in measured.rows() if r.get("step_ms") is not None]
    planners = [r for r in rows if not r["poor"]]
    ticks = [t.get_text() for t in left.get_xticklabels()]
    assert ticks == [r["plan"] for r in planners]  # no poor plan there
    slowest_poor = max(r["step_ms"] for r in rows if r["poor"])
    highest = max(max(r["step_ms_rounds"]) for r in planners)
    assert left.get_ylim()[1] < slowest_poor or slowest_poor <= highest  # the poor plans set no axis here
    dots = sorted(float(v) for c in right.collections for xy in c.get_offsets() for v in xy)
    assert dots == pytest.approx(sorted(v for r in rows for v in (r["rating_ms"], r["step_ms"])))
    assert "CPU (" in fig._suptitle.get_text()  # the figure names its device


def test_bad_world_size_is_named():
    with pytest.raises(ValueError, match="world_size"):
        measure_candidates(make_model(3), 1, 8, 2)
    with pytest.raises(ValueError, match="'gpu'"):
        measure_candidates(make_model(3), 2, 8, 2, device="gpu")

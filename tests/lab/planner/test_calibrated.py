"""embnb.lab.planner.calibrated on a bench file written here, with numbers
chosen so the errors, the fastest plan and the repeat gaps are known by hand
(the notebook test checks the committed bench)."""

import json

import pytest

from embnb.lab.planner.calibrated import (
    calibration_record,
    gpu_uvm_runs,
    heldout_ranks,
    load_calibration_bench,
    measured_plans,
    rank_repeat_gaps,
)
from embnb.lab.planner.figures import calibration_scatter
from embnb.results import COMMITTED_RESULTS


def _plan(name, same_as, steps, ranks):
    low, median, high = steps
    return {
        "plan": name,
        "estimator": "calibrated" if "calibrated" in name else "torchrec default",
        "measured": True,
        "same_as": same_as,
        "step_ms": {"median": median, "low": low, "high": high},
        "ranks": [
            {"rank": i, "lookup_ms": m, "torchrec_estimate_ms": d, "calibrated_estimate_ms": c, "shards": s}
            for i, (m, d, c, s) in enumerate(ranks)
        ],
    }


def _bench(date, device="cpu"):
    committed = json.loads(next(COMMITTED_RESULTS.glob("calibrate-*.json")).read_text())
    plans = [
        # measured, torchrec's default, calibrated, shards: errors 0.5/0.1, 0.9/0.2, and a rank with none
        _plan("embnb DP", "embnb DP", (9.0, 10.0, 11.0), [(10.0, 5.0, 11.0, 1), (4.0, 0.4, 4.8, 2)]),
        _plan("Greedy", "Greedy", (11.5, 12.0, 12.5), [(10.0, 15.0, 7.0, 1), (1.0, 0.0, 0.0, 0)]),
        _plan("embnb DP (calibrated)", "embnb DP", (10.5, 11.0, 12.0), [(8.0, 8.0, 8.0, 1)]),
        {"plan": "torchrec DP", "estimator": "torchrec default", "measured": False},
    ]
    return {
        "device": device,
        "machine": "test machine",
        "clock": "cpu",
        "date": date,
        "repeats": 3,
        "model": {"tables": 2, "max_rows": 1000},
        "batch_size": 4,
        "train": {"ranks": 7},
        "calibration": committed["calibration"],
        "heldout": [{"seed": 0, "world_size": 2, "plans": plans, "fastest": "embnb DP"}],
    }


@pytest.fixture()
def results(tmp_path):
    for date in ("2026-01-01", "2026-02-01"):
        (tmp_path / f"calibrate-{date}-x.json").write_text(json.dumps(_bench(date)))
    return tmp_path


def test_loads_the_newest_bench_of_the_device_kind(results):
    bench = load_calibration_bench("cpu", results)
    assert bench.data["date"] == "2026-02-01" and bench.machine == "test machine"
    with pytest.raises(FileNotFoundError, match="no calibrate bench measured on 'cuda'"):
        load_calibration_bench("cuda", results)
    with pytest.raises(ValueError, match="'gpu' is not one of"):
        load_calibration_bench("gpu", results)


def test_errors_fastest_plan_and_repeat_gaps(results):
    bench = load_calibration_bench("cpu", results)
    ranks = heldout_ranks(bench)
    assert len(ranks) == 4  # the rank holding no shard and the unmeasured plan left out
    record = calibration_record(bench)
    default, calibrated = record["heldout_errors"]["torchrec_default"], record["heldout_errors"]["calibrated"]
    # |5/10-1|, |0.4/4-1|, |15/10-1|, |8/8-1| = 0.5, 0.9, 0.5, 0: median 0.5, worst 0.9
    assert default == {"median": pytest.approx(0.5), "worst": pytest.approx(0.9), "ranks": 4}
    # 0.1, 0.2, 0.3, 0: median 0.15, worst 0.3; the goal (0.10) not met
    assert calibrated["median"] == pytest.approx(0.15) and calibrated["worst"] == pytest.approx(0.3)
    assert record["goal_met"] is False
    plans = measured_plans(bench).set_index("plan")
    assert plans.over_fastest.to_dict() == pytest.approx(
        {"embnb DP": 1.0, "Greedy": 1.2, "embnb DP (calibrated)": 1.1}
    )
    assert plans.loc["embnb DP", "spread"] == pytest.approx(11 / 9 - 1)
    # the same placement measured twice, 11 against 10 ms; the others were measured once
    assert plans.loc["embnb DP (calibrated)", "gap_to_same_as"] == pytest.approx(0.1)
    assert plans.gap_to_same_as.isna().sum() == 2
    # rank by rank: rank 0 of that placement, 8 against 10 ms (rank 1 was not measured again)
    (gap,) = rank_repeat_gaps(bench.data["heldout"]).to_dict(orient="records")
    assert (gap["plan"], gap["rank"], gap["gap"]) == ("embnb DP (calibrated)", 0, pytest.approx(0.2))
    assert record["rank_repeat_gap"] == {"median": pytest.approx(0.2), "ranks": 1}
    fig = calibration_scatter(ranks, bench)
    assert "CPU (test machine)" in fig._suptitle.get_text()
    assert "median 50.0%, worst 90%" in fig.axes[0].get_title()


def test_no_placement_measured_twice_gives_no_rank_gap(tmp_path):
    bench = _bench("2026-03-01")
    for plan in bench["heldout"][0]["plans"]:
        plan["same_as"] = plan["plan"]
    (tmp_path / "calibrate-2026-03-01-x.json").write_text(json.dumps(bench))
    loaded = load_calibration_bench("cpu", tmp_path)
    assert rank_repeat_gaps(loaded.data["heldout"]).empty
    assert calibration_record(loaded)["rank_repeat_gap"] is None


def test_paired_plans_name_a_side_only_where_the_interval_excludes_zero(tmp_path):
    """Each plan's step minus embnb DP (calibrated)'s, as the bench paired them: "slower" where the
    95% interval lies above 0, "faster" below, else "not told apart"; a bench without pairs has none."""
    bench = _bench("2026-03-01")
    plans = bench["heldout"][0]["plans"]
    intervals = {"embnb DP": (0.2, 0.1, 0.4), "Greedy": (-0.5, -0.9, 0.3)}
    for plan in plans:
        plan["note"] = ""
        if plan["plan"] in intervals:
            mean, low, high = intervals[plan["plan"]]
            plan["minus_embnb DP (calibrated)"] = {"mean": mean, "ci_low": low, "ci_high": high, "repeats": 3}
    poor = _plan("all table-wise on 1 rank", "all table-wise on 1 rank", (20.0, 21.0, 22.0), [])
    poor["note"] = "poor on purpose"
    poor["minus_embnb DP (calibrated)"] = {"mean": 10.0, "ci_low": -1.0, "ci_high": -0.5, "repeats": 3}
    plans.append(poor)
    (tmp_path / "calibrate-2026-03-01-x.json").write_text(json.dumps(bench))
    loaded = load_calibration_bench("cpu", tmp_path)
    table = measured_plans(loaded)
    assert table[["plan", "poor", "verdict"]].fillna("-").values.tolist() == [
        ["embnb DP", False, "slower"],
        ["Greedy", False, "not told apart"],
        ["embnb DP (calibrated)", False, "-"],  # the reference
        ["all table-wise on 1 rank", True, "faster"],
    ]
    record = calibration_record(loaded)
    assert [p["verdict"] for p in record["plans"]] == ["slower", "not told apart", None, "faster"]
    assert record["plans"][1]["ci_low_ms"] == -0.9
    unpaired = _bench("2026-03-02")
    (tmp_path / "calibrate-2026-03-02-x.json").write_text(json.dumps(unpaired))
    plans = calibration_record(load_calibration_bench("cpu", tmp_path))["plans"]
    assert [p["verdict"] for p in plans] == [None, None, None]


def test_the_gpu_runs_of_the_uvm_regime_are_read_as_committed(tmp_path):
    plan = {"measured": True, "critical_path_s": 0.005, "rating_s": 0.015, "kernels": {"fused_uvm": 3}}
    poor = {**plan, "plan": "all data-parallel", "note": "poor on purpose"}
    world = {"world_size": 8, "hbm_cap_gb": 0.06, "plans": [{**plan, "plan": "embnb DP"}, poor]}
    payload = {"device": "cuda", "machine": "H", "date": "2026-01-01", "repeats": 3, "worlds": [world]}
    (tmp_path / "steptime_capped-2026-01-01-x.json").write_text(json.dumps(payload))
    (tmp_path / "steptime_capped-2026-01-01-y.json").write_text(json.dumps({**payload, "device": "cpu"}))
    (row,) = gpu_uvm_runs(tmp_path).to_dict(orient="records")
    assert (row["plan"], row["measured_ms"], row["rating_ms"]) == ("embnb DP", 5.0, 15.0)
    assert row["kernels"] == "3 fused_uvm" and row["date"] == "2026-01-01"

"""`python -m embnb.bench calibrate` on tiny sizes: its JSON's summary figures (held-out errors, the
fastest plan, critical paths) agree with its own per-rank rows, its calibration loads, and each
plan's rating is torchrec's estimate of its slowest rank. No speed is asserted."""

from __future__ import annotations

import json
import statistics

import pytest

from embnb.lab.planner.models import make_model
from embnb.planner.calibration import Calibration
from embnb.steptime import make_batch


def run(capsys, *args: str) -> tuple[int, str, str]:
    from embnb.bench.__main__ import main

    try:
        code = main(["calibrate", *args])
    except SystemExit as stop:  # argparse
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrate_bench_summary_agrees_with_its_ranks(tmp_path, capsys):
    code, out, err = run(
        capsys,
        *("--tables", "5", "--max-rows", "2000", "--batch-size", "8", "--train-seeds", "1"),
        *("--train-world-sizes", "2", "3", "--train-plans", "3", "--heldout", "0:2", "--timeout-s", "5"),
        *("--terms", "lookup_size_multiplier", "--warmup", "0", "--repeats", "2", "--out", str(tmp_path)),
        *("--collective-world-size", "2"),
    )
    assert code == 0, out + err
    (path,) = tmp_path.glob("calibrate-*.json")
    payload = json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    calibration = Calibration.from_json(payload["calibration"])
    assert calibration.device_kind == "cpu" and calibration.device_name == payload["machine"]
    assert len(calibration.fit_errors) == payload["train"]["ranks"] > 0
    # collective_ms: measured on 2 gloo ranks, positive for every type with collectives of its own
    collectives = payload["collectives"]
    assert (collectives["world_size"], collectives["backend"], collectives["why"]) == (2, "gloo", "")
    assert calibration.collective_ms == collectives["collective_ms"]
    assert all(ms > 0 for t, ms in calibration.collective_ms.items() if t != "data_parallel")
    # the speed probe: three timings of one rank that reads every id of its tables' features
    probe = payload["speed_probe"]
    assert set(probe["ms"]) == {"before_training", "after_training", "after_heldout"}
    assert all(ms > 0 for ms in probe["ms"].values())
    probe_model = make_model(probe["tables"], seed=probe["seed"], max_rows=2000)
    probe_batch = make_batch(probe_model.tables, probe_model.constraints, 8, 8, 0)
    assert probe["ids"] == sum(int(bag.sum()) for rank in probe_batch.lengths for bag in rank) > 0
    (world,) = payload["heldout"]
    measured = [p for p in world["plans"] if p["measured"]]
    # the calibrated DP's rating holds the collectives of each sharding type its plan uses
    dp = next(p for p in measured if p["plan"] == "embnb DP (calibrated)")
    assert dp["note"] == ""  # the planner rated the DP's plan as its replica did: no disagreement
    used = [t for t in dp["shape"] if t != "shards"]
    # (its plan may be all data-parallel on this tiny model: no collectives of its own, a term of 0)
    assert dp["rating_ms"] > sum(calibration.collective_ms[t] for t in used)
    assert {"embnb DP", "torchrec default", "embnb DP (calibrated)"} <= {p["plan"] for p in measured}
    for plan in measured:
        assert len(plan["ranks"]) == world["world_size"]
        for key in ("step_ms", "lookup_ms"):
            assert plan[key]["low"] <= plan[key]["median"] <= plan[key]["high"]
        # the slowest rank per repeat is at least any rank's median
        assert plan["step_ms"]["high"] >= max(r["step_ms"] for r in plan["ranks"])
        fitted = {"/".join(group) for group in calibration.coefficients}
        for group, priced_as in plan["priced_without_own_fit"].items():  # a sibling's fit, or the default
            assert group not in fitted and group.split("/")[0] in plan["shape"], group
            assert priced_as in fitted | {"torchrec default"}, (group, priced_as)
        if plan["estimator"] == "torchrec default":  # its rating: torchrec's slowest rank, compute + comms
            assert plan["rating_ms"] >= max(r["torchrec_estimate_ms"] for r in plan["ranks"]) * (1 - 1e-9)
    names = [p["plan"] for p in measured]
    for plan in measured:  # a placement measured again names the first plan that had it
        assert names.index(plan["same_as"]) <= names.index(plan["plan"])
    assert world["fastest"] == min(measured, key=lambda p: p["step_ms"]["median"])["plan"]
    # round by round: each plan's step minus embnb DP (calibrated)'s, its mean and 95% t-interval
    reference = next(p for p in measured if p["plan"] == "embnb DP (calibrated)")
    for plan in measured:
        rounds = plan["step_ms_rounds"]
        assert (
            len(rounds) == 2
            and plan["step_ms"]["low"] == min(rounds)
            and plan["step_ms"]["high"] == max(rounds)
        )
        if plan is reference:
            assert "minus_embnb DP (calibrated)" not in plan
            continue
        first, second = (a - b for a, b in zip(rounds, reference["step_ms_rounds"]))
        half = (
            12.7062 * abs(first - second) / 2
        )  # t(0.975, 1 df) x sd / sqrt(2); sd of two is |a - b| / sqrt 2
        got = plan["minus_embnb DP (calibrated)"]
        mean = (first + second) / 2
        assert got["mean"] == pytest.approx(mean) and got["repeats"] == 2
        assert (got["ci_low"], got["ci_high"]) == pytest.approx((mean - half, mean + half), rel=1e-4)
        assert got["excludes_zero"] == (mean - half > 0 or mean + half < 0)
        assert f"{plan['plan']:<30} minus embnb DP (calibrated), round by round" in out
    held = [r for p in measured for r in p["ranks"] if r["shards"]]
    trained = [r for row in payload["train"]["plans"] for r in row["measured_ranks"]]
    assert len(trained) == payload["train"]["ranks"]
    for rank in held + trained:
        # the planner's count of TBE groups (KernelCallPerfModel) is the TBEs the replay ran
        assert rank["kernel_calls"] == len(rank["tbe_groups"]) > 0
    for rank in held:
        assert sum(len(group["shards"]) for group in rank["tbe_groups"]) == rank["shards"]
    # the fit with the kernel-call term, and the same fit without it (the error before the term)
    assert payload["calibration_per_shard"]["kernel_call_ms"] == 0 <= calibration.kernel_call_ms
    for name, key in (
        ("torchrec_default", "torchrec_estimate_ms"),
        ("calibrated", "calibrated_estimate_ms"),
        ("calibrated_per_shard", "per_shard_estimate_ms"),
    ):
        errors = [abs(r[key] / r["lookup_ms"] - 1) for r in held]
        assert payload["heldout_errors"][name]["median"] == pytest.approx(statistics.median(errors))
        assert payload["heldout_errors"][name]["worst"] == pytest.approx(max(errors))
    assert "held out, calibrated" in out
    # a placement measured twice: its ranks paired by rank number, the gap between the two runs
    first = {p["plan"]: {r["rank"]: r for r in p["ranks"] if r["shards"]} for p in measured}
    gaps = [
        abs(r["lookup_ms"] - first[p["same_as"]][r["rank"]]["lookup_ms"])
        / first[p["same_as"]][r["rank"]]["lookup_ms"]
        for p in measured
        if p["same_as"] != p["plan"]
        for r in p["ranks"]
        if r["shards"] and r["rank"] in first[p["same_as"]]
    ]
    floor = payload["rank_repeat_gap"]
    assert (
        floor is None
        if not gaps
        else floor == {"median": pytest.approx(statistics.median(gaps)), "ranks": len(gaps)}
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train-seeds", "0", "1"], "--train-seeds and the --heldout seeds must differ"),
        (["--heldout", "0-8"], "--heldout takes SEED:WORLD_SIZE pairs of integers"),
        (["--train-world-sizes", "1"], "world sizes must all be >= 2, got [1"),
        (["--collective-world-size", "1"], "--collective-world-size must be >= 2, got 1"),
    ],
)
def test_bad_calibrate_arguments_are_named(tmp_path, capsys, args, message):
    code, _, err = run(capsys, *args, "--out", str(tmp_path))
    assert code == 2 and message in err
    assert not list(tmp_path.glob("*.json"))


def test_random_plans_on_a_cuda_topology_leave_out_the_host_level_types():
    """A CUDA topology also offers table_row_wise on one host: its shards must span the host's
    devices, which a random rank per shard would break, so the random plans never pick it (nor
    grid_shard), but keep every other type."""
    import numpy as np

    from embnb.bench.calibrate_training import random_plan
    from embnb.lab.planner.models import enumerate_options, make_model
    from embnb.planner.topology import make_topology

    model = make_model(8, seed=1, max_rows=5_000)
    enumerated = enumerate_options(model.tables, make_topology(4, "cuda"), 32, model.constraints, "embnb")
    offered = {o.sharding_type for o in enumerated.options}
    assert "table_row_wise" in offered
    rng = np.random.default_rng(0)
    picked = {o.sharding_type for _ in range(30) for o in random_plan(enumerated, 4, rng)}
    assert picked == offered - {"table_row_wise", "grid_shard"}


def test_random_plans_without_data_parallel_pick_every_other_type():
    """Every other training plan leaves data-parallel out (most ranks of the planners' plans hold
    none): such a plan has no data-parallel table, and draws every type the plans with it draw."""
    import numpy as np

    from embnb.bench.calibrate_training import random_plan
    from embnb.lab.planner.models import enumerate_options, make_model
    from embnb.planner.topology import make_topology

    model = make_model(8, seed=1, max_rows=5_000)
    enumerated = enumerate_options(model.tables, make_topology(4, "cpu"), 32, model.constraints, "embnb")
    rng = np.random.default_rng(0)
    with_dp = {o.sharding_type for _ in range(30) for o in random_plan(enumerated, 4, rng)}
    without = {
        o.sharding_type for _ in range(30) for o in random_plan(enumerated, 4, rng, data_parallel=False)
    }
    assert "data_parallel" in with_dp
    assert without == with_dp - {"data_parallel"}

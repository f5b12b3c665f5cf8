"""`python -m embnb.bench steptime` on tiny sizes: its JSON's derived figures
(critical path, correlations, estimates per rank) agree with its own per-rank
rows; its acceptance check (issue #70) recomputed from the raw times; plans
written as plain data come back with the same estimates, and a plans file is
measured without any planner. No speed is asserted."""

from __future__ import annotations

import json

import pytest
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner, to_sharding_plan

import embnb.bench.steptime as steptime_bench
from embnb.bench.plans import candidates_from_json, candidates_to_json
from embnb.lab.planner.candidates import (
    CALIBRATED,
    PLANNERS,
    POOR,
    CandidatePlan,
    candidate_plans,
    estimated_per_rank,
    one_kind_on,
    plan_shape,
)
from embnb.lab.planner.models import enumerate_options, make_model
from embnb.metrics import spearman
from embnb.planner.topology import make_topology
from embnb.scaling import NOT_COMPARED
from embnb.steptime import make_batch
from embnb.steptime.work import plan_shards
from tests.test_bench_acceptance import _recheck

TINY = ("--tables", "6", "--batch-size", "16", "--max-rows", "2000", "--warmup", "0")
# a comparison wherever the fitted fixed cost is below the measured time, over 256x the work (at 8x,
# noise under the full suite's load tilted the slope below zero): the comparison is tested, not the verdict
COMPARE = ("--max-fixed-share", "1", "--sweep-factors", "1", "256")


def run(capsys, *args: str) -> tuple[int, str, str]:
    from embnb.bench.__main__ import main

    try:
        code = main(["steptime", *args])
    except SystemExit as stop:  # argparse
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def test_steptime_bench_rows_agree_with_their_ranks(tmp_path, capsys):
    code, out, err = run(
        capsys, *TINY, *COMPARE, "--world-sizes", "2", "3", "--repeats", "2", "--out", str(tmp_path)
    )
    assert code == 0, out + err
    (path,) = tmp_path.glob("steptime-*.json")
    payload = json.loads(path.read_text())
    assert payload["threads"] == 1 and "computed, not measured" in payload["link_model"]
    assert payload["ids"] == "uniform" and payload["zipf_alpha"] is None
    assert payload["cpu_clock"] == "thread"  # on a CPU the "cpu" times are the rank thread's CPU time
    assert [w["world_size"] for w in payload["worlds"]] == [2, 3]
    for world in payload["worlds"]:
        assert world["batch_size"] == max(c["chosen_batch"] for c in world["acceptance"]) == 16
        plans = {p["plan"]: p for p in world["plans"]}
        # bytes read, against the batch: every id of every table's feature, its row's fp32 columns
        model = make_model(6, seed=0, max_rows=2000)
        batch = make_batch(model.tables, model.constraints, world["world_size"], 16, seed=0)
        everything = sum(
            4 * t.embedding_dim * int(batch.global_bags(f)[1].numel()) for f, t in enumerate(model.tables)
        )
        assert plans["all table-wise on 1 rank"]["ranks"][0]["bytes_read"] == everything
        assert list(plans)[: len(PLANNERS)] == list(PLANNERS)
        assert {"all table-wise on 1 rank", "all table-wise on 2 ranks", "all data-parallel"} <= set(plans)
        measured = [p for p in plans.values() if p["measured"]]
        assert len(measured) >= 5
        for plan in measured:
            ranks = plan["ranks"]
            assert len(ranks) == world["world_size"]
            walls = [r["compute"]["wall_s"] for r in ranks]
            assert plan["critical_path_s"] == max(walls) and plan["critical_rank"] == walls.index(max(walls))
            for r in ranks:
                low, high = r["compute"]["wall_s_range"]
                assert low <= r["compute"]["wall_s"] <= high
            # torchrec's rating is its slowest rank's estimated total
            assert plan["rating_s"] == pytest.approx(max(r["estimated_s"]["total"] for r in ranks))
            assert sum(r["sent_bytes"] for r in ranks) > 0 or plan["shape"].get("data_parallel")
            # each rank's TBEs with their shards: every shard of the plan on exactly one TBE
            assert sum(len(g["shards"]) for r in ranks for g in r["tbe_groups"]) == plan["shape"]["shards"]
        got = world["spearman_vs_rating"]["critical_path_s"]
        want = spearman([p["critical_path_s"] for p in measured], [p["rating_s"] for p in measured])
        assert got == pytest.approx(want, nan_ok=True)
    assert "Spearman" in out


def test_steptime_bench_replays_host_level_plans(tmp_path, capsys):
    """On 2 hosts of 2 a CUDA topology's plans hold table_row_wise (and may hold grid_shard): each is
    measured, and every all-to-all moves as many bytes in all as its ranks receive."""
    code, out, err = run(
        capsys,
        *(*TINY, *COMPARE, "--world-sizes", "4", "--devices-per-host", "2", "--compute-device", "cuda"),
        *("--repeats", "1", "--out", str(tmp_path)),
    )
    assert code == 0, out + err
    (path,) = tmp_path.glob("steptime-*.json")
    (world,) = json.loads(path.read_text())["worlds"]
    assert world["local_world_size"] == 2
    host_level = [p for p in world["plans"] if {"table_row_wise", "grid_shard"} & set(p.get("shape", {}))]
    assert host_level and all(p["measured"] for p in world["plans"] if p["plan"] in PLANNERS)
    for plan in host_level:
        names = [c["name"] for c in plan["ranks"][0]["collectives"]]
        assert "table_row_wise pooled reduce-scatter" in names or "grid_shard pooled reduce-scatter" in names
        for name in names:
            moved = [c for r in plan["ranks"] for c in r["collectives"] if c["name"] == name]
            if moved[0]["kind"] == "all_to_all_single":
                assert sum(c["sent"] for c in moved) == sum(c["received"] for c in moved), name


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tables", "0"], "--tables must be >= 1, got 0"),
        (["--world-sizes", "1"], "--world-sizes must all be >= 2, got [1]"),
        (["--max-rows", "10"], "--max-rows >= 1000"),
        (["--zipf-alpha", "0"], "--zipf-alpha must be > 0, got 0.0"),
        (["--plans", "nowhere.json"], "--plans nowhere.json: no such file"),
        (
            ["--world-sizes", "8", "12", "--devices-per-host", "8"],
            "--devices-per-host must be >= 1 and divide each larger world size [8, 12], got 8",
        ),
    ],
)
def test_bad_steptime_arguments_are_named(tmp_path, capsys, args, message):
    code, _, err = run(capsys, *args, "--out", str(tmp_path))
    assert code == 2 and message in err
    assert not list(tmp_path.glob("*.json"))


def test_the_acceptance_check_runs_each_plans_critical_rank_and_compares_only_where_it_passed(
    tmp_path, capsys
):
    """Whatever the verdict at the default 20%: each planner's plan's critical rank (torchrec's largest
    estimated total) swept at 16, 64 and 256 samples per rank on the bytes it reads, the fit and
    chosen batch recomputed from the raw times; the world compared at the largest chosen batch, or
    not compared at all."""
    code, out, err = run(capsys, *TINY, "--world-sizes", "2", "--repeats", "2", "--out", str(tmp_path))
    assert code == 0, out + err
    (path,) = tmp_path.glob("steptime-*.json")
    payload = json.loads(path.read_text())
    assert payload["sweep_factors"] == [1, 4, 16] and payload["max_fixed_share"] == 0.2
    assert payload["copy_bandwidth_bytes_per_s"] > 0
    (world,) = payload["worlds"]
    planned = [p for p in world["plans"] if not p["poor"] and "shape" in p]
    assert [c["plan"] for c in world["acceptance"]] == [p["plan"] for p in planned]
    for check, plan in zip(world["acceptance"], planned):
        _recheck(check, 0.2)
        assert check["unit"] == "bytes" and check["batches"] == [16, 64, 256]
        assert check["reference_rate"] == payload["copy_bandwidth_bytes_per_s"]
        estimate = plan["estimated_per_rank_ms"]
        assert check["critical_rank"] == estimate.index(max(estimate))
        assert check["work"][0] < check["work"][1] < check["work"][2]
    chosen = [c["chosen_batch"] for c in world["acceptance"]]
    if None in chosen:
        assert world["verdict"] == NOT_COMPARED and world["batch_size"] is None
        assert not any(p["measured"] for p in world["plans"]) and "told_apart" not in world
        assert f"W=  2 {NOT_COMPARED}" in out
    else:
        assert world["batch_size"] == max(chosen) and world["verdict"] == f"compared at batch {max(chosen)}"
        assert all(p["measured"] for p in planned)


def _tiny_world():
    model = make_model(6, seed=0, max_rows=2000)
    return model, make_topology(4, "cuda", local_world_size=2)


def test_plans_written_as_plain_data_come_back_with_the_same_estimates_and_shards():
    """candidates_to_json through JSON text, then candidates_from_json: every plan (the planners', the
    calibrated DP's, the poor ones) with the same rating, shape, estimates per rank and shards."""
    model, topology = _tiny_world()
    calibration = steptime_bench.Calibration.from_json(steptime_bench.load_gpu_refit().data["calibration"])
    planned = candidate_plans(model, topology, 16, timeout_s=10, calibration=calibration)
    assert CALIBRATED in planned and any(c.note == POOR for c in planned.values())
    loaded = candidates_from_json(json.loads(json.dumps(candidates_to_json(planned))), model)
    assert list(loaded) == list(planned)
    for name, plan in planned.items():
        back = loaded[name]
        assert (back.rating, back.note) == (plan.rating, plan.note)
        if plan.options is None:
            assert back.options is None
            continue
        assert plan_shape(back.options) == plan_shape(plan.options)
        assert estimated_per_rank(back.options, 4) == estimated_per_rank(plan.options, 4)
        shards = [plan_shards(to_sharding_plan(c.options, topology), model.tables, 4) for c in (plan, back)]
        assert shards[0] == shards[1]
    with pytest.raises(ValueError, match=r"shards tables \['table_5'\] the model does not have"):
        candidates_from_json(candidates_to_json(planned), make_model(5, seed=0, max_rows=2000))


def test_a_plans_file_is_measured_with_zipf_ids_and_no_planner(tmp_path, capsys, monkeypatch):
    """--plans: a file's plan (every table table-wise on rank 1, which no planner proposes here) measured
    as it is, with Zipf ids, while any planner run would raise."""
    model, topology = _tiny_world()
    enumerated = enumerate_options(model.tables, topology, 16, model.constraints, "embnb")
    options = one_kind_on(enumerated, "table_wise", [1])
    plans = {
        "embnb DP": CandidatePlan("embnb DP", options, 1.0),
        "Greedy": CandidatePlan("Greedy", options, 1.0),
    }
    world = {
        "world_size": 4,
        "compute_device": "cuda",
        "local_world_size": 2,
        "devices_per_host": 2,
        "hbm_cap_gb": None,
        "batch_size": 16,
        "plans": candidates_to_json(plans),
    }
    file = tmp_path / "plans.json"
    file.write_text(json.dumps({"model": {"tables": 6, "max_rows": 2000, "seed": 0}, "worlds": [world]}))

    def no_planner(*args, **kwargs):
        raise AssertionError("a planner ran")

    monkeypatch.setattr(EmbeddingShardingPlanner, "plan", no_planner)
    monkeypatch.setattr(steptime_bench, "candidate_plans", no_planner)
    sizes = ("--batch-size", "16", "--warmup", "0", "--repeats", "1", *COMPARE)
    zipf = ("--ids", "zipf", "--zipf-alpha", "1.1")
    code, out, err = run(capsys, "--plans", str(file), *sizes, *zipf, "--out", str(tmp_path))
    assert code == 0, out + err
    (path,) = tmp_path.glob("steptime_scale-*.json")
    payload = json.loads(path.read_text())
    assert payload["plans_file"] == "plans.json" and (payload["ids"], payload["zipf_alpha"]) == ("zipf", 1.1)
    (measured,) = payload["worlds"]
    assert measured["local_world_size"] == 2 and [p["plan"] for p in measured["plans"]] == list(plans)
    for plan in measured["plans"]:
        assert plan["measured"] and plan["shape"] == {"table_wise": 6, "shards": 6}
        assert [bool(r["tbe_groups"]) for r in plan["ranks"]] == [False, True, False, False]
        assert [c["critical_rank"] for c in measured["acceptance"]] == [1, 1]

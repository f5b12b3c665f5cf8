"""`python -m embnb.bench steptime` on tiny sizes: its JSON's derived figures
(critical path, correlations, estimates per rank) agree with its own per-rank
rows. No speed is asserted."""

from __future__ import annotations

import json

import pytest

from embnb.lab.planner.candidates import PLANNERS
from embnb.metrics import spearman


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
        capsys,
        *("--tables", "6", "--world-sizes", "2", "3", "--batch-size", "16", "--max-rows", "2000"),
        *("--warmup", "0", "--repeats", "2", "--out", str(tmp_path)),
    )
    assert code == 0, out + err
    (path,) = tmp_path.glob("steptime-*.json")
    payload = json.loads(path.read_text())
    assert payload["threads"] == 1 and "computed, not measured" in payload["link_model"]
    assert [w["world_size"] for w in payload["worlds"]] == [2, 3]
    for world in payload["worlds"]:
        plans = {p["plan"]: p for p in world["plans"]}
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
        *("--tables", "6", "--world-sizes", "4", "--devices-per-host", "2", "--compute-device", "cuda"),
        *(
            "--batch-size",
            "16",
            "--max-rows",
            "2000",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ),
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

"""`python -m embnb.bench balancer`'s rank-by-rank part on tiny sizes: the
fields notebook 04 records, derived numbers agreeing with the raw ones."""

import json

import pytest

from embnb.bench.__main__ import main


def test_balancer_bench_measures_rank_by_rank_with_the_notebooks_fields(tmp_path, capsys):
    code = main(
        [
            "balancer", "--samples", "64", "--parts", "4", "--budget", "0.02", "--no-train",
            "--exchange-world-size", "--measured-world-size", "2", "4", "--measured-batch-size", "4",
            "--measured-max-length", "32", "--measured-repeats", "1", "--cap-world-size", "4",
            "--out", str(tmp_path),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "rank by rank" in out
    (path,) = tmp_path.glob("balancer-*.json")
    payload = json.loads(path.read_text())
    assert payload["training"] == [] and payload["exchanges"] is None  # skipped as asked
    measured = payload["rank_by_rank"]
    assert {r["world_size"] for r in measured["measured_speedups"]} == {2, 4}
    runs = {(r["distribution"], r["world_size"], r["method"]): r for r in measured["measured_runs"]}
    for row in measured["measured_speedups"]:
        cut = runs[(row["distribution"], row["world_size"], "contiguous")]
        mine = runs[(row["distribution"], row["world_size"], row["method"])]
        assert row["measured"] == pytest.approx(max(cut["cpu_ms"]) / max(mine["cpu_ms"]))
    assert [c["world_size"] for c in measured["capped"]] == [4, 4]
    for c in measured["capped"]:
        for label, step in c["runs"].items():
            assert label == "uncapped" or max(step["tokens"]) <= c["cap"]
    assert sorted(measured["worker_shares"]) == ["lognormal", "zipf"]

"""`python -m embnb.bench balancer`'s rank-by-rank part on tiny sizes: the
fields notebook 04 records, derived numbers agreeing with the raw ones."""

import json

import pytest
import torch

from embnb.bench.__main__ import main
from embnb.timing import machine_name


def test_balancer_bench_measures_rank_by_rank_with_the_notebooks_fields(tmp_path, capsys):
    code = main(
        [
            "balancer",
            "--samples",
            "64",
            "--parts",
            "4",
            "--budget",
            "0.02",
            "--no-train",
            "--exchange-world-size",
            "--measured-world-size",
            "2",
            "4",
            "--measured-batch-size",
            "4",
            "--measured-max-length",
            "32",
            "--measured-repeats",
            "1",
            "--cap-world-size",
            "4",
            # up to 100% fixed passes the acceptance check: compared (tests/test_bench_acceptance.py: 10%);
            # 8x the work, so that noise on a busy machine cannot tilt the fitted slope below zero
            "--sweep-factors",
            "1",
            "8",
            "--max-fixed-share",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "rank by rank" in out
    (path,) = tmp_path.glob("balancer-*.json")
    payload = json.loads(path.read_text())
    assert payload["training"] == [] and payload["exchanges"] is None  # skipped as asked
    # the file says where the ranks ran: on a CPU, the CPU's name and its thread clock
    assert payload["device"] == "cpu" and payload["machine"] == payload["host"] == machine_name("cpu")
    assert path.name.endswith(
        "-" + "".join(c if c.isalnum() else "-" for c in machine_name().lower()) + ".json"
    )
    measured = payload["rank_by_rank"]
    assert {r["world_size"] for r in measured["measured_speedups"]} == {2, 4}
    assert measured["measured_config"]["device"] == "cpu" and measured["measured_config"]["clock"] == "thread"
    runs = {(r["distribution"], r["world_size"], r["method"]): r for r in measured["measured_runs"]}
    for r in runs.values():
        # thread CPU time at one thread; no enqueue time on a CPU (there it is the work itself)
        assert r["clock"] == "thread" and r["enqueue_ms"] is None
        assert len(r["ms"]) == r["world_size"] and not any(k.startswith(("cpu_", "wall_")) for k in r)
        for low, median, high in zip(r["low_ms"], r["ms"], r["high_ms"]):
            assert 0 < low <= median <= high
    for row in measured["measured_speedups"]:
        cut = runs[(row["distribution"], row["world_size"], "contiguous")]
        mine = runs[(row["distribution"], row["world_size"], row["method"])]
        assert row["measured"] == pytest.approx(max(cut["ms"]) / max(mine["ms"]))
    assert [c["world_size"] for c in measured["capped"]] == [4, 4]
    for c in measured["capped"]:
        for label, step in c["runs"].items():
            assert label == "uncapped" or max(step["tokens"]) <= c["cap"]
    assert sorted(measured["worker_shares"]) == ["lognormal", "zipf"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cap-world-size", "8"], "--cap-world-size must be one of --measured-world-size [2, 4]"),
        (["--measured-width", "30"], "--measured-width must be a multiple of 4, got 30"),
    ]
    + (
        []
        if torch.cuda.is_available()
        else [(["--device", "cuda"], "--device: device 'cuda' needs a GPU, but none is visible")]
    ),
)
def test_bad_rank_by_rank_arguments_are_named(tmp_path, capsys, args, message):
    base = ["balancer", "--no-train", "--exchange-world-size", "--measured-world-size", "2", "4"]
    base += ["--cap-world-size", "4"]  # valid unless `args` says otherwise (the last value counts)
    with pytest.raises(SystemExit) as stop:
        main([*base, *args, "--out", str(tmp_path)])
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))

"""`python -m embnb.bench NAME` on tiny sizes: each writes a JSON whose
derived figures (ratios, bandwidth, plan quality) agree with its raw
measurements. No speed is asserted: the machines are shared and noisy.
The benches run in process through the command line's own entry point (a
subprocess would only add torch's import); one test runs the module."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch


@pytest.fixture
def bench(capsys):
    """bench(*args, expect=0): `python -m embnb.bench *args` in this process;
    returns its (stdout, stderr) once its exit code is `expect`."""
    from embnb.bench.__main__ import main

    def run(*args: str, expect: int = 0) -> tuple[str, str]:
        try:  # argparse exits 2 on a bad argument; the benches return their code
            code = main(list(args))
        except SystemExit as stop:
            code = stop.code
        out, err = capsys.readouterr()
        assert code == expect, out + err
        return out, err

    return run


def results(tmp_path, name: str) -> dict:
    (path,) = tmp_path.glob(f"{name}-*.json")
    return json.loads(path.read_text())


def test_bucketize_bench_rows_agree_with_their_timings(tmp_path, bench):
    threads_before = torch.get_num_threads()
    bench(
        "bucketize",
        "--device",
        "cpu",  # the CPU rows: embnb's kernel against FBGEMM's CPU op
        "--sizes",
        "2e4,5e4",
        "--world-sizes",
        "2,8",
        "--repeats",
        "3",
        "--warmup",
        "1",
        "--reference-repeats",
        "1",
        "--threads",
        "1,0",
        "--out",
        str(tmp_path),
    )
    payload = results(tmp_path, "bucketize")
    assert payload["device"] == "cpu" and payload["input"]["indices_dtype"] == "int64"
    cores = os.cpu_count()
    # every case at one thread and at all cores, for every implementation alike
    assert [(r["world_size"], r["threads"]) for r in payload["rows"]] == [
        (w, t) for _ in range(2) for w in (2, 8) for t in (1, cores)
    ]
    assert torch.get_num_threads() == threads_before  # the bench puts the setting back
    for row in payload["rows"]:
        n, s, w = row["num_keys"], row["num_segments"], row["world_size"]
        assert row["identical"]
        # lengths read and written (int32), keys read, keys and permute written (int64)
        assert row["bytes_moved"] == 4 * s + 4 * w * s + 3 * 8 * n
        assert row["embnb_mkeys_s"] == pytest.approx(n / row["embnb_s"] / 1e6)
        assert row["embnb_gbps"] == pytest.approx(row["bytes_moved"] / row["embnb_s"] / 1e9)
        assert row["embnb_over_fbgemm"] == pytest.approx(row["fbgemm_s"] / row["embnb_s"])
        assert row["embnb_over_reference"] == pytest.approx(row["reference_s"] / row["embnb_s"])
        assert row["embnb_min_s"] <= row["embnb_s"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_the_module_runs_and_a_bucketize_bench_on_cuda_without_a_gpu_says_so(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "embnb.bench",
            "bucketize",
            "--device",
            "cuda",
            "--quick",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "device 'cuda' needs a GPU, but none is visible" in done.stderr


def test_planner_bench_ratios_and_quality(tmp_path, bench):
    stdout, _ = bench(
        "planner",
        "--tables",
        "6",
        "--world-sizes",
        "4",
        "--devices-per-host",
        "2",
        "--timeout-s",
        "60",
        "--quality-instances",
        "3",
        "--quality-tables",
        "3",
        "--repeats",
        "3",
        "--enumerate-repeats",
        "2",
        "--out",
        str(tmp_path),
    )
    payload = results(tmp_path, "planner")
    (row,) = payload["rows"]
    assert (row["num_tables"], row["world_size"], row["hosts"]) == (6, 4, 2)
    assert "hosts of 2" not in stdout and "(2 hosts)" in stdout
    assert row["enumerate_same_options"] is True
    for key in ("enumerate_s", "enumerate_embnb_s"):  # medians of the runs beside them
        runs = row[f"{key}_runs"]
        assert len(runs) == 2 and min(runs) > 0 and row[key] == pytest.approx(sum(runs) / 2)
    ours = row["proposers"]["embnb DP"]
    assert ours["perf_rating"] > 0 and not ours["timed_out"]
    # three runs, the same plan each time; the entry's times are the median run's
    assert len(ours["plan_s_runs"]) == 3 and ours["same_rating_every_run"] is True
    assert ours["plan_s"] == sorted(ours["plan_s_runs"])[1]
    for entry in row["proposers"].values():  # the breakdown: parts of the planning time
        assert 0 <= entry["proposer_s"] and 0 <= entry["partitioner_s"]
        assert entry["proposer_s"] + entry["partitioner_s"] <= entry["plan_s"]
        assert entry["proposals"] >= 1
    # end to end: create_planner(...).plan as a user calls it, three times, rated as the DP planned
    assert (
        len(ours["end_to_end_s_runs"]) == 3 and ours["end_to_end_s"] == sorted(ours["end_to_end_s_runs"])[1]
    )
    assert ours["end_to_end_rating"] == ours["perf_rating"] and ours["end_to_end_same_rating_every_run"]
    for name in ("torchrec DP", "torchrec default"):  # planned once, end to end after torchrec's enumeration
        peer = row["proposers"][name]
        assert peer["plan_s_runs"] == [peer["plan_s"]] and peer["same_rating_every_run"]
        assert peer["end_to_end_s"] == pytest.approx(row["enumerate_s"] + peer["plan_s"])
    quality = {q["proposer"]: q for q in payload["quality_vs_brute_force"]}
    assert set(quality) == {"embnb DP", "torchrec DP", "Greedy", "Uniform", "GridSearch"}
    for q in quality.values():
        assert q["instances"] + q["skipped"] == quality["embnb DP"]["instances"] >= 1
        # a plan can match brute force but never beat it
        assert q["worst_ratio"] is None or q["worst_ratio"] >= 1 - 1e-9
        assert 0 <= q["no_plan"] <= q["instances"]
    # quality 1.000 (docs/performance.md): equal to brute force up to float rounding
    assert quality["embnb DP"]["worst_ratio"] == pytest.approx(1.0, rel=1e-9)
    assert quality["embnb DP"]["no_plan"] == 0
    assert "embnb DP" in stdout and "brute force's best" in stdout and "end_to_end_s" in stdout


def test_balancer_bench_ratios_are_against_the_peer_and_the_unbalanced_run_in_the_same_run(tmp_path, bench):
    bench(
        "balancer",
        "--samples",
        "64",
        "--parts",
        "4",
        "--budget",
        "0.02",
        "--world-size",
        "2",
        "--steps",
        "3",
        "--max-length",
        "16",
        "--exchange-world-size",
        "2",
        "--bytes-world-size",
        "2",
        "8",
        "--batch-size",
        "8",
        "--repeats",
        "1",
        "--measured-world-size",  # none: the rank-by-rank part has its own test (tests/balancing)
        "--out",
        str(tmp_path),
    )
    payload = results(tmp_path, "balancer")
    assert payload["rank_by_rank"] is None
    rows = payload["partitioning"]
    (peer,) = [r for r in rows if r["method"] == "numberpartitioning_kk"]
    assert peer["speedup_vs_numberpartitioning_kk"] == pytest.approx(1.0)
    for r in rows:
        assert r["speedup_vs_numberpartitioning_kk"] == pytest.approx(peer["seconds"] / r["seconds"])
        assert r["gap_to_lower_bound"] >= -1e-12  # max(mean, largest item) bounds every partition
    (training,) = payload["training"]
    assert training["timed_steps"] == [1]  # 3 steps: not the first, not the last
    runs = {r["label"]: r for r in training["runs"]}
    assert list(runs) == ["no balancing", "sync", "overlap", "overlap, all-to-all", "overlap, caller thread"]
    for r in runs.values():
        ms = r["step_ms"]["repeats"]
        assert len(ms) == 1 and r["step_ms"]["median"] == ms[0]
        ratio = runs["no balancing"]["step_ms"]["median"] / ms[0]
        assert r["speedup_vs_no_balancing"]["median"] == pytest.approx(ratio)
    for key, (a, b) in {
        "overlap_minus_sync_ms": ("overlap", "sync"),
        "caller_minus_worker_ms": ("overlap, caller thread", "overlap"),
    }.items():  # one repeat: the difference of the two runs' single step times
        assert training[key]["mean"] == pytest.approx(
            runs[a]["step_ms"]["median"] - runs[b]["step_ms"]["median"]
        )
    exchanges = payload["exchanges"]
    assert exchanges["identical"] is True
    assert [(r["world_size"], r["exchange"]) for r in exchanges["measured"]] == [
        (2, "allgather"),
        (2, "alltoall"),
    ]
    # every rank receives the whole global batch in the all-gather, its part in the all-to-all
    assert exchanges["bytes_per_rank"]["8"]["alltoall"] < exchanges["bytes_per_rank"]["8"]["allgather"] / 2


def test_enumerators_bench_covers_every_case_with_the_same_options(tmp_path, bench):
    from embnb.bench.enumerators import CASES

    stdout, _ = bench("enumerators", "--tables", "6", "--repeats", "2", "--out", str(tmp_path))
    payload = results(tmp_path, "enumerators")
    rows = payload["rows"]
    assert [(r["model"], r["device"], r["world_size"]) for r in rows] == [
        (c.model, c.device, c.world_size) for c in CASES
    ]
    for row in rows:
        assert row["same_options"] is True
        assert row["world_size"] % row["local_world_size"] == 0
        assert 0 < row["num_options"] <= row["distinct_shards"] <= row["num_shards"]
        for key in ("torchrec_s", "embnb_s", "embnb_estimators_s"):  # medians of the runs beside them
            runs = row[f"{key}_runs"]
            assert len(runs) == 2 and min(runs) > 0 and row[key] == pytest.approx(sum(runs) / 2)
        # torchrec's estimators run inside embnb's enumeration: a part of each run
        assert all(e < t for e, t in zip(row["embnb_estimators_s_runs"], row["embnb_s_runs"]))
        mixed = row["model"] == "mixed"
        assert (row["multi_feature_options"] > 0) == mixed  # make_model's tables have one feature
        assert (row["uvm_caching_options"] > 0) == (row["device"] == "cuda")  # CPUs have no UVM
        assert (row["cache_statistics_options"] > 0) == (mixed and row["device"] == "cuda")
    # 6 pooled tables and one sequence table in the mixed model
    assert {r["num_tables"] for r in rows} == {6, 7}
    assert stdout.count("same_options") == len(CASES)  # one table per case


def test_the_enumerators_bench_clock_leaves_the_estimators_as_they_run():
    """The clock times embnb's estimate step without touching torchrec's estimators: an
    `estimate` wrapped on an estimator instance rode into embnb's copy of the perf estimator and
    made the clocked enumeration run torchrec's slow path (3x the time, committed 2026-11-29)."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from embnb import planner
    from embnb._torchrec_private import estimators_of
    from embnb.lab.planner.models import make_model
    from embnb.lab.planner.planning import clocked
    from embnb.planner.enumerator import DistinctShardEnumerator
    from embnb.timing import Stopwatch

    model = make_model(4, seed=0)
    module = EmbeddingBagCollection(tables=model.tables, device=torch.device("meta"))
    enumerator = DistinctShardEnumerator(planner.make_topology(2, "cpu"), 512, model.constraints)
    with clocked(enumerator, "_estimate") as clock, Stopwatch() as watch:
        enumerator.enumerate(module, [EmbeddingBagCollectionSharder()])
        assert all("estimate" not in vars(estimator) for estimator in estimators_of(enumerator))
    assert 0 < clock.total_s < watch.wall_s
    assert "_estimate" not in vars(enumerator)  # the class's method again after the block


def test_end_to_end_bench_plans_in_fresh_processes_as_in_this_one(tmp_path, bench):
    stdout, _ = bench(
        "end_to_end",
        *(
            "--cases",
            "8x8/4",
            "--processes",
            "2",
            "--torchrec-dp-timeout-s",
            "60",
            "--out",
            str(tmp_path),
        ),
    )
    payload = results(tmp_path, "end_to_end")
    assert [(r["num_tables"], r["world_size"], r["hosts"]) for r in payload["rows"]] == [
        (8, 8, "2 hosts of 4")
    ]
    assert "HeuristicalStorageReservation(0.15)" in payload["storage_reservation"]
    for row in payload["rows"]:
        for key in ("fresh_process_s", "in_process_s"):  # medians of the runs beside them
            runs = row[f"{key}_runs"]
            assert len(runs) == 2 and min(runs) > 0 and row[key] == pytest.approx(sum(runs) / 2)
        assert len(row["import_s_runs"]) == 2 and min(row["import_s_runs"]) > 0
        # each process planned the same model: the DP's rating, as in this process
        assert row["fresh_ratings"] == [row["in_process_rating"]] * 2 and row["same_rating_everywhere"]
        assert 0 < row["in_process_rating"] < float("inf")
        assert len(row["fresh_peak_rss_gib_runs"]) == 2 and min(row["fresh_peak_rss_gib_runs"]) > 0.1
        # the planner partitioned one proposal (the replica's best: create_planner hands the reserved
        # memory over, the first plan needs no partition)
        assert row["fresh_proposals"] == [1, 1]
        # torchrec's DP under the same reservation, in its own process: never rated better than embnb's
        peer = row["torchrec_dp"]
        assert peer["proposals"] > 2 and not peer["timed_out"] and peer["peak_rss_gib"] > 0.1
        assert peer["rating"] >= row["in_process_rating"]
    assert stdout.count("fresh_process_s") == 1 and stdout.count("torchrec_dp.rating") == 1


def test_end_to_end_bench_plans_under_the_reservation_asked_for(tmp_path, bench):
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from embnb import planner
    from embnb._torchrec_private import planner_proposers
    from embnb.lab.planner.models import fused_table_gb, make_model

    # the flag for cases that name none, and a case that names its own
    bench(
        "end_to_end",
        *("--cases", "6x2", "9x8/4:heuristical@1", "--processes", "1", "--torchrec-dp-timeout-s", "0"),
        *("--storage-reservation", "fixed", "--out", str(tmp_path)),
    )
    payload = results(tmp_path, "end_to_end")
    assert payload["storage_reservation"].startswith("FixedPercentageStorageReservation(0.15)")
    for row, (tables, world_size, per_host, reservation, hbm, torchrec_name) in zip(
        payload["rows"],
        [
            (6, 2, None, "fixed", 0.5, "FixedPercentageStorageReservation"),
            (9, 8, 4, "heuristical", 1.0, "HeuristicalStorageReservation"),  # HBM for all the rows
        ],
        strict=True,
    ):
        assert row["torchrec_dp"] is None and f"{torchrec_name}(0.15)" in row["storage_reservation"]
        assert row["hbm_fraction"] == hbm
        # the oracle: create_planner asked for that reservation here, on the bench's model and topology
        model = make_model(tables, seed=0)
        topology = planner.make_topology(
            world_size,
            "cuda",
            hbm_cap_gb=fused_table_gb(model.tables) / world_size * hbm,
            local_world_size=per_host,
        )
        chosen = planner.create_planner(
            topology, 512, constraints=model.constraints, storage_reservation=reservation
        )
        module = EmbeddingBagCollection(tables=list(model.tables), device=torch.device("meta"))
        chosen.plan(module, [EmbeddingBagCollectionSharder()])
        assert (
            row["fresh_ratings"] == [row["in_process_rating"]] == [planner_proposers(chosen)[0].best_rating]
        )


def test_end_to_end_bench_stops_torchrec_still_running_past_its_grace(tmp_path, bench, monkeypatch):
    """torchrec's planner is stopped once it runs ENUMERATION_GRACE_S past its
    limit (here 0 s past 1 s: still importing) and the row says so; the bench
    goes on to its results."""
    from embnb.bench import end_to_end

    monkeypatch.setattr(end_to_end, "ENUMERATION_GRACE_S", 0)
    stdout, _ = bench(
        "end_to_end",
        *("--cases", "6x2", "--processes", "1", "--torchrec-dp-timeout-s", "1", "--out", str(tmp_path)),
    )
    (row,) = results(tmp_path, "end_to_end")["rows"]
    peer = row["torchrec_dp"]
    assert peer["stopped_after_s"] == 1 and peer["timed_out"] and peer["rating"] == math.inf
    assert "torchrec_dp.stopped_after_s" in stdout


def test_end_to_end_bench_stops_torchrec_past_its_memory_limit(tmp_path, bench):
    """torchrec's planner is stopped once its resident memory passes the limit (here 0.05 GiB: an
    interpreter importing torch passes it at once); its row says not run: memory."""
    stdout, _ = bench(
        "end_to_end",
        *("--cases", "6x2", "--processes", "1", "--torchrec-dp-timeout-s", "60"),
        *("--torchrec-dp-memory-gib", "0.05", "--out", str(tmp_path)),
    )
    payload = results(tmp_path, "end_to_end")
    (row,) = payload["rows"]
    peer = row["torchrec_dp"]
    assert peer["stopped_for_memory_gib"] == 0.05 == payload["torchrec_dp_memory_gib"]
    assert peer["stopped_after_s"] < 60 and not peer["timed_out"] and peer["rating"] == math.inf
    assert math.isfinite(row["in_process_rating"])  # embnb's own plan is not limited
    assert "torchrec_dp.stopped_for_memory_gib" in stdout


def test_ablation_bench_reports_every_rung_with_its_spread(tmp_path, bench):
    from embnb.lab.planner.comparison import LADDER

    stdout, _ = bench(
        "ablation", "--tables", "8", "--world-sizes", "2", "--repeats", "2", "--out", str(tmp_path)
    )
    payload = results(tmp_path, "ablation")
    (row,) = payload["rows"]
    assert (row["num_tables"], row["world_size"]) == (8, 2) and row["enumerate_s"] > 0
    assert list(row["rungs"]) == list(LADDER) and payload["ladder"] == {k: dict(v) for k, v in LADDER.items()}
    for rung, r in row["rungs"].items():
        assert r["plan_s_min"] <= r["plan_s"] <= r["plan_s_max"], rung
        assert rung in stdout
    # the replica places what torchrec's partitioner would: same rating, two proposals
    pruned, replayed = row["rungs"]["+ lower-bound pruning"], row["rungs"]["+ the replica"]
    assert replayed["perf_rating"] == pruned["perf_rating"] and replayed["proposals"] <= 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["planner", "--tables", "0"], "argument --tables: must be >= 1, got 0"),
        (["planner", "--quality-instances", "-1"], "argument --quality-instances: must be >= 0, got -1"),
        (["balancer", "--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["planner", "--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        (["planner", "--enumerate-repeats", "0"], "argument --enumerate-repeats: must be >= 1, got 0"),
        (["ablation", "--world-sizes", "0"], "argument --world-sizes: must be >= 1, got 0"),
        (["enumerators", "--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        (["end_to_end", "--processes", "0"], "argument --processes: must be >= 1, got 0"),
        (
            ["end_to_end", "--cases", "800by64"],
            "a case is TABLESxDEVICES[/PER_HOST][:heuristical|:fixed][@HBM] with each count >= 1 and "
            "HBM > 0, e.g. 800x64 or 800x64/8:fixed@1; got '800by64'",
        ),
        (["end_to_end", "--cases", "800x64/3"], "PER_HOST must divide the devices, got '800x64/3'"),
        (["end_to_end", "--cases", "800x64/8:half"], "[:heuristical|:fixed][@HBM] with each count"),
        (["end_to_end", "--cases", "8x8@0"], "and HBM > 0, e.g. 800x64 or 800x64/8:fixed@1; got '8x8@0'"),
        (["end_to_end", "--cases", "0x8"], "with each count >= 1 and HBM > 0"),
        (
            ["end_to_end", "--torchrec-dp-timeout-s", "-1"],
            "argument --torchrec-dp-timeout-s: must be >= 0, got -1.0",
        ),
        (
            ["end_to_end", "--torchrec-dp-memory-gib", "0"],
            "argument --torchrec-dp-memory-gib: must be > 0, got 0.0",
        ),
        (["end_to_end", "--storage-reservation", "half"], "invalid choice: 'half'"),
        (["ablation", "--timeout-s", "0"], "argument --timeout-s: must be > 0, got 0.0"),
        (["planner", "--hbm-fraction", "nan"], "argument --hbm-fraction: must be > 0, got nan"),
        (
            ["planner", "--devices-per-host", "3"],
            "--devices-per-host must divide the larger world sizes, got 3",
        ),
        (["nosuch"], "got 'nosuch'"),
    ],
)
def test_bad_bench_arguments_are_named(tmp_path, bench, args, message):
    _, stderr = bench(*args, "--out", str(tmp_path), expect=2)
    assert message in stderr
    assert not list(tmp_path.glob("*.json"))


def test_results_go_under_the_current_directory_by_default(tmp_path, monkeypatch):
    """An installed wheel has no source tree: the default folder is ./benchmarks/results."""
    from embnb.bench.results import write_results

    monkeypatch.chdir(tmp_path)
    written = write_results("probe", {"machine": "m"})
    assert written.resolve().parent == tmp_path / "benchmarks" / "results"


def test_results_record_the_stack_and_the_commit(tmp_path):
    import json
    import platform
    import subprocess
    from importlib.metadata import version

    from embnb.bench.results import write_results

    payload = json.loads(write_results("probe", {"machine": "m"}, tmp_path).read_text())
    fbgemm = "fbgemm-gpu-cpu" if _installed("fbgemm-gpu-cpu") else "fbgemm-gpu"
    assert payload["stack"] == {
        "python": platform.python_version(),
        "torch": version("torch"),
        "fbgemm_gpu": version(fbgemm),
        "torchrec": version("torchrec"),
    }
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert payload["commit"] in (head, head + "-dirty")


def _installed(name):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return bool(version(name))
    except PackageNotFoundError:
        return False

"""Notebook 04a (the balancer, measured at length), executed once with small parameters.

Expectations come from counting (collectives per key, bytes, the equal-count bound, the model's
FLOPs written out), from the committed GPU results files read here on their own, and from
recomputing the notebook's derived numbers from the raw per-rank ones it records.
"""

import json
import pathlib
import statistics

import numpy as np
import pytest

NUM_KJTS, KEYS_PER_KJT = 3, 4  # the notebook's gather comparison
PARAMETERS = {
    "world_size": 2,
    "batch_size": 8,
    "max_length": 64,
    "steps": 4,
    "repeats": 2,
    "embedding_dim": 16,
    "ffn_dim": 32,
    "example_samples": 256,
    "bytes_world_sizes": [2, 8, 64],
    "measured_world_sizes": [2, 4],
    "measured_batch_size": 4,
    "measured_max_length": 96,
    "measured_width": 16,
    "measured_repeats": 1,
    "cap_world_size": 2,
    "cap_over_mean": 1.02,
}
MEASURED_HIDDEN = (64,)  # measure_balanced_steps' default MLP
SHUFFLE_PHASES = {"gather_workloads", "kk", "exchange"}
RESULTS_DIR = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@pytest.fixture(scope="module")
def run(execute):
    return execute("04a_balancer_measured", PARAMETERS)


def test_lengths_and_kk_cost(run):
    results = run.results
    lengths = {r["distribution"]: r for r in results["lengths"]}
    assert lengths["zipf"]["median"] < lengths["lognormal"]["median"]
    assert lengths["zipf"]["longest 1% hold"] > lengths["lognormal"]["longest 1% hold"]
    assert results["kk_timing"]["same_partition"] is True and results["kk_timing"]["python_s"] > 0


def test_fused_gather_two_collectives_and_both_exchanges(run):
    results = run.results
    assert results["gather_check"]["identical"] is True
    # per key: lengths and values; the last KJT is weighted: + weights
    calls = {"fused": 2, "per_key": NUM_KJTS * KEYS_PER_KJT * 2 + KEYS_PER_KJT}
    assert results["gather_check"]["calls"] == calls
    assert [(r["exchange"], r["identical"]) for r in results["exchanges"]] == [
        ("allgather", True),
        ("alltoall", True),
    ]
    counted = results["exchange_bytes"]
    assert sorted(counted, key=int) == ["2", "8", "64"]
    # all-gather grows with W (every rank gets the whole batch), all-to-all does not
    assert counted["64"]["allgather"] >= 8 * counted["8"]["allgather"] * 0.99
    assert counted["64"]["alltoall"] < counted["64"]["allgather"] / 16


def test_the_workers_variants_their_phases_and_paired_differences(run):
    results = run.results
    assert results["same_weights"] is True
    phases = {}
    for row in results["phase_ms"]:
        phases.setdefault(row["run"], {})[(row["thread"], row["phase"])] = row["ms"]
    assert {p for t, p in phases["sync"] if t == "main"} >= SHUFFLE_PHASES
    for label in ("overlap", "overlap, all-to-all", "overlap, own group"):
        assert {p for t, p in phases[label] if t == "worker"} == SHUFFLE_PHASES
        assert not {p for t, p in phases[label] if t == "main"} & SHUFFLE_PHASES
    step_ms = results["step_ms"]
    for name, d in results["differences_vs_sync_ms"].items():
        diffs = [a - b for a, b in zip(step_ms[name.removesuffix(" - sync")], step_ms["sync"])]
        assert d["mean"] == pytest.approx(statistics.fmean(diffs))
        assert d["ci_low"] <= d["mean"] <= d["ci_high"]
        assert d["excludes_zero"] == (d["ci_low"] > 0 or d["ci_high"] < 0)
    for row in results["runs"]:  # the shuffle's total is its three phases, either thread
        shuffle = sum(ms for (_, p), ms in phases[row["label"]].items() if p in SHUFFLE_PHASES)
        assert 1e3 * row["shuffle_seconds"] == pytest.approx(shuffle)


def _model_flops(length, width=PARAMETERS["measured_width"], hidden=MEASURED_HIDDEN):
    # the measured model's forward FLOPs, written out: QKV, attention (full), MLP
    widths = [width, *hidden, 1]
    return (
        6 * length * width**2
        + 4 * length**2 * width
        + 2 * length * sum(a * b for a, b in zip(widths, widths[1:]))
    )


def _runs(results):
    return {(r["distribution"], r["world_size"], r["method"]): r for r in results["measured_runs"]}


def test_measured_speedups_follow_from_the_per_rank_numbers(run):
    results = run.results
    runs = _runs(results)
    batches = {(b["distribution"], b["world_size"]): b["lengths"] for b in results["measured_batches"]}
    assert sorted(batches) == sorted(
        (d, w) for d in ("zipf", "lognormal") for w in PARAMETERS["measured_world_sizes"]
    )
    for (name, w), lengths in batches.items():
        assert len(lengths) == w * PARAMETERS["measured_batch_size"]
        flops = sorted(_model_flops(n) for n in lengths)
        bound = max(sum(flops) / w, flops[-1] + sum(flops[: len(lengths) // w - 1]))
        for method in ("contiguous", "greedy_lpt", "karmarkar_karp", "kk_swap"):
            r = runs[(name, w, method)]
            assert sum(r["tokens"]) == sum(lengths)  # every sample on exactly one rank
            assert sum(r["flops"]) == pytest.approx(sum(flops))
            assert max(r["flops"]) >= bound * (1 - 1e-9)  # no partition beats the bound
            assert r["lower_bound"] == pytest.approx(bound)
    for row in results["measured_speedups"]:
        cut = runs[(row["distribution"], row["world_size"], "contiguous")]
        mine = runs[(row["distribution"], row["world_size"], row["method"])]
        assert row["measured"] == pytest.approx(max(cut["ms"]) / max(mine["ms"]))
        assert row["flop_model"] == pytest.approx(max(cut["flops"]) / max(mine["flops"]))
        assert row["bound"] == pytest.approx(max(cut["flops"]) / mine["lower_bound"])
        assert row["flop_model"] <= row["bound"] * (1 + 1e-9)


def test_both_rank_time_fits_are_least_squares_with_their_residuals(run):
    results = run.results
    rows = [
        {"ms": ms, "gflops": f / 1e9, "distinct_lengths": n, "tokens": t, "per_rank": 1.0}
        for r in results["measured_runs"]
        for ms, f, n, t in zip(r["ms"], r["flops"], r["distinct_lengths"], r["tokens"])
    ]
    y = np.array([r["ms"] for r in rows])
    for fit in results["rank_time_fits"].values():
        x = np.array([[r[f] for f in fit["features"]] for r in rows])
        beta = np.array([fit["coefficients"][f] for f in fit["features"]])
        residual = y - x @ beta
        # least squares: the residual is orthogonal to every feature (the normal equations)
        assert np.abs(x.T @ residual).max() <= 1e-6 * (np.abs(x).T @ np.abs(y)).max() + 1e-9
        assert fit["max_relative_residual"] == pytest.approx(np.max(np.abs(residual) / y))
        assert fit["fixed_share"] == pytest.approx(fit["coefficients"]["per_rank"] / y.mean())
        assert fit["ranks"] == len(rows)
    here, work = results["time_vs_work"][0], results["rank_time_fits"]["work"]
    assert here["source"].startswith("this run") and here["ranks"] == work["ranks"]
    assert (here["fixed_share"], here["r"]) == pytest.approx((work["fixed_share"], work["r"]))
    assert here["r"] == pytest.approx(np.corrcoef([r["gflops"] for r in rows], y)[0, 1])


def test_the_memory_caps_hold_and_only_a_binding_cap_is_credited_with_a_lower_peak(run):
    results = run.results
    sizes_capped = [(c["size"], c["distribution"]) for c in results["capped"]]
    assert sizes_capped == [(s, d) for s in ("tokens", "modelled bytes") for d in ("zipf", "lognormal")]
    model = results["activation_model"]
    batches = {(b["distribution"], b["world_size"]): b["lengths"] for b in results["measured_batches"]}
    for c in results["capped"]:
        lengths = batches[(c["distribution"], c["world_size"])]
        modelled = [model["per_token"] * n + model["per_token_squared"] * n * n for n in lengths]
        sizes = lengths if c["size"] == "tokens" else modelled
        assert c["mean"] == pytest.approx(sum(sizes) / c["world_size"])
        assert c["cap"] >= PARAMETERS["cap_over_mean"] * c["mean"] * (1 - 1e-12)
        uncapped = c["runs"]["uncapped"]
        assert c["binds"] == (max(c["held"]["uncapped"]) > c["cap"])
        for label, step in c["runs"].items():
            assert sum(c["held"][label]) == pytest.approx(sum(sizes))  # every sample on one rank
            if label != "uncapped":
                assert max(c["held"][label]) <= c["cap"] * (1 + 1e-12)  # the cap holds
            assert c["cost"][label] == pytest.approx(max(step["ms"]) / max(uncapped["ms"]))
            assert c["lowers_peak"][label] == (max(c["peak_bytes"][label]) < max(c["peak_bytes"]["uncapped"]))
        if c["size"] == "tokens":
            assert [max(s["tokens"]) for s in c["runs"].values()] == [max(h) for h in c["held"].values()]
        if not c["binds"]:  # a cap that does not bind leaves KK + swaps' partition as it was
            assert c["runs"]["kk_swap"] == uncapped
    for row in results["cap_rows"]:
        assert not row["lowers_peak"] or row["binds"]
        assert row["cost_low"] <= row["cost"] <= row["cost_high"]


def test_worker_shares_are_computed_from_the_counted_phases(run):
    results = run.results
    runs = _runs(results)
    for name, rows in results["worker_shares"].items():
        assert [r["world_size"] for r in rows] == PARAMETERS["measured_world_sizes"]
        for r in rows:
            w = r["world_size"]
            assert r["gather_bytes"] == w * PARAMETERS["measured_batch_size"] * 8
            shuffle = r["gather_ms_computed"] + r["kk_ms_measured"] + r["exchange_ms_computed"]
            assert r["shuffle_ms"] == pytest.approx(shuffle)
            assert r["latency_share"] == pytest.approx(2 * (w - 1) * r["latency_ms"] / shuffle)
            assert r["compute_ms_measured"] == max(runs[(name, w, "kk_swap")]["ms"])
            assert r["hidden_share_computed"] == pytest.approx(min(1.0, r["compute_ms_measured"] / shuffle))


def _committed_gpu_ranks():
    """file -> [(ms, GFLOPs)] for every rank the committed GPU runs measured, read here."""
    ranks = {}
    for path in sorted(RESULTS_DIR.glob("*.json")):
        payload = json.loads(path.read_text())
        if payload.get("device") != "cuda":
            continue
        if path.name.startswith("balancer-"):
            for r in payload["rank_by_rank"]["measured_runs"]:
                ms = r["ms"] if "ms" in r else r["wall_ms"]  # files before the interleaved rounds: wall_ms
                ranks.setdefault(path.name, []).extend(zip(ms, [f / 1e9 for f in r["flops"]]))
        elif path.name.startswith("hstu-"):
            for world in payload["worlds"]:
                for r in world["runs"]:
                    pairs = zip(r["rank_ms_median"], [f / 1e9 for f in r["rank_flops"]])
                    ranks.setdefault(path.name, []).extend(pairs)
    return ranks


def test_no_committed_gpu_run_passes_the_time_follows_work_check(run):
    """The appendix's opening claim: in every committed GPU run the fixed part is most of a rank's
    time and the achieved rate a small fraction of the GPU's peak (about 990 dense bf16 TFLOPS)."""
    expected = _committed_gpu_ranks()
    gpu = run.results["time_vs_work"][1:]
    assert len(gpu) == len(expected) >= 3
    for row, pairs in zip(gpu, [expected[name] for name in sorted(expected)]):
        ms, gflops = np.array(pairs).T
        slope, fixed = np.polyfit(gflops, ms, 1)
        assert row["fixed_ms"] == pytest.approx(fixed, rel=1e-6)
        assert row["ms_per_gflop"] == pytest.approx(slope, rel=1e-6)
        assert row["fixed_share"] == pytest.approx(fixed / ms.mean(), rel=1e-6)
        assert row["tflops"] == pytest.approx(gflops.sum() / ms.sum())
        assert row["fixed_share"] > 0.5 and row["time_follows_work"] is False and row["tflops"] < 50
        assert row["ranks"] == len(pairs)
    summary = run.results["summary"]  # the headline as data: the values the tables show
    assert summary["measured on"].endswith(f", {PARAMETERS['world_size']} gloo ranks")
    assert summary["overlap - sync, ms per step"] == run.results["differences_vs_sync_ms"]["overlap - sync"]
    shares = {r["source"]: r["fixed_share"] for r in run.results["time_vs_work"]}
    assert summary["fixed share of a rank's time"] == shares


def test_figures(run):
    figures = run.figures()
    assert len(figures) == 1  # time against work
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)

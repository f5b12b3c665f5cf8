"""Notebook 04 (balancer overlap), executed for real with small parameters.

Expectations come from the issue's targets and from counting (collectives
per key, equal-count bounds), not from re-running the notebook's cells.
"""

import pytest

from embnb import harness

NOTEBOOK = harness.NOTEBOOKS_DIR / "04_balancer_overlap.ipynb"
WORLD_SIZE = 2
NUM_KJTS, KEYS_PER_KJT = 3, 4  # the notebook's gather comparison
PARAMETERS = {
    "world_size": WORLD_SIZE,
    "batch_size": 8,
    "max_length": 64,
    "steps": 3,
    "repeats": 2,
    "embedding_dim": 16,
    "ffn_dim": 32,
    "sample_counts": [1024],
    "part_counts": [8],
    "seeds": [0],
    "device": "cpu",
}
METHODS = ["contiguous", "greedy_lpt", "karmarkar_karp", "kk_swap"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("nb04")
    return {"results": harness.run_notebook(NOTEBOOK, out, PARAMETERS), "out": out}


def test_every_method_reported_and_the_default_within_1_percent(run):
    imbalance = run["results"]["imbalance"]
    assert sorted(imbalance) == sorted(METHODS)
    assert imbalance["kk_swap"]["max_gap_to_lower_bound"] <= 0.01
    assert (
        imbalance["kk_swap"]["max_gap_to_lower_bound"]
        <= imbalance["karmarkar_karp"]["max_gap_to_lower_bound"]
    )
    # the loader's cut of a heavy-tailed batch is far from balanced
    assert imbalance["contiguous"]["max_gap_to_lower_bound"] > 0.1
    assert len(run["results"]["imbalance_rows"]) == len(METHODS)  # 1 size x 1 parts x 1 seed


def test_fused_gather_uses_two_collectives(run):
    results = run["results"]
    assert results["gathers_identical"] is True
    # per key: lengths and values; the last KJT is weighted: + weights
    assert results["collective_calls"] == {"fused": 2, "per_key": NUM_KJTS * KEYS_PER_KJT * 2 + KEYS_PER_KJT}


def test_real_run_modes_train_the_same_weights_and_report_hidden_time(run):
    results = run["results"]
    assert results["flop_model_matches_counter"] is True
    assert results["same_weights"] is True
    runs = {r["label"]: r for r in results["runs"]}
    assert runs["no balancing"]["hidden_fraction"] is None
    assert runs["KK, no overlap"]["hidden_fraction"] == 0.0
    for label in ("KK overlapped (native)", "KK overlapped (Python)"):
        assert 0.0 <= runs[label]["hidden_fraction"] <= 1.0
    assert 0.0 <= results["hidden_fraction"] <= 1.0
    assert results["native_kk"] is True
    assert all(r["step_seconds"] > 0 for r in results["runs"])


def test_step_speedups_are_measured_per_repeat_against_no_balancing(run):
    results = run["results"]
    speedups = results["step_speedups"]
    assert results["step_speedup_vs"] == "no balancing" and results["repeats"] == 2
    assert sorted(speedups) == sorted(r["label"] for r in results["runs"])
    assert speedups["no balancing"] == {"median": 1.0, "low": 1.0, "high": 1.0, "repeats": 2}
    for ratio in speedups.values():
        assert 0 < ratio["low"] <= ratio["median"] <= ratio["high"] and ratio["repeats"] == 2
    assert "step speed-up" in results["summary"]


def test_summary_figures_and_committed_notebook(run):
    summary = run["results"]["summary"]
    assert isinstance(summary, str) and "\n" not in summary and "hidden" in summary
    figures = sorted(run["out"].glob("04_balancer_overlap_fig*.png"))
    # lengths, part loads, gap by method, FLOPs, collectives, step times, Gantt
    assert len(figures) == 7
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert harness.notebook_problems(NOTEBOOK) == []

"""Notebook 04 (balancer overlap), executed for real with small parameters.

Expectations come from the issue's targets, from counting (collectives per
key, equal-count bounds, a KK example worked by hand) and from recomputing
the notebook's derived numbers from the raw ones it records, not from
re-running its cells.
"""

import statistics

import pytest

WORLD_SIZE = 2
NUM_KJTS, KEYS_PER_KJT = 3, 4  # the notebook's gather comparison
EMBEDDING_DIM, FFN_DIM = 16, 32
PARAMETERS = {
    "world_size": WORLD_SIZE,
    "batch_size": 8,
    "max_length": 64,
    "steps": 4,
    "repeats": 3,
    "embedding_dim": EMBEDDING_DIM,
    "ffn_dim": FFN_DIM,
    "sample_counts": [1024],
    "part_counts": [8, 64],
    "seeds": [0],
    "exchange_world_sizes": [2],
    "bytes_world_sizes": [2, 8, 64],
}
METHODS = ["contiguous", "greedy_lpt", "karmarkar_karp", "kk_swap"]
SHUFFLE_PHASES = {"gather_workloads", "kk", "exchange"}


@pytest.fixture(scope="module")
def run(execute):
    return execute("04_balancer_overlap", PARAMETERS)


def test_kk_worked_example_lands_where_the_hand_computation_does(run):
    results = run.results
    # [13, 1, 100, 5, 40, 2, 8, 3] into 2: KK merges (40,100)+(8,13), +(3,5), +(1,2)
    assert results["kk_example_sums"] == {"KK": [112, 60], "KK + swaps": [106, 66]}
    # mean 86 < largest 100; equal counts: 100 + 1 + 2 + 3
    assert results["kk_example_bounds"] == {"max(mean, largest)": 100, "equal counts": 106}
    assert results["crossover_length"] == 2 * EMBEDDING_DIM + FFN_DIM


def test_every_method_on_tokens_and_flops_and_the_default_within_1_percent(run):
    imbalance = run.results["imbalance"]
    assert sorted(imbalance) == ["flops", "tokens"]
    for by_method in imbalance.values():
        assert sorted(by_method) == sorted(METHODS)
        assert by_method["kk_swap"]["max_gap_to_lower_bound"] <= 0.01
        assert (
            by_method["kk_swap"]["mean_gap_to_lower_bound"]
            < by_method["karmarkar_karp"]["mean_gap_to_lower_bound"]
        )
        # the loader's cut of a heavy-tailed batch is far from balanced
        assert by_method["contiguous"]["max_gap_to_lower_bound"] > 0.1
        # max/mean never below the bound's own max/mean
        for stats in by_method.values():
            assert stats["mean_max_over_mean"] >= stats["mean_bound_over_mean"] - 1e-12
    rows = run.results["imbalance_rows"]
    assert len(rows) == 2 * 2 * len(METHODS)  # 1 size x 2 part counts x 1 seed x 2 workloads


def test_the_longest_sample_sets_the_bound_more_often_with_more_parts_and_on_flops(run):
    rows = [r for r in run.results["imbalance_rows"] if r["method"] == "kk_swap"]

    def share(**match):
        picked = [r for r in rows if all(r[k] == v for k, v in match.items())]
        return statistics.fmean(r["largest_item_sets_bound"] for r in picked)

    for workload in ("tokens", "flops"):
        assert share(workload=workload, num_parts=64) >= share(workload=workload, num_parts=8)
    assert share(workload="flops") >= share(workload="tokens")
    for r in rows:  # where the bound is the longest sample, max/mean is far above 1
        if r["largest_item_sets_bound"]:
            assert r["lower_bound"] / r["mean_load"] > 1


def test_fused_gather_uses_two_collectives(run):
    results = run.results
    assert results["gathers_identical"] is True
    # per key: lengths and values; the last KJT is weighted: + weights
    assert results["collective_calls"] == {"fused": 2, "per_key": NUM_KJTS * KEYS_PER_KJT * 2 + KEYS_PER_KJT}


def test_both_exchanges_give_the_same_batch_and_all_to_all_moves_o_b_bytes(run):
    results = run.results
    assert results["exchanges_identical"] is True
    assert {(r["world_size"], r["exchange"]) for r in results["exchanges"]} == {
        (2, "allgather"),
        (2, "alltoall"),
    }
    counted = results["exchange_bytes"]
    assert sorted(counted, key=int) == ["2", "8", "64"]
    # all-gather grows with W (every rank gets the whole batch), all-to-all does not
    assert counted["64"]["allgather"] >= 8 * counted["8"]["allgather"] * 0.99
    assert counted["64"]["alltoall"] < counted["64"]["allgather"] / 16


def test_real_run_times_every_mode_on_the_same_steps_and_records_each_phase(run):
    results = run.results
    assert results["flop_model_matches_counter"] is True
    assert results["same_weights"] is True
    assert results["timed_steps"] == [1, 2]  # 4 steps: not the first, not the last
    runs = {r["label"]: r for r in results["runs"]}
    assert runs["no balancing"]["hidden_fraction"] is None
    assert runs["sync"]["hidden_fraction"] == 0.0
    assert 0.0 <= results["hidden_fraction"] <= 1.0
    phases = {}
    for row in results["phase_ms"]:
        phases.setdefault(row["run"], {})[(row["thread"], row["phase"])] = row["ms"]
    assert not {p for t, p in phases["no balancing"]} & SHUFFLE_PHASES
    assert {p for t, p in phases["sync"] if t == "main"} >= SHUFFLE_PHASES
    for label in ("overlap", "overlap, all-to-all"):
        assert {p for t, p in phases[label] if t == "worker"} == SHUFFLE_PHASES
        assert not {p for t, p in phases[label] if t == "main"} & SHUFFLE_PHASES
        assert ("main", "wait") in phases[label]
    assert all(("main", "wait") not in phases[label] for label in ("no balancing", "sync"))


def test_speedups_and_the_overlap_sync_difference_follow_from_the_step_times(run):
    results = run.results
    step_ms = results["step_ms"]
    repeats = PARAMETERS["repeats"]
    assert results["repeats"] == repeats and all(len(v) == repeats for v in step_ms.values())
    reference = step_ms["no balancing"]
    for label, ratio in results["step_speedups"].items():
        per_repeat = [r / m for r, m in zip(reference, step_ms[label])]
        assert ratio["median"] == pytest.approx(statistics.median(per_repeat))
        assert (ratio["low"], ratio["high"]) == pytest.approx((min(per_repeat), max(per_repeat)))
    diffs = [o - s for o, s in zip(step_ms["overlap"], step_ms["sync"])]
    difference = results["overlap_minus_sync_ms"]
    assert difference["mean"] == pytest.approx(statistics.fmean(diffs))
    assert difference["ci_low"] <= difference["mean"] <= difference["ci_high"]
    assert difference["excludes_zero"] == (difference["ci_low"] > 0 or difference["ci_high"] < 0)
    # FLOPs: balancing cannot make the slowest rank's work larger than the loader's cut
    assert results["flops_ideal_speedups"]["no balancing"] == 1.0
    assert results["flops_ideal_speedups"]["sync"] >= 1.0


def test_summary_figures_and_explorer(run):
    summary = run.results["summary"]
    assert isinstance(summary, str) and "\n" not in summary
    assert "overlap - sync" in summary and "95% CI" in summary and "FLOPs predict" in summary
    figures = run.figures()
    # lengths, part loads, gap by method, FLOPs, gather times, exchanges, step times, timeline
    assert len(figures) == 8
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert run.widgets_shown_by("BalanceExplorer(") == 1

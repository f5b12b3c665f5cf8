"""Notebook 04 (the balancer, taught), executed once with small parameters.

Expectations come from counting (a KK example worked by hand, equal-count bounds, the FLOP
formula), from the package run here on the notebook's own inputs (the user's loop's batches
balanced again), and from recomputing the notebook's derived numbers from the raw ones it
records, never from fragments of its prose.
"""

import statistics

import pytest

EMBEDDING_DIM, FFN_DIM, WORLD_SIZE, JOB_STEPS = 16, 32, 2, 2
PARAMETERS = {
    "world_size": WORLD_SIZE,
    "batch_size": 8,
    "max_length": 64,
    "steps": 4,
    "repeats": 2,  # a paired difference and its interval need two
    "embedding_dim": EMBEDDING_DIM,
    "ffn_dim": FFN_DIM,
    "job_steps": JOB_STEPS,
    # the comparison runs at the notebook's own sizes (seconds): its reading is checked on them
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


def test_the_page_core_is_the_librarys_on_the_same_input(run):
    assert run.results["page_core"] == dict.fromkeys(
        ["kk_partition", "kk_swap_partition", "kk_swap_native", "kk_swap_max_load", "worker_ranks"], True
    )


def test_the_flop_formula_and_the_crossover(run):
    results = run.results
    assert results["flop_model"]["counted"] == results["flop_model"]["formula"]
    assert results["crossover_length"] == 2 * EMBEDDING_DIM + FFN_DIM
    rows = {r["width"]: r for r in results["crossover_by_width"]}
    # 4dL^2 = L(8d^2 + 4df) at f = 4d: L = 6d, worked by hand
    assert {d: r["crossover_length"] for d, r in rows.items()} == {32: 192, 128: 768, 256: 1536, 1024: 6144}
    for name in ("zipf", "lognormal"):  # wider: fewer samples past the crossover
        shares = [rows[d][f"longer, {name}"] for d in sorted(rows)]
        assert shares == sorted(shares, reverse=True)
    # balancing the lengths leaves more FLOPs on the heaviest rank than balancing the FLOPs
    for ratios in results["flops_max_over_mean"].values():
        assert ratios["by length"] > ratios["by attention FLOPs"]


def _worst_gaps(results):
    """(distribution, workload) -> method -> the worst gap over the batches, recounted from the raw rows."""
    worst = {}
    for r in results["imbalance_rows"]:
        by_method = worst.setdefault((r["distribution"], r["workload"]), {})
        by_method[r["method"]] = max(by_method.get(r["method"], 0.0), r["gap_to_lower_bound"])
    return worst


def test_every_method_on_both_distributions_against_the_bound(run):
    results = run.results
    rows, worst = results["imbalance_rows"], _worst_gaps(results)
    # 2 distributions x 3 sizes x 2 part counts x 3 seeds x 2 workloads
    assert len(rows) == 2 * 3 * 2 * 3 * 2 * len(METHODS)
    assert sorted(worst) == sorted((d, w) for d in ("zipf", "lognormal") for w in ("flops", "tokens"))
    shown = {(r["distribution"], r["workload"]): r for r in results["worst_gaps"]}  # the table printed
    for case, by_method in worst.items():
        assert {m: shown[case][m] for m in METHODS} == by_method
        # the reading: plain KK tens of percent at worst, the swaps close it
        assert by_method["karmarkar_karp"] > 0.1 and by_method["contiguous"] > 0.1
        assert by_method["kk_swap"] < by_method["karmarkar_karp"] / 10
    for r in rows:
        if r["method"] == "kk_swap":
            assert r["gap_to_equal_size_bound"] <= 0.01
        assert r["max_over_mean"] >= r["lower_bound"] / r["mean_load"] - 1e-12  # never below the bound


def test_lpt_ties_kk_swap_but_on_lognormal_tokens_and_is_never_lighter(run):
    results = run.results
    worst = _worst_gaps(results)
    loads = {}  # recount from the raw rows: the largest part of each batch, per method
    for r in results["imbalance_rows"]:
        key = (r["distribution"], r["workload"], r["num_samples"], r["num_parts"], r["seed"])
        loads.setdefault(key, {})[r["method"]] = r["max_load"]
    for by_method in loads.values():
        assert by_method["kk_swap"] <= by_method["greedy_lpt"] * (1 + 1e-12)
    for tally in results["kk_swap_vs_lpt"]:
        case = (tally["distribution"], tally["workload"])
        assert tally["greedy_lpt"] == 0 and tally["kk_swap"] > 0  # "often lighter, never heavier"
        lighter = sum(
            1 for k, m in loads.items() if k[:2] == case and m["kk_swap"] < m["greedy_lpt"] * (1 - 1e-12)
        )
        assert tally["kk_swap"] == lighter
        assert tally["kk_swap"] + tally["equal"] == sum(1 for k in loads if k[:2] == case)
    # equal worst gaps on the Zipf batches and on the log-normal FLOPs (what the shuffle balances)
    for case in (("zipf", "tokens"), ("zipf", "flops"), ("lognormal", "flops")):
        assert worst[case]["greedy_lpt"] == pytest.approx(worst[case]["kk_swap"], rel=1e-9)
    lognormal = worst[("lognormal", "tokens")]
    assert lognormal["greedy_lpt"] > 10 * lognormal["kk_swap"]


def test_the_longest_sample_sets_the_bound_where_the_table_says(run):
    rows = run.results["imbalance_rows"]
    for r in rows:
        if r["largest_item_sets_bound"]:  # there the bound's max/mean is above 1
            assert r["lower_bound"] / r["mean_load"] > 1
    zipf_flops_64 = [
        r["largest_item_sets_bound"]
        for r in rows
        if (r["distribution"], r["workload"], r["method"], r["num_parts"]) == ("zipf", "flops", "kk_swap", 64)
    ]
    assert any(zipf_flops_64)
    shown = {(r["distribution"], r["workload"]): r["longest_sets_bound"] for r in run.results["worst_gaps"]}
    for (name, workload), share in shown.items():
        kk_swap = [
            r for r in rows if (r["distribution"], r["workload"], r["method"]) == (name, workload, "kk_swap")
        ]
        assert share == pytest.approx(sum(r["largest_item_sets_bound"] for r in kk_swap) / len(kk_swap))


def test_the_users_loop_receives_the_librarys_parts(run):
    from embnb.balancing import balance
    from embnb.lab.balancing import job

    result = run.results["job"]
    assert len(result) == WORLD_SIZE
    batches = [list(job.loader(rank, JOB_STEPS, 32, 0)) for rank in range(WORLD_SIZE)]
    for step in range(JOB_STEPS):
        lengths = [
            n for rank in range(WORLD_SIZE) for n in batches[rank][step].sparse_features["item"].lengths()
        ]
        lengths = [int(n) for n in lengths]
        parts = balance(lengths, WORLD_SIZE)  # the same KK + swaps, on the gathered lengths
        for rank in range(WORLD_SIZE):
            loaded = int(batches[rank][step].sparse_features["item"].lengths().sum())
            assert result[rank]["loaded"][step] == loaded
            assert result[rank]["balanced"][step] == sum(lengths[i] for i in parts[rank])


def test_the_real_run_times_every_mode_on_the_same_steps(run):
    results = run.results
    assert results["same_weights"] is True
    assert results["timed_steps"] == [1, 2]  # 4 steps: not the first, not the last
    phases = {}
    for row in results["phase_ms"]:
        phases.setdefault(row["run"], {})[(row["thread"], row["phase"])] = row["ms"]
    assert not {p for _, p in phases["none"]} & SHUFFLE_PHASES
    assert {p for t, p in phases["sync"] if t == "main"} >= SHUFFLE_PHASES
    assert {p for t, p in phases["overlap"] if t == "worker"} == SHUFFLE_PHASES
    assert ("main", "wait") in phases["overlap"] and ("main", "wait") not in phases["sync"]
    step_ms, runs = results["step_ms"], {r["run"]: r for r in results["runs"]}
    assert all(len(ms) == PARAMETERS["repeats"] for ms in step_ms.values())
    for label, row in runs.items():
        # the printed ms is the mean over repeats, the speed-up the ratio of means, its range the repeats'
        assert row["ms_per_step"] == pytest.approx(statistics.fmean(step_ms[label]))
        assert row["speedup"] == pytest.approx(statistics.fmean(step_ms["none"]) / row["ms_per_step"])
        ratios = [a / b for a, b in zip(step_ms["none"], step_ms[label])]
        assert (row["speedup_low"], row["speedup_high"]) == pytest.approx((min(ratios), max(ratios)))
        shuffle = sum(
            r["ms"] for r in results["phase_ms"] if r["run"] == label and r["phase"] in SHUFFLE_PHASES
        )
        assert row["shuffle_ms"] == pytest.approx(shuffle, abs=1e-9)
    assert runs["none"]["flops_predict"] == 1.0 and runs["sync"]["flops_predict"] >= 1.0
    difference = results["overlap_minus_sync_ms"]
    assert difference["mean"] == pytest.approx(
        statistics.fmean(o - s for o, s in zip(step_ms["overlap"], step_ms["sync"]))
    )
    assert difference["ci_low"] <= difference["mean"] <= difference["ci_high"]


def test_figures_explorer_and_summary(run):
    figures = run.figures()
    assert len(figures) == 2  # the gap panels (the key figure) and the timeline
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert run.widgets_shown_by("BalanceExplorer(") == 1
    results = run.results
    summary = results["summary"]  # the headline as data, not a sentence: the values of the tables
    assert summary["measured on"].endswith(f", {WORLD_SIZE} gloo ranks")
    assert summary["overlap - sync, ms per step"] == results["overlap_minus_sync_ms"]
    zipf = next(r for r in results["worst_gaps"] if (r["distribution"], r["workload"]) == ("zipf", "tokens"))
    assert summary["worst gap to max(mean, largest item), Zipf tokens"] == {
        m: zipf[m] for m in ("kk_swap", "greedy_lpt", "karmarkar_karp")
    }
    assert run.results["device"]["backend"] == run.results["backend"] == "gloo"

"""Notebook 03 (the DP planner, teaching path), executed once with small parameters; each test
asserts values of its results JSON against expectations computed here."""

import itertools
import math
import statistics

import pytest

SMALL = {
    "device": "cuda",  # the topology planned: a dry run, no GPU needed; its HBM binds
    "num_tables": 10,
    "world_size": 4,
    "hbm_cap_gb": 0.5,
    "pitfall_instances": 12,
    "quality_instances": 2,  # each plans 4,096 plans with GridSearch
    "timeout_s": 20,
}


@pytest.fixture(scope="module")
def run(execute):
    return execute("03_dp_planner", SMALL)


def _least_by_brute_force(perfs, memories, tables, bins):
    """The least summed perf of one option for each of the first `tables` tables in exactly `bins` bins."""
    sums = [
        sum(perfs[t][o] for t, o in enumerate(c))
        for c in itertools.product(*(range(len(p)) for p in perfs[:tables]))
        if sum(memories[t][o] for t, o in enumerate(c)) == bins
    ]
    return min(sums, default=None)


def test_small_knapsack_marks_the_choices_brute_force_confirms(run):
    """Section 1: the figure's cells, letters and path, against brute force over every plan."""
    small = run.results["small_knapsack"]
    perfs, memories, rows, choices = small["perfs"], small["memories"], small["rows"], small["choices"]
    capacity = small["capacity"]
    assert len(small["tables"]) <= 8 and capacity + 1 <= 30  # small enough to follow by hand
    fastest = sum(m[p.index(min(p))] for p, m in zip(perfs, memories))
    assert small["fastest_bins"] == fastest > capacity  # memory binds: not every table's fastest option
    # the recurrence written on the page agrees with brute force and the proposer's knapsack
    assert run.results["page_core_agrees"] == dict.fromkeys(
        ("table", "choices", "plan", "proposer_knapsack"), True
    )
    for t in range(len(perfs)):
        above = rows[t - 1] if t else [0.0] + [None] * capacity
        for m in range(capacity + 1):
            brute = _least_by_brute_force(perfs, memories, t + 1, m)
            if brute is None:
                assert rows[t][m] is None and choices[t][m] == -1, (t, m)
                continue
            option = choices[t][m]  # the letter in the cell: from the row above, plus this option
            assert rows[t][m] == pytest.approx(brute), (t, m)
            assert above[m - memories[t][option]] + perfs[t][option] == pytest.approx(brute), (t, m)
    plan = small["plan"]  # the outlined path
    assert sum(memories[t][o] for t, o in enumerate(plan)) == small["end"] <= capacity
    best = min(
        sum(perfs[t][o] for t, o in enumerate(c))
        for c in itertools.product(*(range(len(p)) for p in perfs))
        if sum(memories[t][o] for t, o in enumerate(c)) <= capacity
    )
    assert rows[-1][small["end"]] == pytest.approx(best) == sum(perfs[t][o] for t, o in enumerate(plan))
    assert len({small["options"][t][o] for t, o in enumerate(plan)}) == 2  # the best plan mixes both kernels


def test_the_least_summed_perf_is_not_the_best_rated_plan(run):
    """Section 2: on the placement example the least summed plan cannot be placed and the least
    summed placeable one rates worse than the best; over random instances, the shares by memory
    ratio recomputed here from each instance's ratio."""
    results = run.results
    tiny = results["tiny"]
    assert tiny["least summed"]["perf_rating"] is None  # cannot be placed
    assert tiny["least summed placeable"]["perf_rating"] > 1.05 * tiny["best rated"]["perf_rating"]
    assert tiny["least summed"]["summed_perf"] < tiny["best rated"]["summed_perf"]
    assert results["tiny_plans"]["plans"] == 64 and 0 < results["tiny_plans"]["placeable"] < 64
    instances = results["pitfall"]
    assert 8 <= len(instances) <= SMALL["pitfall_instances"]  # those with a plan
    bins = {"[0.0, 0.5)": (0, 0.5), "[0.5, 1.0)": (0.5, 1), "[1.0, 2.0)": (1, 2), "[2.0, inf)": (2, math.inf)}
    by_ratio = {b["memory_ratio"]: b for b in results["pitfall_by_memory_ratio"]}
    assert list(by_ratio) == list(bins)
    for label, (low, high) in bins.items():
        inside = [i for i in instances if low <= i["memory_ratio"] < high]
        worse = sum(i["least_placed_sum_over_best"] > 1 + 1e-9 for i in inside)
        assert (by_ratio[label]["instances"], by_ratio[label]["worse"]) == (len(inside), worse), label
    assert all(i["least_placed_sum_over_best"] >= 1 - 1e-9 for i in instances)  # brute force's best is best
    assert any(i["least_placed_sum_over_best"] > 1 + 1e-9 for i in instances)  # the summary's claim


def test_the_dp_rates_equal_to_brute_force_on_every_small_instance(run):
    """Section 3: per proposer, its counts and worst and median ratio recomputed from the instances
    (None: no plan; 3 tables are 4,096 plans, which GridSearch never skips)."""
    results = run.results
    study = results["quality_study"]
    assert len({row["instance"] for row in study}) == SMALL["quality_instances"]
    assert {row["hosts"] for row in study} == {1} and {row["world_size"] for row in study} <= {2, 3, 4}
    for name, summary in results["quality"].items():
        ratios = [r["ratio"] for r in study if r["proposer"] == name]
        found = [r for r in ratios if r is not None]
        assert (summary["instances"], summary["skipped"]) == (len(ratios), 0), name
        assert summary["no_plan"] == len(ratios) - len(found), name
        assert summary["worst_ratio"] == pytest.approx(max(found, default=None)), name
        assert summary["median_ratio"] == pytest.approx(statistics.median(found) if found else None), name
        assert summary["within_2pct"] == pytest.approx(sum(r <= 1.02 for r in found) / len(ratios)), name
    # equal to brute force up to float rounding, never better, a plan every time: the summary's claim
    ours = results["quality"]["embnb DP"]
    assert ours["worst_ratio"] == pytest.approx(1.0, rel=1e-9) and ours["no_plan"] == 0
    assert results["quality"]["GridSearch"]["worst_ratio"] == pytest.approx(1.0)  # brute force in the planner


def test_create_planner_plans_every_table(run):
    """Section 4: the call a training job makes; its rating is its slowest rank's estimate."""
    planned = run.results["create_planner"]
    assert planned["plan_s"] > 0 and len(planned["rank_perf_ms"]) == SMALL["world_size"]
    assert planned["rating_ms"] == pytest.approx(max(planned["rank_perf_ms"]))
    assert sum(row["tables"] for row in planned["tables"]) == SMALL["num_tables"]


def test_the_key_figure_and_the_explorer_are_drawn(run):
    assert [p.name for p in run.figures()] == ["03_dp_planner_fig01.png"]  # the knapsack grid
    assert (run.out / "03_dp_planner_key.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run.widgets_shown_by("PlannerExplorer(") == 1


def test_the_summary_as_data_and_the_machine_it_ran_on(run):
    from embnb.timing import machine_name

    results = run.results
    assert results["machine"] == machine_name()
    summary = results["summary"]  # the headline as data: each value read back from its table
    assert summary["knapsack by hand equals brute force"] is results["page_core_agrees"]["table"] is True
    ours = results["quality"]["embnb DP"]
    assert summary["embnb DP's rating over brute force's best, worst (estimates)"] == ours["worst_ratio"]
    assert summary["instances"] == len({row["instance"] for row in results["quality_study"]})

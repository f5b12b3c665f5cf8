"""Notebook 03 (DP sharding planner), executed for real with small parameters."""

import pytest

SMALL = {
    "device": "cuda",  # the topology planned: a dry run, no GPU needed; its HBM binds
    "num_tables": 10,
    "world_size": 4,
    "hbm_cap_gb": 0.5,
    "budget_fractions": [1.5, 0.5],
    "quality_instances": 3,
    "pitfall_instances": 12,
    "repeats": 2,
    "timeout_s": 20,
}


@pytest.fixture(scope="module")
def run(execute):
    return execute("03_dp_planner", SMALL)


def test_results_name_every_proposer_with_rating_and_time(run):
    results = run.results
    assert isinstance(results["summary"], str) and "\n" not in results["summary"]
    proposers = results["proposers"]
    assert set(proposers) == {
        "embnb DP",
        "torchrec DP",
        "Greedy",
        "Uniform",
        "GridSearch",
        "torchrec default",
    }
    for name, row in proposers.items():
        assert row["plan_s"] >= 0 and row["feasible"] == (row["perf_rating"] is not None), name
        assert row["plan_s_min"] <= row["plan_s"] <= row["plan_s_max"], name  # a median of the repeats
        assert row["end_to_end_s"] == pytest.approx(results["enumerate_s"] + row["plan_s"]), name
        assert row["plans_considered"] >= row["proposals"], name
    # embnb's DP places and rates its plans itself: the partitioner sees the first and the best
    ours = proposers["embnb DP"]
    assert ours["proposals"] <= 2 < ours["plans_considered"]
    assert proposers["torchrec DP"]["plans_considered"] == proposers["torchrec DP"]["proposals"]
    assert f"({ours['end_to_end_s']:.2g} s with enumeration)" in results["summary"]
    assert proposers["embnb DP"]["feasible"]
    assert proposers["GridSearch"]["note"].startswith("skipped:")  # 16^10 plans
    assert results["num_tables"] == 10 and results["world_size"] == 4


def test_create_planner_end_to_end_with_either_enumerator_gives_the_dps_plan(run):
    """Section 9: from the model to the plan, as training code calls create_planner."""
    results = run.results
    end_to_end = results["create_planner_end_to_end"]
    assert set(end_to_end) == {"embnb", "torchrec"}
    ours = results["proposers"]["embnb DP"]["perf_rating"]
    for name, timed in end_to_end.items():
        assert len(timed["seconds"]) == SMALL["repeats"] and min(timed["seconds"]) > 0, name
        assert timed["median_s"] == pytest.approx(sum(timed["seconds"]) / len(timed["seconds"])), name
        # the same options, the same DP: the plan compare_proposers rated, every run
        assert timed["rating"] == ours and timed["same_rating_every_run"], name
    assert f"create_planner from model to plan {end_to_end['embnb']['median_s']:.2g} s" in results["summary"]


def test_worked_example_and_quality(run):
    results = run.results
    assert results["tiny_dp_matches_by_hand"] is True
    # the worked example shows both pitfalls: the least summed plan cannot be placed, and
    # the least summed placeable one rates worse than the best by more than rounding
    assert results["tiny_least_sum_placeable"] is False
    assert results["tiny_least_placed_sum_rating"] > 1.05 * results["tiny_best_rating"]
    assert results["pitfall_instances"] >= 8  # of 12 drawn, those with a plan
    assert 0 < results["pitfall_worse_share"] <= 1
    assert 1 <= results["pitfall_median_ratio"] <= results["pitfall_max_ratio"]
    assert results["quality_instances"] == 3
    ours = results["quality"]["embnb DP"]
    # the README's 1.000x: equal to brute force up to float rounding, never better
    assert ours["worst_ratio"] == pytest.approx(1.0, rel=1e-9) and ours["no_plan"] == 0
    grid = results["quality"]["GridSearch"]  # exhaustive in the planner: brute force
    assert grid["worst_ratio"] == pytest.approx(1.0)


def test_budget_sweep_and_chosen_plan(run):
    results = run.results
    sweep = results["budget_sweep"]
    assert {(r["proposer"], r["hbm_cap_gb"]) for r in sweep} == {
        (p, c) for p in ("embnb DP", "torchrec DP", "Greedy", "Uniform") for c in (0.75, 0.25)
    }
    ours = {r["hbm_cap_gb"]: r["perf_rating"] for r in sweep if r["proposer"] == "embnb DP"}
    assert ours[0.25] >= ours[0.75]  # less memory, slower options
    ranks = results["chosen_plan_rank_perf"]
    assert len(ranks) == 4 and max(ranks) == pytest.approx(results["proposers"]["embnb DP"]["perf_rating"])


def test_cpu_topology_plans_where_torchrec_dp_fails(run):
    results = run.results
    assert results["cpu_topology"]["embnb DP"] is not None
    assert "ZeroDivisionError" in results["cpu_notes"]["torchrec DP"]


def test_figures_and_explorer_are_drawn(run):
    pngs = run.figures()
    assert len(pngs) == 5  # DP heatmap, comparison, budget sweep, brute force, ranks
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert run.widgets_shown_by("PlannerExplorer(") == 1


def test_ablation_ladder(run):
    from embnb.planner.ablation import LADDER

    results = run.results
    ablation = results["ablation"]
    assert list(ablation) == list(LADDER)
    ratings = [ablation[rung]["perf_rating"] for rung in LADDER]
    adds_plans = ratings[:5]  # up to local search each rung considers a superset of plans
    assert all(after <= before for before, after in zip(adds_plans, adds_plans[1:]))
    pruned, replayed = ablation["+ lower-bound pruning"], ablation["+ the replica"]
    assert replayed["perf_rating"] == pruned["perf_rating"]  # the replica is exact
    assert replayed["proposals"] <= 2 < pruned["proposals"]
    assert replayed["perf_rating"] == results["proposers"]["embnb DP"]["perf_rating"]  # the default proposer
    for rung, row in ablation.items():
        assert row["plan_s_min"] <= row["plan_s"] <= row["plan_s_max"], rung

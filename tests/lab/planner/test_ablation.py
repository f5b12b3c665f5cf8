"""embnb.lab.planner.comparison.ablation_table: the ladder of proposers, each adding one piece.

The oracles are set relations, not recorded numbers: up to local search each
rung considers every plan the rung before considers and more (the same
runs, in the same order, then more), so with the same deterministic
partitioner its best rating can only be equal or better; the replica changes
who places a plan, not which plans are considered; no rung beats brute force.
"""

import logging
import math

import pytest

from embnb import planner
from embnb.lab.planner.comparison import LADDER, Planning, ablation_table, random_instance
from embnb.lab.planner.explain import brute_force_rating
from embnb.lab.planner.models import enumerate_options, make_model

BATCH_SIZE = 512
SUPERSETS = ["plain knapsack", "+ bisection", "+ memory slack", "+ capped runs", "+ local search"]


def test_each_rung_turns_one_piece_back_on_and_the_last_is_the_default_proposer():
    rungs = list(LADDER.values())
    assert rungs[-1] == {}  # DynamicProgrammingProposer's defaults
    for before, after in zip(rungs, rungs[1:]):
        assert set(after) < set(before) and len(set(before) - set(after)) == 1
        assert all(after[k] == before[k] for k in after)


@pytest.fixture(scope="module")
def ladder():
    """16 tables on 4 devices of 0.8 GiB: memory binds device by device, so bisection skips plans
    (40 tables on 8 devices, notebook 03's default, take four times as long)."""
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    model = make_model(16, 0)
    topology = planner.make_topology(4, "cuda", hbm_cap_gb=0.8, ddr_cap_gb=128.0)
    enumerated = enumerate_options(model.tables, topology, BATCH_SIZE, model.constraints)
    return ablation_table(enumerated, topology, Planning(BATCH_SIZE, model.constraints, repeats=2))


def test_rungs_that_add_plans_never_rate_worse(ladder):
    ratings = ladder.perf_rating
    for before, after in zip(SUPERSETS, SUPERSETS[1:]):
        assert ratings[after] <= ratings[before], (before, after)
    # bisection considers a subset of the plain knapsack's plans
    considered = ladder.plans_considered
    assert considered["+ bisection"] < considered["plain knapsack"]


def test_the_replica_places_what_the_planner_would(ladder):
    pruned, replayed = ladder.loc["+ lower-bound pruning"], ladder.loc["+ the replica"]
    assert replayed.perf_rating == pruned.perf_rating
    assert replayed.plans_considered == pruned.plans_considered
    # without it the planner partitions each considered plan (plus the first, smallest-options one)
    assert pruned.proposals == pruned.plans_considered + 1 and replayed.proposals <= 2


def test_times_are_a_median_inside_their_range(ladder):
    assert (ladder.plan_s_min <= ladder.plan_s).all()
    assert (ladder.plan_s <= ladder.plan_s_max).all()
    assert not ladder.timed_out.any()


@pytest.mark.parametrize("seed", range(4))
def test_no_rung_beats_brute_force(seed):
    model, topology = random_instance(seed)
    enumerated = enumerate_options(model.tables, topology, BATCH_SIZE, model.constraints)
    best = brute_force_rating(enumerated, topology, BATCH_SIZE)
    table = ablation_table(enumerated, topology, Planning(BATCH_SIZE, model.constraints, repeats=1))
    if not math.isfinite(best):
        assert table.perf_rating.isna().all()
        return
    assert (table.perf_rating >= best * (1 - 1e-9)).all(), table.perf_rating.tolist()


def test_bad_repeats_are_refused():
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        ablation_table(None, None, Planning(BATCH_SIZE, repeats=0))

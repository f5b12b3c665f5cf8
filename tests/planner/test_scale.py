"""What keeps the DP proposer's memory and time in bounds at thousands of
tables: the knapsack runs keep their plans a byte per table and remember
earlier runs' plans by digest, and the plans handed on own their memory."""

import logging

import numpy as np
import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb import planner
from embnb.lab.planner.models import enumerate_options, fused_table_gb, make_model
from embnb.planner.search import KnapsackRuns
from embnb.planner.space import SearchSpace, by_table
from embnb.planner.topology import reserved_topology

logging.getLogger("torchrec").setLevel(logging.ERROR)


@pytest.fixture(scope="module")
def space():
    model = make_model(24, seed=3)
    topology = planner.make_topology(8, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 8 * 0.5)
    enumerated = enumerate_options(model.tables, topology, 512, model.constraints)
    return SearchSpace(by_table(enumerated.options), reserved_topology(topology, enumerated, 512))


def test_a_run_drops_exactly_the_plans_earlier_runs_had(space):
    runs = KnapsackRuns(space, 100, 10, max_caps=0)
    valid = np.isfinite(space.perf)
    first = runs.run(valid)
    assert len(first.plans) > 10 and first.plans.dtype == np.uint8  # fewer than 256 options a table
    assert all(len(key) == 16 for key in runs._seen) and len(runs._seen) == len(first.plans)
    assert not len(runs.run(valid).plans)  # the same knapsack again: every plan seen
    # Without one option of the top plan: the new run keeps exactly the rows the
    # first did not have (the oracle compares whole rows, not digests).
    earlier = {row.tobytes() for row in first.plans}
    checked = 0
    for table in range(len(valid)):
        allowed = valid.copy()
        allowed[table, first.plans[0][table]] = False
        fresh = KnapsackRuns(space, 100, 10, max_caps=0).run(allowed)
        expected = [row for row in fresh.plans if row.tobytes() not in earlier]
        if 0 < len(expected) < len(fresh.plans):  # some rows seen before, some not
            second = KnapsackRuns(space, 100, 10, max_caps=0)
            second.run(valid)
            assert np.array_equal(second.run(allowed).plans, np.array(expected))
            checked += 1
    assert checked >= 3


def test_the_plans_a_proposer_keeps_own_their_memory():
    """A refinement's start is a copy of its row (as option indices): a view
    would keep the whole run's plans (states x tables) alive."""
    model = make_model(40, seed=1)
    topology = planner.make_topology(8, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 8 * 0.5)
    proposer = planner.DynamicProgrammingProposer()
    EmbeddingShardingPlanner(
        topology=topology,
        batch_size=512,
        constraints=model.constraints,
        storage_reservation=FixedPercentageStorageReservation(0.15),
        proposer=[proposer],
        debug=False,
    ).plan(
        EmbeddingBagCollection(tables=model.tables, device=torch.device("meta")),
        [EmbeddingBagCollectionSharder()],
    )
    starts = proposer._climb.starts
    assert proposer.num_knapsack_proposals > 10 and len(starts) >= proposer.num_knapsack_proposals
    assert all(start.plan.dtype == np.int64 and start.plan.base is None for start in starts)

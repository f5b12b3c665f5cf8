"""Notebook 02 (column-wise permute indices): a real papermill run on 2 gloo
ranks with a placement other than the default. The expected values follow
from the placement by hand, from the batches the notebook's parameters make,
and from how torchrec's and embnb's all-to-alls are described (ids once per
shard against once per owner rank). Its figures and widget are tested in
tests/columnwise/."""

import json

import pytest

from embnb.columnwise.cases import CWCase, TableSpec, make_batches

WORLD_SIZE, BATCH_SIZE, MAX_LENGTH = 2, 4, 3
TRAFFIC_SHARDS = [2, 4, 6]
PARAMETERS = {
    "world_size": WORLD_SIZE,
    "embedding_dim": 16,
    "shard_ranks": [1, 0, 0, 1],
    "uneven_widths": [1, 6, 4, 5],
    "torchrec_size_per_rank": [4, 12],
    "traffic_shards": TRAFFIC_SHARDS,
    "batch_size": BATCH_SIZE,
    "max_length": MAX_LENGTH,
}


@pytest.fixture(scope="module")
def run(execute):
    return execute("02_cw_permute_indices", PARAMETERS)


def test_torchrec_is_exact_with_its_permute_and_wrong_without_it(run):
    results = run.results
    assert results == json.loads((run.out / "02_cw_permute_indices.json").read_text())
    assert isinstance(results["summary"], str) and "\n" not in results["summary"]
    assert (results["backend"], results["compute_kernel"]) == ("gloo", "fused")
    # by hand: ranks [1, 0, 0, 1] arrive as s1, s2 (rank 0), s0, s3 (rank 1)
    assert results["rank_order"] == [1, 2, 0, 3]
    assert results["permute_indices"] == [2, 0, 1, 3]
    assert results["torchrec_permute_indices"] == [[2, 0, 1, 3]] * 2
    assert results["reference_matches_unsharded"] is True
    assert results["torchrec_matches_unsharded"] is True
    # torchrec without its permute returns exactly what naive concatenation does
    assert results["torchrec_unpermuted_matches_unsharded"] is False
    assert results["naive_matches_unsharded"] is False and results["naive_max_abs_error"] > 0
    assert results["torchrec_unpermuted_max_abs_error"] == results["naive_max_abs_error"]
    assert results["torchrec_skipped"] is None


def test_torchrec_sends_ids_once_per_shard_and_embnb_once_per_owner(run):
    traffic = run.results["traffic"]
    assert [row["shards"] for row in traffic] == TRAFFIC_SHARDS
    # the traffic cases' batches: the notebook's batch size and lengths, a 48-column table
    case = CWCase(WORLD_SIZE, 48, (TableSpec("t0", 32, ("f0",)),), {"t0": [0, 1]}, max_length=MAX_LENGTH)
    ids = sum(len(batch["f0"][1]) for batch in make_batches(case))
    sequences = WORLD_SIZE * BATCH_SIZE
    overhead = set()
    for row in traffic:
        owners = min(row["shards"], WORLD_SIZE)  # shards dealt round-robin over the ranks
        assert row["ids looked up"] == ids
        assert row["embnb int"] == WORLD_SIZE**2 + owners * ids  # a count per destination, ids once per owner
        # torchrec: ids and lengths once per shard, plus split counts that do not grow with shards
        overhead.add(row["torchrec int"] - row["shards"] * (ids + sequences))
        assert row["torchrec float"] == row["embnb float"] == ids * 48  # every id's full row comes back
    assert len(overhead) == 1 and overhead.pop() >= 0
    assert traffic[-1]["torchrec int"] > traffic[0]["torchrec int"]  # grows with shards; embnb's does not
    assert len({row["embnb int"] for row in traffic}) == 1


def test_uneven_widths_work_in_embnb_and_not_in_torchrec(run):
    results = run.results
    assert results["uneven_reference_matches_unsharded"] is True
    assert results["uneven_naive_matches_unsharded"] is False
    assert results["torchrec_size_per_rank"] == [4, 12]
    outcomes = results["torchrec_size_per_rank_outcomes"]
    assert len(outcomes) == WORLD_SIZE
    assert "equals the unsharded EC" not in outcomes  # torchrec right on no rank
    assert any("Split sizes doesn't match" in o and "[in torchrec/distributed/" in o for o in outcomes)
    assert "right on 0 of 2 ranks" in results["summary"]
    assert results["torchrec_version"].split(".")[0].isdigit()
    assert results["embnb_uneven_check"].startswith("uneven widths {'t0': [1, 6, 4, 5]}: embnb's check")


def test_figures_and_explorer(run):
    # seed order, lookup errors, traffic, uneven widths
    assert len(run.figures()) == 4
    assert run.widgets_shown_by("PlacementExplorer(") == 1

"""Notebook 02 (column-wise permute indices): a real papermill run on 2 gloo
ranks with a placement other than the default. The expected values follow
from the placement by hand, from the batches the notebook's parameters make,
from how torchrec's and embnb's all-to-alls are described (ids and lengths
once per shard against ids once per owner rank, int64; rows fp32), written
here as a byte formula of its own, and from torchrec's installed source.
Its figures and widget are tested in tests/lab/columnwise/."""

import json
import pathlib

import pytest
import torchrec

from embnb.lab.columnwise.cases import CWCase, TableSpec, make_batches

WORLD_SIZE, BATCH_SIZE, MAX_LENGTH = 2, 4, 3
TRAFFIC_SHARDS = [2, 6]  # 2 shards on 2 ranks (each id twice either way) and 6 narrow ones
TRAFFIC = {"traffic_batch_size": 32, "traffic_max_length": 80, "traffic_num_embeddings": 500}
PLANNER_DIMS = [256, 512]
PARAMETERS = {
    "world_size": WORLD_SIZE,
    "embedding_dim": 16,
    "shard_ranks": [1, 0, 0, 1],
    "uneven_widths": [1, 6, 4, 5],
    "torchrec_size_per_rank": [4, 12],
    "traffic_shards": TRAFFIC_SHARDS,
    **TRAFFIC,
    "planner_embedding_dims": PLANNER_DIMS,
    "count_world_size": 8,
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


def _traffic_batches(embedding_dim: int) -> tuple[int, int]:
    """(ids, sequences) of all ranks in the notebook's byte count."""
    table = (TableSpec("t0", TRAFFIC["traffic_num_embeddings"], ("f0",)),)
    case = CWCase(
        WORLD_SIZE,
        embedding_dim,
        table,
        {"t0": [0, 1]},  # the batches do not depend on the layout
        batch_size=TRAFFIC["traffic_batch_size"],
        max_length=TRAFFIC["traffic_max_length"],
    )
    batches = make_batches(case)
    return sum(len(b["f0"][1]) for b in batches), sum(len(b["f0"][0]) for b in batches)


def test_the_byte_count_is_realistic_and_covers_the_planner_layouts(run):
    results = run.results
    ids_per_rank = results["traffic_ids_per_rank"]
    assert len(ids_per_rank) == WORLD_SIZE and min(ids_per_rank) >= 1000  # thousands of ids per rank
    # torchrec's planner: the smallest multiple of 4 from MIN_CW_DIM up that divides D (by hand: 128)
    assert results["torchrec_min_cw_dim"] == 128
    layouts = {p["embedding_dim"]: p for p in results["planner_layouts"]}
    assert sorted(layouts) == PLANNER_DIMS
    for dim, layout in layouts.items():
        assert layout["widths"] == [128] * (dim // 128)
        assert sorted(set(layout["ranks"])) == list(range(WORLD_SIZE))  # the planner uses both ranks
    traffic = results["traffic"]
    expected = [(48, n, "teaching") for n in TRAFFIC_SHARDS]
    expected += [(dim, dim // 128, "torchrec planner") for dim in PLANNER_DIMS]
    assert [(r["embedding_dim"], r["shards"], r["source"]) for r in traffic] == expected
    assert all(r["both exact"] for r in traffic)  # both paths return the unsharded rows on every layout


def test_counted_bytes_equal_the_per_id_formula(run):
    """torchrec: 8 B per id and per length, once per shard, plus 3 counts per
    rank and destination; embnb: 8 B per id once per owner rank, plus one
    count per rank and destination; both: D x 4 B of row values per id."""
    traffic = run.results["traffic"]
    for row in traffic:
        dim, shards, owners = row["embedding_dim"], row["shards"], row["owner ranks"]
        ids, sequences = _traffic_batches(dim)
        assert (row["ids"], row["sequences"]) == (ids, sequences)
        assert owners == min(shards, WORLD_SIZE)
        assert row["torchrec int B"] == 8 * (shards * (ids + sequences) + 3 * WORLD_SIZE**2)
        assert row["embnb int B"] == 8 * (owners * ids + WORLD_SIZE**2)
        assert row["torchrec rows B"] == row["embnb rows B"] == 4 * dim * ids
        assert row["torchrec / embnb"] == pytest.approx(row["torchrec B"] / row["embnb B"])
        # per id, torchrec's integers against its rows: about shards x 8 B against D x 4 B
        assert 2 * shards / dim <= row["torchrec int / rows"] < 2 * shards / dim * 1.1
    assert run.results["traffic_counts_equal_model"] == [True] * len(traffic)
    # 2 shards on 2 ranks: both paths send each id twice; the gap is lengths and counts only
    first = traffic[0]
    _, sequences = _traffic_batches(48)
    assert first["torchrec int B"] - first["embnb int B"] == 8 * (2 * sequences + 2 * WORLD_SIZE**2)
    assert first["torchrec / embnb"] < 1.01
    # torchrec's planner layouts: 128-column shards, integers about 2 / 128 of the row bytes
    planner = [r for r in traffic if r["source"] == "torchrec planner"]
    assert all(r["torchrec int / rows"] < 0.02 and r["torchrec / embnb"] < 1.02 for r in planner)
    teaching = [r for r in traffic if r["source"] == "teaching"]
    assert teaching[-1]["torchrec int / rows"] > 0.25  # 6 shards of 8 columns: 2 / 8


def test_at_8_ranks_the_planner_puts_each_shard_on_its_own_rank_and_the_bytes_are_nearly_equal(run):
    """The count at W = 8 with torchrec's own layouts, by the byte formula of
    this file: distinct owner ranks, so both paths send each id once per shard."""
    counted = run.results["planner_bytes_at"]
    w, ids, sequences = counted["world_size"], counted["ids_per_rank"] * 8, counted["sequences_per_rank"] * 8
    assert w == 8 and [r["embedding_dim"] for r in counted["rows"]] == PLANNER_DIMS
    for row in counted["rows"]:
        dim = row["embedding_dim"]
        shards = dim // 128  # 128-column blocks, by hand
        assert row["shard widths"] == [128] * shards
        assert sorted(row["shard ranks"]) == list(range(shards)) and row["owner ranks"] == shards
        torchrec = 8 * (shards * (ids + sequences) + 3 * w**2) + 4 * dim * ids
        embnb = 8 * (shards * ids + w**2) + 4 * dim * ids
        assert (row["torchrec B"], row["embnb B"]) == (torchrec, embnb)
        assert row["torchrec / embnb"] == pytest.approx(torchrec / embnb)
        assert 1 < row["torchrec / embnb"] < 1.001  # lengths and counts only
    ratios = [r["torchrec / embnb"] for r in counted["rows"]]
    assert f"{min(ratios):.4f}" in counted["finding"] and counted["finding"] in run.results["summary"]
    assert "every shard on a rank of its own" in counted["finding"]


def test_torchrecs_pooled_cw_path_permutes_too_and_matches_the_unsharded_bag_collection(run):
    pooled = run.results["pooled"]
    # shard_ranks [1, 0, 0, 1]: rank 0 returns shards 1, 2 first, rank 1 then shards 0, 3 (by hand)
    assert pooled["shard_ranks"] == PARAMETERS["shard_ranks"] and "permute [2, 0, 1, 3]" in pooled["sentence"]
    assert len(pooled["max_abs_error"]) == WORLD_SIZE and max(pooled["max_abs_error"]) <= 1e-6
    assert pooled["matches"] is True and "equals the unsharded module's on every rank" in pooled["sentence"]
    places = {p["text"]: p for p in pooled["places"]}
    assert all(p["path"] == "torchrec/distributed/sharding/cw_sharding.py" for p in places.values())
    assert (
        places["PermutePooledEmbeddingsSplit("]["function"] == "CwPooledEmbeddingSharding.create_output_dist"
    )
    assert pooled["sentence"] in run.results["summary"]


def test_uneven_widths_work_in_embnb_and_are_unsupported_in_torchrec(run):
    results = run.results
    assert results["uneven_reference_matches_unsharded"] is True
    assert results["uneven_naive_matches_unsharded"] is False
    assert results["torchrec_size_per_rank"] == [4, 12]
    outcomes = results["torchrec_size_per_rank_outcomes"]
    assert len(outcomes) == WORLD_SIZE
    assert "equals the unsharded EC" not in outcomes and not any(o.startswith("WRONG") for o in outcomes)
    assert any("Split sizes doesn't match" in o and "[in torchrec/distributed/" in o for o in outcomes)
    # each rank holds its size_per_rank entry; torchrec views every rank's lookups as the first shard's width
    assert results["torchrec_size_per_rank_widths"] == [
        {"columns_held": 4, "local_embedding_dim": 4},
        {"columns_held": 12, "local_embedding_dim": 4},
    ]
    assert "(unsupported): failed on 2 of 2 ranks" in results["summary"]
    assert results["torchrec_version"].split(".")[0].isdigit()
    assert results["embnb_uneven_check"].startswith("uneven widths {'t0': [1, 6, 4, 5]}: embnb's check")
    assert "required to have same embedding dimension" in results["torchrec_mixed_dims_error"]


def test_torchrec_places_name_lines_that_say_what_the_notebook_says(run):
    site = pathlib.Path(torchrec.__file__).parent.parent
    wanted = {
        "EmbeddingCollection.__init__": "required to have same embedding dimension",
        "_get_block_size_for_cw_shard": "MIN_CW_DIM",
        "column_wise": "size_per_rank",
        "ShardedEmbeddingCollection.__init__": "CW partition must be same",
        "ShardedEmbeddingCollection.compute_and_output_dist": "view(-1, embedding_dim)",
        "All2All_Seq_Req.forward": "* D",
    }
    places = run.results["torchrec_uneven_places"]
    assert sorted(places) == sorted(wanted)
    for function, where in places.items():
        path, line = where.split(" ")[0].rsplit(":", 1)
        assert where.endswith(f"({function})")
        assert wanted[function] in (site / path).read_text().splitlines()[int(line) - 1], where


def test_figures_and_explorer(run):
    # seed order, lookup errors, bytes per id, uneven widths
    assert len(run.figures()) == 4
    assert run.widgets_shown_by("PlacementExplorer(") == 1


def test_the_page_core_agrees_with_the_library(run):
    # the page's permute and stitch, checked in the notebook on every placement of up to 4 shards on 3 ranks
    assert run.results["page_core_agrees"] == {"permute": True, "stitch": True}

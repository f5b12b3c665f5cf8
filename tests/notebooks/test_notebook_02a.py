"""Notebook 02a (column-wise bytes, uneven widths, the pooled path): one papermill run on 2 gloo ranks.
The expected values follow from the placement by hand, from the batches the notebook's parameters make,
from how torchrec's and embnb's all-to-alls are described (ids and lengths once per shard against a count
per destination and ids once per owner rank, int64; rows fp32), written here as a byte formula of its
own, and from torchrec's installed source."""

import importlib
import inspect

import nbformat
import pytest

from embnb import harness
from embnb.lab.columnwise.cases import CWCase, make_batches

NOTEBOOK = harness.NOTEBOOKS_DIR / "02a_cw_bytes.ipynb"
WORLD_SIZE = 2
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
}


@pytest.fixture(scope="module")
def run(execute):
    return execute("02a_cw_bytes", PARAMETERS)


def _traffic_batches(embedding_dim: int) -> tuple[list[int], int]:
    """(ids per rank, sequences of all ranks) in the notebook's byte count."""
    sizes = {"batch_size": TRAFFIC["traffic_batch_size"], "max_length": TRAFFIC["traffic_max_length"]}
    case = CWCase(
        WORLD_SIZE, embedding_dim, [0, 1], num_embeddings=TRAFFIC["traffic_num_embeddings"], **sizes
    )
    batches = make_batches(case)  # batches: not the layout's
    return [len(ids) for _, ids in batches], sum(len(lengths) for lengths, _ in batches)


def test_the_byte_count_covers_the_teaching_and_the_planner_layouts(run):
    results = run.results
    ids_per_rank, _ = _traffic_batches(48)
    assert results["traffic_ids_per_rank"] == ids_per_rank  # stated per rank, not called "realistic"
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
    """torchrec: 8 B per id and per length, once per shard, plus 3 counts per rank and destination;
    embnb: 8 B per id once per owner rank, plus one count per rank and destination; both: D x 4 B of row
    values per id."""
    traffic = run.results["traffic"]
    for row in traffic:
        dim, shards, owners = row["embedding_dim"], row["shards"], row["owner ranks"]
        ids_per_rank, sequences = _traffic_batches(dim)
        ids = sum(ids_per_rank)
        assert (row["ids"], row["sequences"]) == (ids, sequences)
        assert owners == min(shards, WORLD_SIZE)
        assert row["torchrec int B"] == 8 * (shards * (ids + sequences) + 3 * WORLD_SIZE**2)
        assert row["embnb int B"] == 8 * (owners * ids + WORLD_SIZE**2)
        assert row["torchrec rows B"] == row["embnb rows B"] == 4 * dim * ids
        assert row["torchrec / embnb"] == pytest.approx(row["torchrec B"] / row["embnb B"])
        # per id, torchrec's integers against its rows: about shards x 8 B against D x 4 B
        assert 2 * shards / dim <= row["torchrec int / rows"] < 2 * shards / dim * 1.1
        # embnb's counts travel in an all-to-all of their own: counts, ids, rows
        assert row["embnb all-to-alls"] == 3 and row["torchrec all-to-alls"] >= 2
    assert [row["equals the count"] for row in traffic] == [True] * len(traffic)
    # 2 shards on 2 ranks: both paths send each id twice; the gap is lengths and counts only
    first = traffic[0]
    _, sequences = _traffic_batches(48)
    assert first["torchrec int B"] - first["embnb int B"] == 8 * (2 * sequences + 2 * WORLD_SIZE**2)
    planner = [r for r in traffic if r["source"] == "torchrec planner"]
    assert all(r["torchrec int / rows"] < 0.02 for r in planner)  # 128-column shards: about 2 / 128
    teaching = [r for r in traffic if r["source"] == "teaching"]
    assert teaching[-1]["torchrec int / rows"] > 0.25  # 6 shards of 8 columns: 2 / 8


def test_at_8_ranks_the_planner_puts_each_shard_on_its_own_rank(run):
    """The count at W = 8 with torchrec's own layouts, by the byte formula of this file: distinct owner
    ranks, so both paths send each id once per shard and differ by torchrec's lengths and counts."""
    counted = run.results["planner_bytes_at"]
    ids_per_rank, _ = _traffic_batches(256)
    w = counted["world_size"]
    assert w == 8 and counted["ids_per_rank"] == round(sum(ids_per_rank) / WORLD_SIZE)
    ids, sequences = counted["ids_per_rank"] * w, counted["sequences_per_rank"] * w
    assert [r["embedding_dim"] for r in counted["rows"]] == PLANNER_DIMS
    for row in counted["rows"]:
        dim = row["embedding_dim"]
        shards = dim // 128  # 128-column blocks, by hand
        assert row["shard widths"] == [128] * shards
        assert sorted(row["shard ranks"]) == list(range(shards)) and row["owner ranks"] == shards
        torchrec = 8 * (shards * (ids + sequences) + 3 * w**2) + 4 * dim * ids
        embnb = 8 * (shards * ids + w**2) + 4 * dim * ids
        assert (row["torchrec B"], row["embnb B"]) == (torchrec, embnb)
        assert row["torchrec / embnb"] == pytest.approx(torchrec / embnb)
    assert "finding" not in counted  # a count, not a headline


def test_uneven_widths_work_in_embnb_and_are_unsupported_in_torchrec(run):
    results = run.results
    assert results["uneven_reference_matches_unsharded"] is True and results["uneven_max_abs_error"] == 0.0
    assert results["uneven_naive_matches_unsharded"] is False
    outcomes = results["torchrec_size_per_rank_outcomes"]
    assert len(outcomes) == WORLD_SIZE and all(o["error"] and o["matches"] is None for o in outcomes)
    assert any("Split sizes doesn't match" in o["error"] for o in outcomes)
    assert all(o["raised_in"].startswith("torchrec/distributed/") for o in outcomes)
    # each rank holds its size_per_rank entry; torchrec views every rank's lookups as the first shard's width
    assert [(o["own_width"], o["local_embedding_dim"]) for o in outcomes] == [(4, 4), (12, 4)]
    assert results["torchrec_version"].split(".")[0].isdigit()
    assert results["embnb_uneven_check"].startswith("uneven widths {'t0': [1, 6, 4, 5]}: embnb's check")
    assert "required to have same embedding dimension" in results["torchrec_mixed_dims_error"]


# Each step the page's table names, as (module, function, text) of the installed torchrec: where its
# EmbeddingCollection meets uneven column-wise widths, in order; then where the pooled path permutes.
EC, PLAN, CW = (
    "torchrec.distributed.embedding",
    "torchrec.distributed.sharding_plan",
    "torchrec.distributed.sharding.cw_sharding",
)
STEPS = [
    ("torchrec.modules.embedding_modules", "EmbeddingCollection.__init__", "required to have same embedding"),
    (PLAN, "_get_block_size_for_cw_shard", "_find_base_dim(MIN_CW_DIM, columns)"),
    (PLAN, "column_wise", "for rank, cur_size in enumerate(size_per_rank):"),
    (EC, "ShardedEmbeddingCollection.__init__", "CW partition must be same for all CW sharded parameters"),
    (EC, "ShardedEmbeddingCollection.compute_and_output_dist", "odist(embs.view(-1, embedding_dim)"),
    ("torchrec.distributed.comm_ops", "All2All_Seq_Req.forward", "input_splits = [i * D for i in a2ai"),
    (CW, "BaseCwEmbeddingSharding._init_combined_embeddings", "embedding_order.extend("),
    (CW, "CwPooledEmbeddingSharding.create_output_dist", "PermutePooledEmbeddingsSplit("),
]


@pytest.mark.parametrize("module, function, text", STEPS)
def test_each_torchrec_function_the_page_names_does_what_it_says(module, function, text):
    obj = importlib.import_module(module)
    for part in function.split("."):
        obj = getattr(obj, part)
    assert text in inspect.getsource(obj)
    markdown = "".join(
        c.source for c in nbformat.read(str(NOTEBOOK), as_version=4).cells if c.cell_type == "markdown"
    )
    assert f"`{function.split('.')[-1]}" in markdown or f"`{function}`" in markdown


def test_summary_and_figures(run):
    results = run.results
    summary = results["summary"]  # the headline as data: each value read back from its field
    every_count = all(row["equals the count"] for row in results["traffic"])
    assert summary["counted bytes equal the per-id count"] is every_count
    assert summary["uneven widths, embnb's path exact"] is results["uneven_reference_matches_unsharded"]
    assert summary["pooled path exact"] is results["pooled"]["matches"]
    # torchrec's pooled path puts its rank-ordered shards back itself: equal to the unsharded module
    assert run.results["pooled"]["matches"] is True and run.results["pooled"]["shard_ranks"] == [1, 0, 0, 1]
    assert len(run.figures()) == 2  # integer share per layout, uneven widths

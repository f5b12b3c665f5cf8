"""Notebook 02 (column-wise permute indices, teaching path): one papermill run on 2 gloo ranks with a
placement other than the default. The expected values follow from the placement by hand and from the
batches the notebook's parameters make; tests/lab/columnwise/ tests its figures and widget."""

import pytest

from embnb.lab.columnwise.cases import CWCase, make_batches

WORLD_SIZE, EMBEDDING_DIM, RANKS = 2, 16, [1, 0, 0, 1]
PARAMETERS = {"world_size": WORLD_SIZE, "embedding_dim": EMBEDDING_DIM, "shard_ranks": RANKS}


@pytest.fixture(scope="module")
def run(execute):
    return execute("02_cw_permute_indices", PARAMETERS)


def test_torchrec_is_exact_with_its_permute_and_wrong_without_it(run):
    results = run.results
    assert (results["device"], results["backend"], results["compute_kernel"]) == ("cpu", "gloo", "fused")
    assert results["torchrec_version"].split(".")[0].isdigit() and results["torchrec_skipped"] is None
    # by hand: ranks [1, 0, 0, 1] arrive as s1, s2 (rank 0), s0, s3 (rank 1)
    assert results["rank_order"] == [1, 2, 0, 3]
    assert results["permute_indices"] == [2, 0, 1, 3]
    assert results["torchrec_permute_indices"] == [[2, 0, 1, 3]] * WORLD_SIZE
    checks = {c["path"]: c for c in results["checks"]}
    assert sorted(checks) == ["naive", "reference", "torchrec", "torchrec_unpermuted"]
    for path in ("reference", "torchrec"):
        assert (checks[path]["equals_unsharded"], checks[path]["max_abs_error"]) == (True, 0.0)
    # torchrec without its permute returns exactly what naive concatenation does
    assert checks["torchrec_unpermuted"]["equals_unsharded"] is False
    assert checks["naive"]["equals_unsharded"] is False and checks["naive"]["max_abs_error"] > 0
    assert checks["torchrec_unpermuted"]["max_abs_error"] == checks["naive"]["max_abs_error"]


def test_the_ids_per_rank_are_the_batches_the_parameters_make(run):
    case = CWCase(WORLD_SIZE, EMBEDDING_DIM, RANKS)
    assert run.results["ids_per_rank"] == [len(ids) for _, ids in make_batches(case)]


def test_only_the_misplaced_shards_columns_are_wrong(run):
    """Arrival positions [2, 0, 1, 3] against column positions 0..3: s0, s1, s2 (columns 0-11) land in the
    wrong place, s3 (columns 12-15) in the right one; every looked-up id's row differs in its own columns,
    so all twelve show an error (a zero-width miss is not possible with random fp32 weights)."""
    wrong = run.results["wrong_columns"]
    assert len(wrong) == 2 and all(columns == list(range(12)) for columns in wrong.values())


def test_the_plan_a_job_writes_puts_each_shard_on_its_rank(run):
    assert run.results["plan_ranks"] == RANKS
    assert run.results["plan_first_columns"] == [0, 4, 8, 12]


def test_the_page_core_agrees_with_the_library(run):
    # the page's permute and stitch, checked in the notebook on every placement of up to 4 shards on 3 ranks
    assert run.results["page_core_agrees"] == {"permute": True, "stitch": True}


def test_the_summary_the_key_figure_the_error_figure_and_the_explorer(run):
    results = run.results
    summary = results["summary"]  # the headline as data: each value read back from its field
    assert summary["shard_ranks"] == results["plan_ranks"] == RANKS  # torchrec's plan puts the shards there
    assert summary["permute"] == results["permute_indices"]
    checks = {c["path"]: c["equals_unsharded"] for c in results["checks"]}
    exact = {"naive": False, "reference": True, "torchrec": True, "torchrec_unpermuted": False}
    assert summary["equal to the unsharded EmbeddingCollection"] == checks == exact
    assert len(run.figures()) == 2  # the column order (key), the lookup error
    assert (run.out / "02_cw_permute_indices_key.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run.widgets_shown_by("PlacementExplorer(") == 1

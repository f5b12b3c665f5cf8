"""Notebook 02 (column-wise permute indices): its conventions and a real
papermill run on 2 gloo ranks with a placement other than the default. Its
figures and widget are tested in tests/columnwise/."""

import json
import pathlib

from embnb import harness

NOTEBOOK = harness.NOTEBOOKS_DIR / "02_cw_permute_indices.ipynb"


def test_committed_notebook_follows_the_conventions():
    assert harness.notebook_problems(NOTEBOOK) == []


def test_notebook_runs_on_real_ranks(tmp_path):
    params = {
        "world_size": 2,
        "embedding_dim": 16,
        "shard_ranks": [1, 0, 0, 1],
        "uneven_widths": [1, 6, 4, 5],
        "device": "cpu",
    }
    results = harness.run_notebook(NOTEBOOK, tmp_path, params, cell_timeout_s=300)
    assert results == json.loads((tmp_path / "02_cw_permute_indices.json").read_text())
    assert isinstance(results["summary"], str) and "\n" not in results["summary"]
    assert (results["backend"], results["compute_kernel"]) == ("gloo", "fused")
    assert results["rank_order"] == [1, 2, 0, 3]
    assert results["permute_indices"] == [2, 0, 1, 3]
    assert results["torchrec_permute_indices"] == [[2, 0, 1, 3]] * 2
    assert results["torchrec_permute_matches"] is True
    assert results["reference_matches_unsharded"] is True
    assert results["torchrec_matches_unsharded"] is True
    assert results["naive_matches_unsharded"] is False and results["naive_max_abs_error"] > 0
    assert results["uneven_reference_matches_unsharded"] is True
    assert results["torchrec_skipped"] is None
    assert sum(results["ids_per_rank"]) > 0  # something was looked up
    figures = sorted(pathlib.Path(tmp_path).glob("02_cw_permute_indices_fig*.png"))
    assert len(figures) == 3  # seed order, lookup errors, uneven widths

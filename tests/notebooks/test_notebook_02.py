"""Notebook 02 (column-wise permute indices): a real papermill run on 2 gloo
ranks with a placement other than the default. Its figures and widget are
tested in tests/columnwise/."""

import json


def test_notebook_runs_on_real_ranks(execute):
    params = {
        "world_size": 2,
        "embedding_dim": 16,
        "shard_ranks": [1, 0, 0, 1],
        "uneven_widths": [1, 6, 4, 5],
    }
    run = execute("02_cw_permute_indices", params)
    results = run.results
    assert results == json.loads((run.out / "02_cw_permute_indices.json").read_text())
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
    assert len(run.figures()) == 3  # seed order, lookup errors, uneven widths
    assert run.widgets_shown_by("PlacementExplorer(") == 1

"""Notebook 02 (column-wise permute indices): its figures, its widget, and a
real papermill run on 2 gloo ranks with a placement other than the default."""

import json
import pathlib

import pytest
import torch
from matplotlib.figure import Figure

from embnb import harness
from embnb.columnwise import plots as cw_plots
from embnb.columnwise.widgets import PlacementExplorer, parse_ints

NOTEBOOK = harness.NOTEBOOKS_DIR / "02_cw_permute_indices.ipynb"


def _titles(fig: Figure) -> list[str]:
    return [ax.get_title(loc="left") for ax in fig.axes]


def test_column_order_figure_marks_naive_wrong_only_for_unsorted_ranks():
    unsorted = cw_plots.column_order_figure([1, 0, 0, 1], [1, 3, 2, 2])
    assert isinstance(unsorted, Figure) and len(unsorted.axes) == 3
    assert "WRONG" in _titles(unsorted)[1] and "[2, 0, 1, 3]" in _titles(unsorted)[2]
    # The strips hold source columns: the naive strip is the arrival order.
    naive = unsorted.axes[1].images[0].get_array().ravel().tolist()
    assert naive == [1, 2, 3, 4, 5, 0, 6, 7]
    assert unsorted.axes[2].images[0].get_array().ravel().tolist() == list(range(8))
    assert "WRONG" not in _titles(cw_plots.column_order_figure([0, 0, 1], [4, 4, 4]))[1]


def test_lookup_error_figure_and_its_bad_input():
    errors = {"naive": torch.rand(5, 12), "embnb": torch.zeros(5, 12)}
    fig = cw_plots.lookup_error_figure(errors, [0, 4, 8], title="t")
    assert [t.split(":")[0] for t in _titles(fig) if t] == ["naive", "embnb"]
    assert "(exact)" in _titles(fig)[1]
    with pytest.raises(ValueError, match="errors is empty"):
        cw_plots.lookup_error_figure({})
    with pytest.raises(ValueError, match=r"one shape, got shapes \[\(2, 3\), \(2, 4\)\]"):
        cw_plots.lookup_error_figure({"a": torch.zeros(2, 3), "b": torch.zeros(2, 4)})


def test_placement_explorer_redraws_and_shows_errors():
    explorer = PlacementExplorer("0, 1, 0", world_size=2, embedding_dim=12)
    assert explorer.permute == [0, 2, 1] and isinstance(explorer.figure, Figure)
    explorer.shard_ranks.value = "1, 0, 0, 1"
    assert explorer.permute == [2, 0, 1, 3] and explorer.error is None
    explorer.widths.value = "1 3 2 6"
    assert explorer.figure.axes[0].images[0].get_array().size == 12
    explorer.widths.value = "1 3 2 2"
    assert (
        explorer.figure is None and "widths [1, 3, 2, 2] sum to 8, not the embedding_dim 12" in explorer.error
    )
    explorer.widths.value = ""
    explorer.shard_ranks.value = "0, 4"
    assert "rank 4 >= world_size 2" in explorer.error
    with pytest.raises(ValueError, match="shard_ranks '0, x' is not a list of integers"):
        parse_ints("0, x", "shard_ranks")


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

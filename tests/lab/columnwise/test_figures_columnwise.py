"""embnb.lab.columnwise.figures: what the figures draw, checked against the placement."""

import pytest
import torch
from matplotlib.figure import Figure

from embnb.lab.columnwise import figures


def _titles(fig: Figure) -> list[str]:
    return [ax.get_title(loc="left") for ax in fig.axes]


def test_column_order_figure_marks_naive_wrong_only_for_unsorted_ranks():
    unsorted = figures.column_order_figure([1, 0, 0, 1], [1, 3, 2, 2])
    assert isinstance(unsorted, Figure) and len(unsorted.axes) == 3
    assert "WRONG" in _titles(unsorted)[1] and "[2, 0, 1, 3]" in _titles(unsorted)[2]
    # The strips hold source columns: the naive strip is the arrival order.
    naive = unsorted.axes[1].images[0].get_array().ravel().tolist()
    assert naive == [1, 2, 3, 4, 5, 0, 6, 7]
    assert unsorted.axes[2].images[0].get_array().ravel().tolist() == list(range(8))
    assert "WRONG" not in _titles(figures.column_order_figure([0, 0, 1], [4, 4, 4]))[1]


def test_lookup_error_figure_and_its_bad_input():
    errors = {"naive": torch.rand(5, 12), "embnb": torch.zeros(5, 12)}
    fig = figures.lookup_error_figure(errors, [0, 4, 8], title="t")
    assert [t.split(":")[0] for t in _titles(fig) if t] == ["naive", "embnb"]
    assert "(exact)" in _titles(fig)[1]
    with pytest.raises(ValueError, match="errors is empty"):
        figures.lookup_error_figure({})
    with pytest.raises(ValueError, match=r"one shape, got shapes \[\(2, 3\), \(2, 4\)\]"):
        figures.lookup_error_figure({"a": torch.zeros(2, 3), "b": torch.zeros(2, 4)})


def test_shard_labels_take_their_ranks_colour():
    fig = figures.column_order_figure([1, 0, 0, 1], [3, 3, 3, 3])
    labels = fig.axes[0].get_xticklabels()  # s0..s3 in column order, on ranks 1, 0, 0, 1
    colors = [label.get_color() for label in labels]
    assert colors[0] == colors[3] != colors[1] == colors[2]


def test_lookup_error_figure_labels_ranks_on_the_y_axis():
    fig = figures.lookup_error_figure({"naive": torch.rand(8, 4)}, rows_per_rank=[5, 3])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert list(ax.get_yticks()) == [2.0, 6.0]  # the middle of rows 0-4 and 5-7
    assert [line.get_ydata()[0] for line in ax.lines if line.get_linestyle() == "-"] == [4.5]

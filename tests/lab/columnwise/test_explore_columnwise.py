"""embnb.lab.columnwise.explore.PlacementExplorer, driven headlessly: every
control redraws the figure for its new setting; bad values show their error."""

import pytest

from embnb.lab.columnwise.explore import PlacementExplorer, parse_ints


def title(explorer) -> str:
    return explorer.figure._suptitle.get_text()


def strip(explorer, i: int) -> list[int]:
    """The source columns drawn in strip i (0 unsharded, 1 naive, 2 permuted)."""
    return [int(v) for v in explorer.figure.axes[i].images[0].get_array().ravel().tolist()]


def test_the_first_draw_states_its_settings():
    explorer = PlacementExplorer("0, 1, 0", world_size=2, embedding_dim=12)
    assert explorer.error is None and explorer.draws == 1
    assert title(explorer).startswith("shard_ranks [0, 1, 0] on 2 ranks, embedding_dim 12, widths [4, 4, 4]")
    assert "permute [0, 2, 1]" in title(explorer)
    assert strip(explorer, 1) == [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7]  # s0, s2, s1 as they arrive


def test_shard_ranks_widths_and_the_embedding_dim_redraw():
    explorer = PlacementExplorer("0, 1, 0", world_size=2, embedding_dim=12)
    explorer.controls["shard_ranks"].value = "1, 0, 0, 1"
    assert explorer.error is None and "permute [2, 0, 1, 3]" in title(explorer)
    # 4 shards of 3 columns; arrival: rank 0's s1, s2, then rank 1's s0, s3
    assert strip(explorer, 1) == [3, 4, 5, 6, 7, 8, 0, 1, 2, 9, 10, 11]
    assert strip(explorer, 2) == list(range(12))
    explorer.controls["widths"].value = "1 3 2 6"
    assert explorer.error is None and "widths [1, 3, 2, 6]" in title(explorer)
    # arrival: rank 0's s1 (columns 1-3) and s2 (4-5), then rank 1's s0 (0) and s3 (6-11)
    assert strip(explorer, 1) == [1, 2, 3, 4, 5, 0, 6, 7, 8, 9, 10, 11]
    explorer.controls["widths"].value = ""
    explorer.controls["embedding_dim"].value = 8
    assert explorer.error is None and "embedding_dim 8, widths [2, 2, 2, 2]" in title(explorer)
    assert len(strip(explorer, 0)) == 8
    explorer.controls["embedding_dim"].value = 10  # 10 columns do not split into 4 equal shards
    assert explorer.error.startswith("ValueError: embedding_dim 10 is not divisible into 4")
    assert explorer.controls["embedding_dim"].style.description_width == "initial"  # the label is never cut


def test_world_size_redraws_and_a_rank_beyond_it_shows_the_error():
    explorer = PlacementExplorer("0, 3", world_size=4, embedding_dim=12)
    assert "on 4 ranks" in title(explorer)
    explorer.controls["world_size"].value = 5
    assert explorer.error is None and "on 5 ranks" in title(explorer)
    explorer.controls["world_size"].value = 2
    assert explorer.error.startswith("ValueError: shard_ranks [0, 3] has rank 3 >= world_size 2")
    assert "rank 3 &gt;= world_size 2" in explorer.status.value


@pytest.mark.parametrize(
    "control, value, message",
    [
        ("shard_ranks", "0, x", "ValueError: shard_ranks '0, x' is not a list of integers like '0, 1, 0'"),
        ("shard_ranks", "", "ValueError: shard_ranks is empty"),
        ("shard_ranks", "0, -1", "ValueError: shard_ranks [0, -1]: the rank of shard 1 must be an int >= 0"),
        ("widths", "1 3", "ValueError: widths [1, 3] has 2 entries for 3 shards"),
        ("widths", "4 4 0", "ValueError: widths [4, 4, 0]: the width of shard 2 must be an int >= 1, got 0"),
    ],
)
def test_a_bad_value_shows_its_error_instead_of_raising(control, value, message):
    explorer = PlacementExplorer("0, 1, 0", world_size=2, embedding_dim=12)
    good = explorer.figure
    explorer.controls[control].value = value
    assert explorer.error.startswith(message)
    assert explorer.figure is good  # the last good figure stays; the output shows the error


def test_parse_ints():
    assert parse_ints("1, 0,0 1", "shard_ranks") == [1, 0, 0, 1]
    with pytest.raises(ValueError, match="widths '1 a' is not a list of integers"):
        parse_ints("1 a", "widths")

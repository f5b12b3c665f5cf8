"""embnb.lab.columnwise.torchrec_layouts and traffic.wire_bytes: torchrec's
planner layouts against the block rule written out by hand, the source
places against the installed files, and the byte count against a hand count."""

import pathlib

import pytest
import torchrec

from embnb.lab.columnwise import torchrec_layouts
from embnb.lab.columnwise.traffic import wire_bytes


def _block_by_hand(dim: int, minimum: int = 128) -> int:
    # the narrowest width >= minimum that is a multiple of 4 and divides dim, else dim
    return next((w for w in range(minimum, dim) if dim % w == 0 and w % 4 == 0), dim)


@pytest.mark.parametrize("dim", [256, 384, 1000, 200, 96])
def test_planner_layouts_follow_torchrecs_block_rule(dim):
    layout = torchrec_layouts.planner_cw_layout(dim, 100, 2)
    block = _block_by_hand(dim)
    assert layout.embedding_dim == dim
    assert layout.widths == [block] * (dim // block)
    assert len(layout.ranks) == len(layout.widths) and set(layout.ranks) <= {0, 1}


def test_min_cw_dim_is_torchrecs_constant():
    assert torchrec_layouts.torchrec_min_cw_dim() == 128  # torchrec 1.8.0, planner/constants.py


def test_source_places_point_at_lines_holding_their_text():
    site = pathlib.Path(torchrec.__file__).parent.parent
    places = torchrec_layouts.source_places(
        torchrec_layouts.UNEVEN_EC_STEPS + torchrec_layouts.POOLED_PERMUTE_STEPS
    )
    assert len(places) == 8
    for place in places:
        assert place.path.startswith("torchrec/") and place.line > 0, place
        assert place.text in (site / place.path).read_text().splitlines()[place.line - 1]
    missing = torchrec_layouts.source_place(
        "torchrec.distributed.embedding", "ShardedEmbeddingCollection", "xyzzy"
    )
    assert (missing.path, missing.line) == ("", 0) and "not found" in missing.where


def test_mixed_dims_error_is_torchrecs_own():
    message = torchrec_layouts.mixed_dims_error((4, 8))
    assert message.startswith("ValueError: All tables in a EmbeddingCollection")
    assert torchrec_layouts.mixed_dims_error((8, 8)).startswith("no error")


def test_wire_bytes_by_hand():
    # 3 shards on 2 ranks of 2, 10 ids in 4 sequences, 12 columns
    count = wire_bytes(3, 2, 12, ids=10, sequences=4, world_size=2)
    assert (count.torchrec_ids, count.torchrec_lengths, count.torchrec_splits) == (240, 96, 96)
    assert (count.embnb_ids, count.embnb_counts, count.rows) == (160, 32, 480)
    assert (count.torchrec, count.embnb) == (912, 672)
    with pytest.raises(ValueError, match="owner_ranks 3 > min"):
        wire_bytes(3, 3, 12, ids=10, sequences=4, world_size=2)

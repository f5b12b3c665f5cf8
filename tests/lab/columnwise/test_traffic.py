"""embnb.lab.columnwise.traffic: torchrec's planner layouts against the block rule written out by
hand, its error for mixed widths, and the byte count against a hand count."""

import pytest

from embnb.lab.columnwise.traffic import mixed_dims_error, planner_cw_layout, wire_bytes


def _block_by_hand(dim: int, minimum: int = 128) -> int:
    # the narrowest width >= minimum that is a multiple of 4 and divides dim, else dim
    return next((w for w in range(minimum, dim) if dim % w == 0 and w % 4 == 0), dim)


@pytest.mark.parametrize("dim", [256, 384, 1000, 200, 96])
def test_planner_layouts_follow_torchrecs_block_rule(dim):
    layout = planner_cw_layout(dim, 100, 2)
    block = _block_by_hand(dim)
    assert layout.embedding_dim == dim
    assert layout.widths == [block] * (dim // block)
    assert len(layout.ranks) == len(layout.widths) and set(layout.ranks) <= {0, 1}


def test_mixed_dims_error_is_torchrecs_own():
    message = mixed_dims_error((4, 8))
    assert message.startswith("ValueError: All tables in a EmbeddingCollection")
    assert mixed_dims_error((8, 8)).startswith("no error")


def test_wire_bytes_by_hand():
    # 3 shards on 2 ranks of 2, 10 ids in 4 sequences, 12 columns
    count = wire_bytes(3, 2, 12, ids=10, sequences=4, world_size=2)
    # torchrec: 3 x 10 ids + 3 x 4 lengths + 3 x 4 split counts; embnb: 2 x 10 ids + 4 counts; int64
    assert (count["torchrec_ints"], count["embnb_ints"], count["rows"]) == (240 + 96 + 96, 160 + 32, 480)
    assert (count["torchrec"], count["embnb"]) == (912, 672)
    with pytest.raises(ValueError, match="owner_ranks 3 > min"):
        wire_bytes(3, 3, 12, ids=10, sequences=4, world_size=2)

"""embnb.columnwise.placement: permute indices, arrival order, widths, stitching.

Checked with hypothesis against definitions written out here and against
torchrec's own permute code.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec import EmbeddingConfig
from torchrec.distributed.types import ParameterSharding

from embnb._torchrec_private import generate_permute_indices
from embnb.columnwise import placement


@st.composite
def placements(draw, max_world_size=4, max_shards=6):
    world_size = draw(st.integers(1, max_world_size))
    ranks = draw(st.lists(st.integers(0, world_size - 1), min_size=1, max_size=max_shards))
    return world_size, ranks


def expected_permute(ranks):
    """Shard s lands after every shard on a lower rank and every earlier shard on its rank."""
    return [
        sum(r < ranks[s] for r in ranks) + sum(ranks[t] == ranks[s] for t in range(s))
        for s in range(len(ranks))
    ]


def torchrec_permute(ranks):
    """torchrec's own permute code, on a plan with one CW table."""
    config = EmbeddingConfig(name="t0", embedding_dim=len(ranks), num_embeddings=4, feature_names=["f0"])
    plan = {"t0": ParameterSharding(sharding_type="column_wise", compute_kernel="fused", ranks=list(ranks))}
    return generate_permute_indices([config], plan)["f0"]


def test_seed_example():
    assert placement.cw_permute_indices([0, 1, 0]) == [0, 2, 1]
    assert placement.rank_order([0, 1, 0]) == [0, 2, 1]
    # [0, 1, 0] hides that the permute is the inverse of the arrival order:
    assert placement.cw_permute_indices([1, 0, 0, 1]) == [2, 0, 1, 3]
    assert placement.rank_order([1, 0, 0, 1]) == [1, 2, 0, 3]


@settings(deadline=None)  # CI machines are shared; timing is not what is tested
@given(placements())
def test_permute_matches_definition_and_torchrec(drawn):
    world_size, ranks = drawn
    permute = placement.cw_permute_indices(ranks, world_size)
    assert permute == expected_permute(ranks) == torchrec_permute(ranks)
    order = placement.rank_order(ranks)
    assert [order[p] for p in permute] == list(range(len(ranks)))  # inverses
    assert (permute == list(range(len(ranks)))) == (ranks == sorted(ranks))


@st.composite
def sharded_rows(draw):
    world_size, ranks = draw(placements())
    widths = draw(st.lists(st.integers(1, 4), min_size=len(ranks), max_size=len(ranks)))
    num_rows = draw(st.integers(0, 3))
    return world_size, ranks, widths, num_rows


@settings(deadline=None)
@given(sharded_rows())
def test_stitch_undoes_rank_order_for_any_widths(case):
    world_size, ranks, widths, num_rows = case
    dim = sum(widths)
    rows = torch.arange(num_rows * dim, dtype=torch.float32).view(num_rows, dim)
    shards = torch.split(rows, widths, dim=1)
    # What ranks send back: rank 0's shards in column order, then rank 1's, ...
    arrived = [shards[s] for r in range(world_size) for s in range(len(ranks)) if ranks[s] == r]
    assert [
        torch.equal(a, b) for a, b in zip(arrived, placement.rank_ordered_shard_outputs(rows, ranks, widths))
    ] == [True] * len(ranks)
    assert torch.equal(placement.stitch_cw(arrived, ranks), rows)
    if num_rows:  # distinct values: naive concatenation is right only for sorted ranks
        assert torch.equal(placement.concat_in_rank_order(arrived), rows) == (ranks == sorted(ranks))


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: placement.cw_permute_indices([0, 4, 0], world_size=4),
            r"shard_ranks \[0, 4, 0\] has rank 4 >= world_size 4; ranks must be in 0..3",
        ),
        (lambda: placement.cw_permute_indices([]), "shard_ranks is empty"),
        (
            lambda: placement.cw_permute_indices([0, -1]),
            r"shard_ranks \[0, -1\]: the rank of shard 1 must be an int >= 0, got -1",
        ),
        (
            lambda: placement.check_widths([4, 4, 3], 12, 3),
            r"widths \[4, 4, 3\] sum to 11, not the embedding_dim 12",
        ),
        (lambda: placement.check_widths([6, 6], 12, 3), r"widths \[6, 6\] has 2 entries for 3 shards"),
        (
            lambda: placement.check_widths([12, 0], 12),
            r"widths \[12, 0\]: the width of shard 1 must be an int >= 1, got 0",
        ),
        (lambda: placement.check_widths([], 12), "widths is empty"),
        (lambda: placement.equal_widths(0, 3), "embedding_dim must be an int >= 1, got 0"),
        (lambda: placement.equal_widths(10, 3), "embedding_dim 10 is not divisible into 3 equal shards"),
        (
            lambda: placement.stitch_cw([torch.zeros(2, 1)] * 2, [0, 1, 0]),
            r"got 2 shard outputs for shard_ranks \[0, 1, 0\] \(3 shards\)",
        ),
    ],
)
def test_bad_value_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: placement.cw_permute_indices("010"),
            "shard_ranks must be a list with a rank per shard, got str '010'",
        ),
        (
            lambda: placement.cw_permute_indices([0, True]),
            r"the rank of shard 1 must be an int >= 0, got bool True",
        ),
        (
            lambda: placement.cw_permute_indices([0], world_size=2.0),
            "world_size must be an int >= 1, got float",
        ),
        (lambda: placement.check_widths(12, 12), "widths must be a list with a width per shard, got int 12"),
        (
            lambda: placement.check_widths([6.0, 6], 12),
            r"the width of shard 0 must be an int >= 1, got float 6.0",
        ),
        (lambda: placement.equal_widths(12, True), "num_shards must be an int >= 1, got bool True"),
    ],
)
def test_bad_type_is_named(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_column_offsets():
    assert placement.column_offsets([2, 7, 3]) == [0, 2, 9]
    assert placement.column_offsets([5]) == [0]


@given(placements(), st.data())
@settings(max_examples=60, deadline=None)
def test_a_readers_permute_answer_is_checked(drawn, data):
    _, ranks = drawn
    right = expected_permute(ranks)
    assert placement.check_permute_answer(ranks, right) == f"correct: permute {right}"
    assert placement.check_permute_answer(ranks, None).startswith("write your permute")
    assert "need" in placement.check_permute_answer(ranks, right + [0])
    if len(ranks) > 1:
        wrong = data.draw(st.permutations(right).filter(lambda p: list(p) != right))
        message = placement.check_permute_answer(ranks, wrong)
        first = next(s for s in range(len(ranks)) if wrong[s] != right[s])
        # the hint names the first wrong shard and the counts that place it
        lower = sum(r < ranks[first] for r in ranks)
        assert message.startswith(f"not yet: shard s{first} (rank {ranks[first]}) comes after the {lower} ")
        assert message.endswith(f"not at position {wrong[first]}")

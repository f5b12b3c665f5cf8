"""embnb.rowwise.reference (plain-int routing, shown in notebook 01) against
the tensor fast path embnb.rowwise.routing uses."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from embnb.rowwise import reference
from embnb.rowwise.routing import hash_key, owner_rank

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(INT64, min_size=1, max_size=50), world_size=st.integers(1, 1024))
def test_plain_int_routing_matches_the_tensor_path(keys, world_size):
    tensor = torch.tensor(keys, dtype=torch.int64)
    hashes = hash_key(tensor).tolist()
    assert [reference.fmix64(k) for k in keys] == [h & reference.MASK64 for h in hashes]
    for mode in ("roundrobin", "hash_roundrobin"):
        want = owner_rank(tensor, world_size, mode).tolist()
        assert [reference.owner_of(k, world_size, mode) for k in keys] == want, mode


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=50),
    world_size=st.integers(1, 64),
    block_size=st.integers(1, 10**6),
)
def test_plain_int_continuous_routing_matches_the_tensor_path(keys, world_size, block_size):
    want = owner_rank(torch.tensor(keys), world_size, "continuous", block_size).tolist()
    assert [reference.owner_of(k, world_size, "continuous", block_size) for k in keys] == want


def test_fmix64_spreads_the_bits_of_small_keys():
    # 0 is fmix64's fixed point; any other key's hash sets high bits too
    assert reference.fmix64(0) == 0
    assert all(reference.fmix64(k) >> 32 for k in range(1, 100))


def test_unknown_dist_type_is_named():
    import pytest

    with pytest.raises(ValueError, match="dist_type 'modulo' is not one of"):
        reference.owner_of(5, 4, "modulo")

"""embnb.lab.rowwise.core (the jump hash, notebook 01's page check) and the tests' plain-int fmix64 and
owner (tests/lab/rowwise/plain_routing.py) against the tensor path embnb.rowwise.routing uses."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from embnb.lab.rowwise import core as reference
from embnb.rowwise.routing import bucketize, hash_key, owner_rank
from tests.lab.rowwise.plain_routing import MASK64, fmix64, owner_of

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(INT64, min_size=1, max_size=50), world_size=st.integers(1, 1024))
def test_plain_int_routing_matches_the_tensor_path(keys, world_size):
    tensor = torch.tensor(keys, dtype=torch.int64)
    hashes = hash_key(tensor).tolist()
    assert [fmix64(k) for k in keys] == [h & MASK64 for h in hashes]
    for mode in ("roundrobin", "hash_roundrobin"):
        want = owner_rank(tensor, world_size, mode).tolist()
        assert [owner_of(k, world_size, mode) for k in keys] == want, mode


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=50),
    world_size=st.integers(1, 64),
    block_size=st.integers(1, 10**6),
)
def test_plain_int_continuous_routing_matches_the_tensor_path(keys, world_size, block_size):
    want = owner_rank(torch.tensor(keys), world_size, "continuous", block_size).tolist()
    assert [owner_of(k, world_size, "continuous", block_size) for k in keys] == want


def test_fmix64_spreads_the_bits_of_small_keys():
    # 0 is fmix64's fixed point; any other key's hash sets high bits too
    assert fmix64(0) == 0
    assert all(fmix64(k) >> 32 for k in range(1, 100))


def test_unknown_dist_type_is_named():
    import pytest

    with pytest.raises(ValueError, match="dist_type 'modulo' is not one of"):
        owner_of(5, 4, "modulo")


# fmix64 of each key, computed outside this project: with mmh3 5.3.1 (PyPI, a
# C binding of Austin Appleby's MurmurHash3.cpp). MurmurHash3_x64_128 of an
# 8-byte key with seed 0 ends with h1 = fmix64(x) + fmix64(x + 8) and
# h2 = h1 + fmix64(x + 8), where x is set by the key; choosing the key as the
# inverse of the tail mix for x gives fmix64(x) = 2 * h1 - h2 (mod 2**64):
#     k1 = rotr((((x - 8) ^ 8) * inverse(c2)) mod 2**64, 31) * inverse(c1)
#     h = mmh3.hash128(k1.to_bytes(8, "little"), 0, True, False)
#     fmix64(x) = (2 * (h & MASK64) - (h >> 64)) & MASK64
GOLDEN_FMIX64 = [
    (0x0, 0x0000000000000000),
    (0x1, 0xB456BCFC34C2CB2C),
    (0x2, 0x3ABF2A20650683E7),
    (0x3, 0x0B5181C509F8D8CE),
    (0x7, 0x740729CBE468D1DD),
    (0x8, 0x46ABCCA593A3C687),
    (0xFF, 0x1200A2A61D248B28),
    (0x3039, 0x17D2ABFBF90BAEF9),
    (0x7FFFFFFF, 0x8A662C1A93A26B91),
    (0x100000000, 0xBA3A9E160A5F1419),
    (0x100000001, 0x0AD0F115ABD5E507),
    (0x4000000000000000, 0x6554A70955A989A0),
    (0x7FFFFFFFFFFFFFFF, 0xABB93DF0A930EDEA),
    (0x8000000000000000, 0x8F780810AF31A493),
    (0xFFFFFFFFFFFFFFFF, 0x64B5720B4B825F21),
    (0xDEADBEEFCAFEBABE, 0x7082995008F0C48C),
    (0x189E8399DEE6CD15, 0x0AFE914E92716D23),  # a snowflake-style id
]


def _as_int64(unsigned: int) -> int:
    return unsigned - (1 << 64) if unsigned >> 63 else unsigned


def test_fmix64_equals_murmurhash3_as_mmh3_computes_it():
    keys = [k for k, _ in GOLDEN_FMIX64]
    want = [h for _, h in GOLDEN_FMIX64]
    assert [fmix64(k) for k in keys] == want
    tensor = torch.tensor([_as_int64(k) for k in keys], dtype=torch.int64)
    assert [h & MASK64 for h in hash_key(tensor).tolist()] == want


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("world_size", [3, 8, 1000])
def test_hash_roundrobin_owners_are_the_golden_hash_mod_world_size(native, world_size):
    # each key alone in its batch: the rank whose output length is 1 owns it
    for key, hashed in GOLDEN_FMIX64:
        out = bucketize(
            torch.tensor([1]), torch.tensor([_as_int64(key)]), world_size, "hash_roundrobin", native=native
        )
        assert out.lengths.tolist().index(1) == hashed % world_size, (hex(key), native)


# Buckets 1..N of jump consistent hash for four keys, as printed by the paper's
# reference C++ code and kept in github.com/dgryski/go-jump's jump_test.go.
JUMP_REFERENCE = {
    0: [0] * 19,
    1: [0, 0, 0, 0, 0, 0, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 17, 17],
    0xDEADBEEF: [0, 1, 2, 3, 3, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 16, 16, 16],
    0x0DDC0FFEEBADF00D: [0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 15, 15, 15, 15],
}


@pytest.mark.parametrize("key", list(JUMP_REFERENCE))
def test_jump_bucket_matches_the_reference_implementation(key):
    assert [reference.jump_bucket(key, n) for n in range(1, 20)] == JUMP_REFERENCE[key]


@given(key=st.integers(0, 2**64 - 1), buckets=st.integers(1, 200))
def test_jump_bucket_moves_a_key_only_into_the_new_bucket(key, buckets):
    before, after = reference.jump_bucket(key, buckets), reference.jump_bucket(key, buckets + 1)
    assert 0 <= before < buckets
    assert after in (before, buckets)


def test_jump_bucket_rejects_no_buckets():
    with pytest.raises(ValueError, match="num_buckets must be >= 1, got 0"):
        reference.jump_bucket(5, 0)


PAGE_KEYS = [0, 1, 7, 12, 96, 4096 * 3, 2**40 + 5, 2**62 + 11, 2**63 - 1]


def test_the_page_core_check_agrees_with_the_reference_and_fails_for_a_changed_rule():
    """page_core_agrees: the reference's own rule passes; a hash shifted by 32 instead of 33, or an
    owner off by one rank, fails the check it breaks (what notebook 01's assert relies on)."""
    args = (PAGE_KEYS, [3, 8, 64], 1 << 60)
    assert reference.page_core_agrees(fmix64, owner_of, *args) == dict.fromkeys(
        ("fmix64", "continuous", "roundrobin", "hash_roundrobin"), True
    )

    def shifted_fmix64(key):
        x = key & MASK64
        x ^= x >> 32
        x = (x * 0xFF51AFD7ED558CCD) & MASK64
        x ^= x >> 33
        x = (x * 0xC4CEB9FE1A85EC53) & MASK64
        return x ^ (x >> 33)

    def hashed_owner(key, world_size, dist_type, block_size):
        if dist_type == "hash_roundrobin":
            return shifted_fmix64(key) % world_size
        return owner_of(key, world_size, dist_type, block_size)

    bad = reference.page_core_agrees(shifted_fmix64, hashed_owner, *args)
    assert bad == {"fmix64": False, "continuous": True, "roundrobin": True, "hash_roundrobin": False}

    def off_by_one(key, world_size, dist_type, block_size):
        return (owner_of(key, world_size, dist_type, block_size) + 1) % world_size

    bad = reference.page_core_agrees(fmix64, off_by_one, *args)
    assert bad == {"fmix64": True, "continuous": False, "roundrobin": False, "hash_roundrobin": False}


def test_the_page_core_check_names_keys_it_cannot_take():
    with pytest.raises(ValueError, match=r"\[0, 2\*\*63\)"):
        reference.page_core_agrees(fmix64, owner_of, [-1], [2], 1)

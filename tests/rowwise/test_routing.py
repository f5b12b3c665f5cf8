"""embnb.rowwise.routing against FBGEMM and independent NumPy / plain-Python models."""

from __future__ import annotations

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm.*)
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sharder_ranks import feistel_owner_local

from embnb.rowwise.layout import TableLayout
from embnb.rowwise.routing import Bucketized, DistType, bucketize, hash_key, owner_rank

MODES = [m.value for m in DistType]
ROUND_ROBIN = ["roundrobin", "hash_roundrobin"]
MASK64 = (1 << 64) - 1
INT_RANGES = {
    torch.int32: (-(1 << 31), (1 << 31) - 1),
    torch.int64: (-(1 << 63), (1 << 63) - 1),
}
EDGE_KEYS = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]

fast = settings(max_examples=150, deadline=None)


# ---- independent models -------------------------------------------------


def np_fmix64(keys: np.ndarray) -> np.ndarray:
    """fmix64 on uint64 in NumPy (wrapping multiply, logical shift)."""
    x = keys.astype(np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xFF51AFD7ED558CCD)
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xC4CEB9FE1A85EC53)
        x = x ^ (x >> np.uint64(33))
    return x.view(np.int64)


def py_fmix64(u: int) -> int:
    """fmix64 on a Python int in [0, 2**64)."""
    u ^= u >> 33
    u = (u * 0xFF51AFD7ED558CCD) & MASK64
    u ^= u >> 33
    u = (u * 0xC4CEB9FE1A85EC53) & MASK64
    return u ^ (u >> 33)


def py_route(key: int, world: int, mode: str, block: int | None, table_rows: int = 0, seed: int = 0):
    """(owner, id sent) with Python ints; keys read as uint64 patterns."""
    if mode == "feistel_roundrobin":  # the sharder tests' plain-int model of the network
        return feistel_owner_local(key, table_rows, world, seed)
    if mode == "continuous":
        if key < block * world:
            return key // block, key % block
        return key % world, key // world
    unsigned = key % (1 << 64)
    if mode == "roundrobin":  # a dense table (rows known) sends the local row
        return unsigned % world, key // world if table_rows else key
    return py_fmix64(unsigned) % world, key


def py_bucketize(lengths, indices, world, modes, blocks, tables=None, seed=0):
    """Loop-by-loop expectation: bucket per (rank, segment), input order."""
    num_segments = len(lengths)
    batch = num_segments // len(modes) if modes else 0
    buckets = [[[] for _ in range(num_segments)] for _ in range(world)]
    pos = 0
    for seg, length in enumerate(lengths):
        f = seg // batch
        for _ in range(length):
            block = blocks[f] if blocks is not None else None
            rows = tables[f] if tables is not None else 0
            rank, sent = py_route(indices[pos], world, modes[f], block, rows, seed)
            buckets[rank][seg].append((pos, sent))
            pos += 1
    new_lengths, new_indices = [], []
    permute = [0] * len(indices)
    for rank in range(world):
        for seg in range(num_segments):
            new_lengths.append(len(buckets[rank][seg]))
            for p, sent in buckets[rank][seg]:
                permute[p] = len(new_indices)
                new_indices.append(sent)
    return new_lengths, new_indices, permute


# ---- strategies -----------------------------------------------------------


@st.composite
def kjt_cases(draw, modes=st.sampled_from(MODES), max_world=8):
    """A random KJT (lengths, indices) with per-feature modes and blocks."""
    world = draw(st.integers(1, max_world))
    num_features = draw(st.integers(1, 4))
    batch = draw(st.integers(0, 5))
    feature_modes = [draw(modes) for _ in range(num_features)]
    blocks = [draw(st.integers(1, 20)) for _ in range(num_features)]
    index_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    lengths_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    lo, hi = INT_RANGES[index_dtype]
    tables = [draw(st.one_of(st.integers(1, 40), st.integers(1, min(hi, 2**62)))) for _ in feature_modes]
    # a roundrobin feature routes unbounded keys (0) or a dense table's ids
    tables = [t * draw(st.booleans()) if m == "roundrobin" else t for m, t in zip(feature_modes, tables)]
    lengths = [draw(st.integers(0, 6)) for _ in range(num_features * batch)]
    indices = []
    for seg, length in enumerate(lengths):
        f = seg // batch
        if feature_modes[f] == "continuous":
            # Mostly inside the blocks, some past the last block.
            keys = st.one_of(st.integers(0, 2 * blocks[f] * world), st.integers(0, hi))
        elif feature_modes[f] == "feistel_roundrobin" or (feature_modes[f] == "roundrobin" and tables[f]):
            keys = st.one_of(st.integers(0, tables[f] - 1), st.just(tables[f] - 1))
        else:
            edges = [k for k in EDGE_KEYS if lo <= k <= hi]
            keys = st.one_of(st.integers(lo, hi), st.sampled_from(edges))
        indices += [draw(keys) for _ in range(length)]
    return dict(
        world=world,
        modes=feature_modes,
        blocks=blocks,
        tables=tables,
        seed=draw(st.integers(0, 1000)),
        lengths=torch.tensor(lengths, dtype=lengths_dtype),
        indices=torch.tensor(indices, dtype=index_dtype),
    )


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert torch.equal(a, b), (a.tolist(), b.tolist())


# ---- DistType -------------------------------------------------------------


def test_dist_type_parse_and_str():
    for mode in DistType:
        assert DistType.parse(mode.value) is mode
        assert DistType.parse(mode) is mode
        assert str(mode) == mode.value == mode  # a str enum: compares as str
    valid = "continuous, roundrobin, hash_roundrobin, feistel_roundrobin"
    with pytest.raises(ValueError, match=f"'modulo' is not one of {valid}"):
        DistType.parse("modulo")
    with pytest.raises(TypeError, match="int 3"):
        DistType.parse(3)


# ---- hash_key -------------------------------------------------------------


def test_hash_key_edge_keys():
    keys = np.array(EDGE_KEYS, dtype=np.int64)
    got = hash_key(torch.from_numpy(keys))
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), np_fmix64(keys))
    assert int(hash_key(torch.tensor([0]))) == 0  # fmix64 has no seed
    assert [int(h) & MASK64 for h in got] == [py_fmix64(k % (1 << 64)) for k in EDGE_KEYS]


def test_hash_key_random_keys():
    rng = np.random.default_rng(0)
    keys = rng.integers(-(2**63), 2**63 - 1, size=10_000, dtype=np.int64)
    got = hash_key(torch.from_numpy(keys)).numpy()
    np.testing.assert_array_equal(got, np_fmix64(keys))


def test_hash_key_int32_sign_extends():
    keys32 = torch.tensor([-1, 0, 7, -(2**31), 2**31 - 1], dtype=torch.int32)
    assert_same(hash_key(keys32), hash_key(keys32.to(torch.int64)))


# ---- owner_rank -----------------------------------------------------------


@fast
@given(
    keys=st.lists(
        st.integers(-(2**63), 2**63 - 1) | st.sampled_from(EDGE_KEYS),
        max_size=50,
    ),
    world=st.integers(1, 64),
    mode=st.sampled_from(["roundrobin", "hash_roundrobin"]),
)
def test_owner_rank_round_robin_modes(keys, world, mode):
    got = owner_rank(torch.tensor(keys, dtype=torch.int64), world, mode)
    assert got.dtype == torch.int64
    assert got.tolist() == [py_route(k, world, mode, None)[0] for k in keys]


@fast
@given(
    keys=st.lists(st.integers(0, 2**63 - 1) | st.integers(0, 500), max_size=50),
    world=st.integers(1, 16),
    block=st.integers(1, 40) | st.integers(1, 2**62),
)
def test_owner_rank_continuous(keys, world, block):
    got = owner_rank(torch.tensor(keys, dtype=torch.int64), world, DistType.CONTINUOUS, block)
    assert got.tolist() == [py_route(k, world, "continuous", block)[0] for k in keys]


@fast
@given(data=st.data(), rows=st.integers(1, 60) | st.integers(1, 2**62), world=st.integers(1, 16))
def test_owner_rank_feistel(data, rows, world):
    keys = data.draw(st.lists(st.integers(0, rows - 1), max_size=30))
    seed = data.draw(st.integers(0, 2**20))
    got = owner_rank(
        torch.tensor(keys, dtype=torch.int64), world, "feistel_roundrobin", num_embeddings=rows, seed=seed
    )
    assert got.tolist() == [py_route(k, world, "feistel_roundrobin", None, rows, seed)[0] for k in keys]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("rows, world", [(1, 1), (10, 3), (1000, 8), (4097, 64), (300, 300)])
def test_feistel_roundrobin_is_dense_and_balanced(rows, world, native):
    """Every id of the table once: rank r receives local rows 0 .. count - 1 exactly, and
    counts differ by at most one (counting, not a model)."""
    ids = torch.arange(rows)
    got = bucketize(
        torch.tensor([rows]), ids, world, "feistel_roundrobin", num_embeddings=[rows], seed=5, native=native
    )
    counts = got.lengths.tolist()
    assert counts == [rows // world + (r < rows % world) for r in range(world)]
    starts = [sum(counts[:r]) for r in range(world)]
    for r, (start, count) in enumerate(zip(starts, counts)):
        assert sorted(got.indices[start : start + count].tolist()) == list(range(count)), r
    # the storage slot the routed sharders' layout gives each id: its rank's block, its local row
    layout = TableLayout(rows, world, "feistel_roundrobin", seed=5)
    rank_of_position = torch.repeat_interleave(torch.arange(world), got.lengths)
    slot = (
        rank_of_position[got.unbucketize_permute] * layout.block_size + got.indices[got.unbucketize_permute]
    )
    assert torch.equal(slot, layout.slots(ids, native=False))
    # another seed is another bijection (where there is more than one)
    if rows > 2:
        other = bucketize(
            torch.tensor([rows]), ids, world, "feistel_roundrobin", num_embeddings=[rows], seed=6
        )
        assert not torch.equal(other.unbucketize_permute, got.unbucketize_permute) or world == 1


def test_roundrobin_aliases_and_hash_spreads():
    # Keys that are all multiples of W: roundrobin puts all on rank 0.
    world = 8
    keys = torch.arange(0, 8000 * world, world)
    rr = torch.bincount(owner_rank(keys, world, "roundrobin"), minlength=world)
    hashed = torch.bincount(owner_rank(keys, world, "hash_roundrobin"), minlength=world)
    assert rr.tolist() == [len(keys)] + [0] * (world - 1)
    assert int(hashed.max()) < 1.1 * len(keys) / world


# ---- bucketize: continuous is FBGEMM's block bucketize ---------------------


def fbgemm_bucketize(lengths, indices, world, blocks, weights=None):
    block_sizes = torch.tensor(blocks, dtype=indices.dtype)
    out = torch.ops.fbgemm.block_bucketize_sparse_features(
        lengths,
        indices,
        bucketize_pos=False,
        sequence=True,
        block_sizes=block_sizes,
        my_size=world,
        weights=weights,
    )
    new_lengths, new_indices, new_weights, _, permute = out
    return new_lengths, new_indices, new_weights, permute


@settings(max_examples=300, deadline=None)
@given(case=kjt_cases(modes=st.just("continuous")), with_weights=st.booleans())
def test_bucketize_continuous_matches_fbgemm(case, with_weights):
    lengths, indices = case["lengths"], case["indices"]
    weights = torch.rand(len(indices)) if with_weights else None
    got = bucketize(lengths, indices, case["world"], "continuous", case["blocks"], weights=weights)
    want = fbgemm_bucketize(lengths, indices, case["world"], case["blocks"], weights)
    assert_same(got.lengths, want[0])
    assert_same(got.indices, want[1])
    assert_same(got.unbucketize_permute, want[3])
    if with_weights:
        assert_same(got.weights, want[2])


def test_bucketize_continuous_fbgemm_edge_shapes():
    for world in (1, 3):
        for lengths, indices in [
            ([0, 0, 0, 0], []),  # empty rows only
            ([], []),  # no samples at all
            ([3, 0, 0, 2], [0, 59, 2**31 - 1, 4, 41]),  # keys past the blocks
        ]:
            for dtype in (torch.int32, torch.int64):
                lt = torch.tensor(lengths, dtype=dtype)
                it = torch.tensor(indices, dtype=dtype)
                got = bucketize(lt, it, world, "continuous", [5, 7])
                want = fbgemm_bucketize(lt, it, world, [5, 7])
                assert_same(got.lengths, want[0])
                assert_same(got.indices, want[1])
                assert_same(got.unbucketize_permute, want[3])


# ---- bucketize: all modes against the Python-loop model ------------------


def check_against_model(case, dist_type):
    tables, seed = case["tables"], case["seed"]
    got = bucketize(
        case["lengths"],
        case["indices"],
        case["world"],
        dist_type,
        case["blocks"],
        num_embeddings=tables,
        seed=seed,
    )
    assert isinstance(got, Bucketized)
    want = py_bucketize(
        case["lengths"].tolist(),
        case["indices"].tolist(),
        case["world"],
        case["modes"],
        case["blocks"],
        tables,
        seed,
    )
    assert got.lengths.dtype == case["lengths"].dtype
    assert got.indices.dtype == case["indices"].dtype
    assert got.lengths.tolist() == want[0]
    assert got.indices.tolist() == want[1]
    assert got.unbucketize_permute.tolist() == want[2]
    return got


@fast
@given(case=kjt_cases(modes=st.sampled_from(ROUND_ROBIN)))
def test_bucketize_round_robin_modes_match_model(case):
    # One mode for all features, given as a single value.
    mode = case["modes"][0]
    case["modes"] = [mode] * len(case["modes"])
    case["tables"] = None  # unbounded keys
    got = check_against_model(case, mode)
    # The raw keys travel, so the permute gathers the input back.
    assert_same(got.indices[got.unbucketize_permute.long()], case["indices"])


@fast
@given(case=kjt_cases())
def test_bucketize_mixed_dist_types_match_model(case):
    check_against_model(case, case["modes"])


def test_bucketize_permute_moves_weights_with_keys():
    lengths = torch.tensor([2, 3, 0, 4])
    indices = torch.tensor([9, -4, 2**40, 5, 6, 0, 17, -1, 3])
    weights = torch.arange(len(indices), dtype=torch.float32)
    got = bucketize(lengths, indices, 4, "hash_roundrobin", num_features=2, weights=weights)
    perm = got.unbucketize_permute
    assert_same(got.weights[perm], weights)
    assert_same(got.indices[perm], indices)
    assert got.lengths.shape == (4 * 4,)


def test_bucketize_num_features_from_block_sizes_or_list():
    lengths = torch.tensor([1, 1, 1, 1])
    indices = torch.tensor([0, 1, 2, 3])
    # Two features (from block_sizes), batch 2; one feature (default), batch 4.
    two = bucketize(lengths, indices, 2, "roundrobin", [1, 1])
    one = bucketize(lengths, indices, 2, "roundrobin")
    explicit = bucketize(lengths, indices, 2, ["roundrobin"] * 2)
    assert_same(two.lengths, explicit.lengths)
    assert two.lengths.tolist() == [1, 0, 1, 0, 0, 1, 0, 1]
    assert one.lengths.tolist() == [1, 0, 1, 0, 0, 1, 0, 1]
    assert_same(two.indices, one.indices)


# ---- bad input -------------------------------------------------------------

L = torch.tensor([1, 2, 0, 1])
KEYS = torch.tensor([3, 4, 5, 6])

BAD_CALLS = [
    # (kwargs over a valid call, error type, words the message must hold)
    (dict(lengths=torch.tensor([1, 2, 0, 2])), ValueError, ["5", "4 keys"]),
    (dict(lengths=torch.tensor([1, -2, 4, 1])), ValueError, ["-2", ">= 0"]),
    (dict(world_size=0), ValueError, ["0", ">= 1"]),
    (dict(world_size=2.0), TypeError, ["2.0", "int"]),
    (dict(world_size=True), TypeError, ["True", "int"]),
    (dict(block_sizes=[4, 4, 4]), ValueError, ["len(lengths) is 4", "num_features=3", "len(block_sizes)"]),
    (
        dict(block_sizes=[4, 4, 4], dist_type=["continuous"] * 2),
        ValueError,
        ["len(dist_type) is 2", "len(block_sizes) is 3"],
    ),
    (dict(block_sizes=[4, 0]), ValueError, ["block_sizes[1]", "0", ">= 1"]),
    (dict(block_sizes=[4, -3]), ValueError, ["-3", ">= 1"]),
    (dict(block_sizes=torch.tensor([4.0, 4.0])), TypeError, ["float32"]),
    (dict(block_sizes=None, num_features=2), ValueError, ["block_sizes is None", "features [0, 1]"]),
    (dict(lengths=L.float()), TypeError, ["lengths", "float32"]),
    (dict(indices=KEYS.to(torch.int16)), TypeError, ["indices", "int16"]),
    (dict(indices=[3, 4, 5, 6]), TypeError, ["indices", "list"]),
    (dict(indices=torch.tensor([3, -7, 5, 6])), ValueError, ["-7", ">= 0"]),
    (dict(dist_type="modulo"), ValueError, ["'modulo'", "continuous, roundrobin, hash_roundrobin"]),
    (dict(dist_type=["roundrobin"] * 3), ValueError, ["len(dist_type) is 3", "len(block_sizes) is 2"]),
    (dict(dist_type=["roundrobin", "mod"]), ValueError, ["'mod'"]),
    (dict(num_features=3, block_sizes=None, dist_type="roundrobin"), ValueError, ["4", "num_features=3"]),
    (dict(num_features=0), ValueError, ["0", ">= 1"]),
    (dict(weights=torch.ones(3)), ValueError, ["4", "weights"]),
    (
        dict(dist_type=["continuous", "feistel_roundrobin"]),
        ValueError,
        ["num_embeddings is None", "features [1]", "feistel_roundrobin"],
    ),
    (
        dict(dist_type="feistel_roundrobin", num_embeddings=[7, 0]),
        ValueError,
        ["num_embeddings[1] is 0", "[1, 2**62]"],
    ),
    (dict(dist_type="feistel_roundrobin", num_embeddings=[7, 1.5]), TypeError, ["num_embeddings", "1.5"]),
    (
        dict(dist_type="feistel_roundrobin", num_embeddings=[7, 9, 9]),
        ValueError,
        ["len(num_embeddings) is 3", "len(block_sizes) is 2"],
    ),
    (
        dict(dist_type="feistel_roundrobin", num_embeddings=[7, 6]),
        ValueError,
        ["[0, 6)", "key 6", "feature 1"],
    ),
    (dict(dist_type="feistel_roundrobin", num_embeddings=[7, 7], seed=-1), ValueError, ["seed", "-1"]),
    (
        dict(dist_type="feistel_roundrobin", num_embeddings=[7, 2**31 + 1], indices=KEYS.int()),
        ValueError,
        ["num_embeddings[1] is 2147483649", "int32 indices", "2**31 rows"],
    ),
    (
        dict(dist_type="roundrobin", num_embeddings=[7, 6]),
        ValueError,
        ["roundrobin routing needs keys in [0, 6)", "key 6", "feature 1"],
    ),
    (dict(dist_type="roundrobin", num_embeddings=[7, -1]), ValueError, ["num_embeddings[1] is -1", "0 for"]),
]


@pytest.mark.parametrize("bad, error, words", BAD_CALLS)
def test_bucketize_bad_input(bad, error, words):
    call = dict(lengths=L, indices=KEYS, world_size=2, dist_type="continuous", block_sizes=[4, 4])
    call.update(bad)
    with pytest.raises(error) as info:
        bucketize(**call)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_bucketize_ignores_block_sizes_of_round_robin_features():
    # Feature 0 (keys 3, 4, 5) is continuous; feature 1 (key -6) is not.
    keys = [3, 4, 5, -6]
    modes = ["continuous", "roundrobin"]
    got = bucketize(L, torch.tensor(keys), 2, modes, [4, 0])
    want = py_bucketize(L.tolist(), keys, 2, modes, [4, 0])
    assert got.lengths.tolist() == want[0]
    assert got.indices.tolist() == want[1]


@pytest.mark.parametrize(
    "args, error, words",
    [
        ((KEYS, 0, "roundrobin"), ValueError, ["0"]),
        ((KEYS, 4, "hashed"), ValueError, ["'hashed'"]),
        ((KEYS, 4, "continuous"), ValueError, ["block_size", "None"]),
        ((KEYS, 4, "continuous", 0), ValueError, ["0", ">= 1"]),
        ((torch.tensor([-5]), 4, "continuous", 2), ValueError, ["-5"]),
        ((KEYS.double(), 4, "roundrobin"), TypeError, ["float64"]),
        ((KEYS, 4, "feistel_roundrobin"), ValueError, ["num_embeddings", "None"]),
        ((KEYS, 4, "feistel_roundrobin", None, 6), ValueError, ["[0, 6)", "key 6"]),
        ((KEYS, 4, "roundrobin", None, 6), ValueError, ["roundrobin", "[0, 6)", "key 6"]),
    ],
)
def test_owner_rank_bad_input(args, error, words):
    args, num_embeddings = (args[:4], args[4]) if len(args) == 5 else (args, None)
    with pytest.raises(error) as info:
        owner_rank(*args, num_embeddings=num_embeddings)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_negative_int32_keys_are_sign_extended_unlike_dynamicemb():
    """The documented difference: dynamicemb reads an int32 key as uint32,
    embnb sign-extends it to int64 (so int32 and int64 keys route alike).
    Both owners computed here with Python integers, not embnb's code."""
    world_size = 7
    key = -1
    sign_extended = (key % 2**64) % world_size  # embnb: 2**64 - 1
    as_uint32 = (key % 2**32) % world_size  # dynamicemb's reading: 2**32 - 1
    assert (sign_extended, as_uint32) == (1, 3)  # they really differ here
    for dtype in (torch.int32, torch.int64):
        got = owner_rank(torch.tensor([key], dtype=dtype), world_size, "roundrobin")
        assert got.tolist() == [sign_extended]
    # Non-negative int32 keys route exactly as dynamicemb's uint32 reading.
    keys = torch.tensor([0, 5, 2**31 - 1], dtype=torch.int32)
    want = [k % world_size for k in keys.tolist()]
    assert owner_rank(keys, world_size, "roundrobin").tolist() == want

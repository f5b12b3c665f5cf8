"""Tests for embnb.rowwise.checkpoint: real safetensors files in tmp_path."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from embnb.rowwise import checkpoint
from embnb.rowwise.checkpoint import dump, load, meta_path, shard_path
from embnb.rowwise.routing import DistType, owner_rank

DIST_TYPES = ["continuous", "roundrobin", "hash_roundrobin"]
NUM_ROWS = 1000  # continuous: the global key space the blocks cover
DIM = 8


def block_for(dist: str, world_size: int) -> int | None:
    """The block size a continuous layout of NUM_ROWS rows would use."""
    return math.ceil(NUM_ROWS / world_size) if dist == "continuous" else None


def make_table(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique keys (some aliased multiples of 8, some past the continuous
    blocks) and random rows."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.cat(
        [
            torch.randperm(NUM_ROWS, generator=g)[:300],
            torch.arange(0, 8 * 50, 8),
            torch.tensor([NUM_ROWS, 12345, 2**40 + 3]),
        ]
    ).unique()
    keys = keys[torch.randperm(len(keys), generator=g)]
    return keys, torch.randn(len(keys), DIM, generator=g)


def shard_by_owner(keys, rows, world_size, dist, block_size):
    owners = owner_rank(keys, world_size, dist, block_size)
    return [(keys[owners == r], rows[owners == r]) for r in range(world_size)]


def sorted_by_key(keys, rows):
    order = keys.argsort()
    return keys[order], rows[order]


def write_table(tmp_path, dist, world_size, name="emb", seed=0):
    keys, rows = make_table(seed)
    shards = shard_by_owner(keys, rows, world_size, dist, block_for(dist, world_size))
    for rank, (rank_keys, rank_rows) in enumerate(shards):
        dump(tmp_path, name, rank, world_size, rank_keys, rank_rows, dist, block_for(dist, world_size))
    return keys, rows, shards


# ------------------------------------------------------------------ round trip


@pytest.mark.parametrize("dist", DIST_TYPES)
def test_round_trip_same_world_size(tmp_path, dist):
    _, _, shards = write_table(tmp_path, dist, 4)
    for rank, (keys, rows) in enumerate(shards):
        got_keys, got_rows = load(tmp_path, "emb", rank, 4, dist)
        assert torch.equal(got_keys, keys) and torch.equal(got_rows, rows)
    meta = json.loads(meta_path(tmp_path, "emb").read_text())
    assert meta == {
        "format_version": checkpoint.FORMAT_VERSION,
        "table_name": "emb",
        "dist_type": dist,
        "world_size": 4,
        "embedding_dim": DIM,
        "block_size": block_for(dist, 4),
        "init_seed": None,
    }


def test_dump_per_rank_then_load_into_one_rank(tmp_path):
    keys, rows = make_table()
    dist = DistType.parse("hash_roundrobin")
    for rank, (k, v) in enumerate(shard_by_owner(keys, rows, 2, dist, None)):
        dump(tmp_path, "emb", rank, 2, k, v, dist)
    got_keys, got_rows = sorted_by_key(*load(tmp_path, "emb", 0, 1, dist))
    want_keys, want_rows = sorted_by_key(keys, rows)
    assert torch.equal(got_keys, want_keys)
    assert torch.equal(got_rows, want_rows)


def test_empty_shard_round_trips(tmp_path):
    dump(tmp_path, "emb", 0, 2, torch.tensor([0, 2]), torch.ones(2, DIM), "roundrobin")
    dump(tmp_path, "emb", 1, 2, torch.zeros(0, dtype=torch.int64), torch.zeros(0, DIM), "roundrobin")
    keys, rows = load(tmp_path, "emb", 1, 2, "roundrobin")
    assert keys.shape == (0,) and rows.shape == (0, DIM)


# ----------------------------------------------------------------- resharding


@pytest.mark.parametrize("dist", DIST_TYPES)
@pytest.mark.parametrize("old_world,new_world", [(4, 2), (4, 3), (2, 8)])
def test_reshard_keeps_every_row_once(tmp_path, dist, old_world, new_world):
    keys, rows, _ = write_table(tmp_path, dist, old_world)
    new_block = block_for(dist, new_world)
    loaded = [load(tmp_path, "emb", r, new_world, dist, new_block) for r in range(new_world)]
    for rank, (k, _) in enumerate(loaded):
        owners = owner_rank(k, new_world, dist, new_block)
        assert bool((owners == rank).all()), f"rank {rank} got foreign keys"
    all_keys = torch.cat([k for k, _ in loaded])
    all_rows = torch.cat([v for _, v in loaded])
    assert len(all_keys) == len(keys)  # nothing lost, nothing duplicated
    got_keys, got_rows = sorted_by_key(all_keys, all_rows)
    want_keys, want_rows = sorted_by_key(keys, rows)
    assert torch.equal(got_keys, want_keys)
    assert torch.equal(got_rows, want_rows)  # each row travelled with its key


def test_naive_modulo_filter_loses_rows_under_hash(tmp_path):
    """dynamicemb's loader keeps `key % W == rank`; under hash routing that
    drops rows from a rank's own file and misplaces rows when resharding."""
    keys, _, _ = write_table(tmp_path, "hash_roundrobin", 4)
    stored = [load_file(shard_path(tmp_path, "emb", r, 4))["keys"] for r in range(4)]
    # Same world size, each rank filters its own file: rows vanish.
    naive_kept = sum(int((k % 4 == r).sum()) for r, k in enumerate(stored))
    lost = len(keys) - naive_kept
    # Resharding 4 -> 2 over all files: rows land on a rank lookups never ask.
    all_keys = torch.cat(stored)
    misplaced = int((all_keys % 2 != owner_rank(all_keys, 2, "hash_roundrobin")).sum())
    assert lost > len(keys) // 2 and misplaced > len(keys) // 4, (lost, misplaced)
    loaded = sum(len(load(tmp_path, "emb", r, w, "hash_roundrobin")[0]) for w in (4, 2) for r in range(w))
    assert loaded == 2 * len(keys)


# ----------------------------------------------------------- dist_type checks


def test_dist_type_mismatch_names_both(tmp_path):
    write_table(tmp_path, "hash_roundrobin", 2)
    with pytest.raises(ValueError, match="'hash_roundrobin' but loading asks for 'roundrobin'"):
        load(tmp_path, "emb", 0, 2, "roundrobin")


def test_missing_dist_type_loads_as_roundrobin(tmp_path):
    keys, rows, shards = write_table(tmp_path, "roundrobin", 2)
    meta = json.loads(meta_path(tmp_path, "emb").read_text())
    del meta["dist_type"]
    meta_path(tmp_path, "emb").write_text(json.dumps(meta))
    got_keys, got_rows = load(tmp_path, "emb", 1, 2, "roundrobin")
    assert torch.equal(got_keys, shards[1][0])
    with pytest.raises(ValueError, match="'roundrobin' but loading asks for 'hash_roundrobin'"):
        load(tmp_path, "emb", 1, 2, "hash_roundrobin")


def test_continuous_needs_block_size_and_nonnegative_keys(tmp_path):
    with pytest.raises(TypeError, match="block_size"):
        dump(tmp_path, "emb", 0, 1, torch.arange(3), torch.zeros(3, DIM), "continuous")
    with pytest.raises(ValueError, match="rank 0's shard: .*key -1"):
        dump(tmp_path, "emb", 0, 1, torch.tensor([-1]), torch.zeros(1, DIM), "continuous", block_size=4)


# ---------------------------------------------------------------- atomicity


def _boom(*args, **kwargs):
    raise OSError("simulated crash")


@pytest.mark.parametrize("crash_in", ["replace", "fsync"])
def test_crash_leaves_earlier_checkpoint_intact(tmp_path, monkeypatch, crash_in):
    _, _, shards = write_table(tmp_path, "roundrobin", 2)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr(os, crash_in, _boom)
    new_keys, new_rows = shards[0][0], shards[0][1] + 1.0
    with pytest.raises(OSError, match="simulated crash"):
        dump(tmp_path, "emb", 0, 2, new_keys, new_rows, "roundrobin")
    with pytest.raises(OSError, match="simulated crash"):  # a new table
        dump(tmp_path, "other", 0, 1, new_keys, new_rows, "roundrobin")
    monkeypatch.undo()
    # No temp file left behind, no file of the new table, old bytes intact.
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    keys, rows = load(tmp_path, "emb", 0, 2, "roundrobin")
    assert torch.equal(keys, shards[0][0]) and torch.equal(rows, shards[0][1])


# ------------------------------------------------------- corrupt checkpoints


def test_truncated_shard_names_file(tmp_path):
    write_table(tmp_path, "roundrobin", 2)
    path = shard_path(tmp_path, "emb", 1, 2)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ValueError, match=f"{path.name}.*corrupt"):
        load(tmp_path, "emb", 1, 2, "roundrobin")


@pytest.mark.parametrize("garbage", [b"\xff" * 8, b"\x10\x00" + b"\x00" * 6 + b"}{not json"])
def test_corrupt_header_names_file(tmp_path, garbage):
    write_table(tmp_path, "roundrobin", 2)
    path = shard_path(tmp_path, "emb", 0, 2)
    data = path.read_bytes()
    path.write_bytes(garbage + data[len(garbage) :])
    with pytest.raises(ValueError, match=path.name):
        load(tmp_path, "emb", 0, 2, "roundrobin")


def test_keys_rows_length_mismatch_in_file(tmp_path):
    write_table(tmp_path, "roundrobin", 1)
    path = shard_path(tmp_path, "emb", 0, 1)
    save_file(
        {"keys": torch.arange(3), "rows": torch.zeros(2, DIM)},
        path,
        metadata={"rank": "0", "world_size": "1"},
    )
    with pytest.raises(ValueError, match=f"{path.name}.*3 keys but 2 rows"):
        load(tmp_path, "emb", 0, 1, "roundrobin")


def test_shard_in_wrong_place_is_refused(tmp_path):
    write_table(tmp_path, "hash_roundrobin", 2)
    a, b = shard_path(tmp_path, "emb", 0, 2), shard_path(tmp_path, "emb", 1, 2)
    a_bytes = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(a_bytes)
    with pytest.raises(ValueError, match=a.name):
        load(tmp_path, "emb", 0, 2, "hash_roundrobin")


def _edit_meta(tmp_path, **changes):
    meta = json.loads(meta_path(tmp_path, "emb").read_text())
    meta.update(changes)
    meta_path(tmp_path, "emb").write_text(json.dumps(meta))


def test_dim_mismatch_with_metadata(tmp_path):
    write_table(tmp_path, "roundrobin", 2)
    _edit_meta(tmp_path, embedding_dim=DIM + 1)
    with pytest.raises(ValueError, match=r"rank0-of-2.*dim 8 .* says 9"):
        load(tmp_path, "emb", 0, 2, "roundrobin")


def test_corrupt_metadata_json(tmp_path):
    write_table(tmp_path, "roundrobin", 2)
    meta_path(tmp_path, "emb").write_text('{"format_version": 1,')
    with pytest.raises(ValueError, match="emb.meta.json.*corrupt"):
        load(tmp_path, "emb", 0, 2, "roundrobin")


def test_unknown_format_version(tmp_path):
    write_table(tmp_path, "roundrobin", 2)
    _edit_meta(tmp_path, format_version=99)
    with pytest.raises(ValueError, match="version 99 .*supported: 1"):
        load(tmp_path, "emb", 0, 2, "roundrobin")


def test_missing_shard_file_is_named(tmp_path):
    write_table(tmp_path, "roundrobin", 4)
    shard_path(tmp_path, "emb", 2, 4).unlink()
    with pytest.raises(FileNotFoundError, match=r"emb\.rank2-of-4"):
        load(tmp_path, "emb", 0, 4, "roundrobin")  # rank 0's file is fine


def test_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="emb.meta.json"):
        load(tmp_path, "emb", 0, 1, "roundrobin")


# --------------------------------------------------------------- bad inputs

KEYS, ROWS = torch.tensor([0, 2, 4]), torch.zeros(3, DIM)


@pytest.mark.parametrize(
    "rank,world_size,keys,rows,dist,match",
    [
        (-1, 2, KEYS, ROWS, "roundrobin", r"rank must be an int in \[0, 1\], got -1"),
        (2, 2, KEYS, ROWS, "roundrobin", r"rank must be an int in \[0, 1\], got 2"),
        (0, 0, KEYS, ROWS, "roundrobin", "world_size must be an int >= 1, got 0"),
        (0, 2, KEYS.int(), ROWS, "roundrobin", "int64.*torch.int32"),
        (0, 2, KEYS[None], ROWS, "roundrobin", r"1-D.*shape \(1, 3\)"),
        (0, 2, KEYS, ROWS[0], "roundrobin", r"2-D.*shape \(8,\)"),
        (0, 2, KEYS, ROWS[:2], "roundrobin", "3 keys but 2 rows"),
        (0, 2, torch.tensor([0, 2, 0]), ROWS, "roundrobin", "duplicate key 0"),
        (1, 2, KEYS, ROWS, "roundrobin", "key 0 belongs to rank 0, not rank 1"),
        (0, 2, KEYS, ROWS, "modulo", "modulo"),
    ],
)
def test_dump_rejects_bad_inputs(tmp_path, rank, world_size, keys, rows, dist, match):
    with pytest.raises(ValueError, match=match):
        dump(tmp_path, "emb", rank, world_size, keys, rows, dist)
    assert not list(tmp_path.iterdir())  # nothing written


def test_dump_refuses_bools_as_sizes_and_a_missing_block_size(tmp_path):
    with pytest.raises(TypeError, match="world_size must be an int >= 1, got bool True"):
        dump(tmp_path, "emb", 0, True, KEYS, ROWS, "roundrobin")
    with pytest.raises(
        TypeError, match="block_size \\(dist_type 'continuous'\\) must be an int >= 1, got NoneType"
    ):
        dump(tmp_path, "emb", 0, 1, KEYS, ROWS, "continuous")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "rank,world_size,dist,match",
    [
        (3, 3, "roundrobin", r"rank must be an int in \[0, 2\], got 3"),
        (0, 2, "nope", "nope"),
    ],
)
def test_load_rejects_bad_inputs(tmp_path, rank, world_size, dist, match):
    write_table(tmp_path, "roundrobin", 2)
    with pytest.raises(ValueError, match=match):
        load(tmp_path, "emb", rank, world_size, dist)

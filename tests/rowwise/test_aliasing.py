"""embnb.rowwise.aliasing: per-rank load of key streams under each routing mode."""

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb.data import make_keys, zipf_probs
from embnb.rowwise import aliasing
from embnb.rowwise.routing import hash_key, owner_rank

MODES = ["continuous", "roundrobin", "hash_roundrobin"]


def test_block_size_for_sizes_the_table_to_the_largest_key():
    assert aliasing.block_size_for(torch.arange(100), 4) == 25
    assert aliasing.block_size_for(torch.tensor([0, 100]), 4) == 26  # ceil(101/4)
    assert aliasing.block_size_for(torch.tensor([3]), 8) == 1
    assert aliasing.block_size_for(torch.empty(0, dtype=torch.int64), 4) == 1
    with pytest.raises(ValueError, match="keys >= 0"):
        aliasing.block_size_for(torch.tensor([-5, -1]), 4)


def test_owners_defaults_continuous_to_blocks_of_the_key_range():
    keys = torch.arange(100)
    assert aliasing.owners(keys, 4, "continuous").tolist() == (keys // 25).tolist()
    assert (
        aliasing.owners(keys, 4, "continuous", block_size=10).tolist()
        == owner_rank(keys, 4, "continuous", 10).tolist()
    )
    assert torch.equal(aliasing.owners(keys, 4, "hash_roundrobin"), owner_rank(keys, 4, "hash_roundrobin"))


@pytest.mark.parametrize("dist_type", MODES)
def test_rank_counts_count_every_key_once(dist_type):
    keys = make_keys("uniform", 5000, 8, seed=1)
    counts = aliasing.rank_counts(keys, 8, dist_type)
    assert counts.shape == (8,) and counts.dtype == torch.int64
    assert int(counts.sum()) == 5000


def test_strided_keys_alias_under_roundrobin_and_spread_under_hash():
    world_size = 8
    keys = torch.randint(0, 2**30, (80_000,), generator=torch.Generator().manual_seed(0))
    keys = keys * world_size + 3  # every key has residue 3
    rr = aliasing.rank_counts(keys, world_size, "roundrobin")
    assert rr.tolist() == [0, 0, 0, 80_000, 0, 0, 0, 0]
    hashed = aliasing.rank_counts(keys, world_size, "hash_roundrobin")
    assert int(hashed.max()) / (80_000 / world_size) < 1.1


def test_hot_key_floor():
    assert aliasing.hot_key_floor(torch.tensor([5, 5, 5, 1]), 4) == 3.0
    assert aliasing.hot_key_floor(torch.arange(1000), 8) == 1.0  # clamped at 1
    with pytest.raises(ValueError, match="empty"):
        aliasing.hot_key_floor(torch.empty(0, dtype=torch.int64), 4)


@pytest.mark.parametrize("dist_type", MODES)
def test_hottest_key_lands_whole_on_its_owner(dist_type):
    keys = torch.tensor([7, 42, 42, 42, 9, 42, 11])
    per_rank = aliasing.hottest_key_counts(keys, 4, dist_type)
    owner = int(aliasing.owners(torch.tensor([42]), 4, dist_type, aliasing.block_size_for(keys, 4))[0])
    expected = [0, 0, 0, 0]
    expected[owner] = 4
    assert per_rank.tolist() == expected
    assert aliasing.hottest_key_counts(torch.empty(0, dtype=torch.int64), 4, dist_type).tolist() == [0] * 4


def test_worked_example_shows_residues_hashes_and_owners():
    keys = [0, 8, 13, 2**40 + 16]
    table = aliasing.worked_example(keys, 8, MODES, block_size=2**38)
    assert list(table.columns) == [
        "key",
        "low bits",
        "key % 8",
        "fmix64(key)",
        "owner: continuous",
        "owner: roundrobin",
        "owner: hash_roundrobin",
    ]
    assert table["low bits"].tolist() == ["000", "000", "101", "000"]
    assert table["key % 8"].tolist() == [0, 0, 5, 0]
    hashes = hash_key(torch.tensor(keys)).tolist()
    assert [int(h, 16) for h in table["fmix64(key)"]] == [h & (2**64 - 1) for h in hashes]
    assert table["fmix64(key)"][0] == "0" * 16  # fmix64(0) == 0
    for mode in MODES:
        expected = owner_rank(torch.tensor(keys), 8, mode, 2**38).tolist()
        assert table[f"owner: {mode}"].tolist() == expected


def test_worked_example_has_no_low_bits_column_when_w_is_not_a_power_of_two():
    table = aliasing.worked_example([1, 2, 3], 6, ["roundrobin"])
    assert "low bits" not in table.columns
    assert table["key % 6"].tolist() == [1, 2, 3]


def test_load_table_covers_every_case_and_finds_aliasing():
    patterns = ["uniform", "strided", "tagged", "zipf"]
    table = aliasing.load_table(
        patterns, MODES, [4, 8], num_keys=40_000, seed=0, pattern_options={"zipf": {"alpha": 1.5}}
    )
    assert list(table.columns) == aliasing.LOAD_COLUMNS
    assert len(table) == len(patterns) * len(MODES) * 2
    assert set(table["dist_type"]) == set(MODES)
    grid8 = aliasing.max_over_mean_grid(table, 8)
    assert grid8["strided"]["roundrobin"] == 8.0
    assert grid8["tagged"]["roundrobin"] == pytest.approx(8 / 3, rel=0.05)  # 3 tags
    for pattern in ("uniform", "strided", "tagged"):
        assert grid8[pattern]["hash_roundrobin"] < 1.1
    strided_rr = table[(table.pattern == "strided") & (table.dist_type == "roundrobin")]
    assert strided_rr["busiest_share"].tolist() == [1.0, 1.0]
    # Zipf: every routing sits at or above the hot-key floor, near W * p1.
    zipf = table[(table.pattern == "zipf") & (table.world_size == 8)]
    p1 = float(zipf_probs(100_000, 1.5)[0])
    assert zipf["hot_key_floor"].iloc[0] == pytest.approx(8 * p1, rel=0.1)
    assert (zipf["max_over_mean"] >= zipf["hot_key_floor"] - 1e-9).all()
    assert (zipf["max_over_mean"] > 2.5).all()


def test_load_table_is_deterministic_and_passes_pattern_options():
    mild = aliasing.load_table(
        ["zipf"], ["hash_roundrobin"], [8], 20_000, pattern_options={"zipf": {"alpha": 1.1}}
    )
    steep = aliasing.load_table(
        ["zipf"], ["hash_roundrobin"], [8], 20_000, pattern_options={"zipf": {"alpha": 2.0}}
    )
    again = aliasing.load_table(
        ["zipf"], ["hash_roundrobin"], [8], 20_000, pattern_options={"zipf": {"alpha": 2.0}}
    )
    assert steep.equals(again)
    assert steep["hot_key_floor"].iloc[0] > 2 * mild["hot_key_floor"].iloc[0]


def test_load_table_rejects_bad_arguments():
    with pytest.raises(ValueError, match="not swept"):
        aliasing.load_table(["uniform"], MODES, [4], 100, pattern_options={"zipf": {}})
    with pytest.raises(ValueError, match="unknown pattern"):
        aliasing.load_table(["nope"], MODES, [4], 100)
    with pytest.raises(ValueError, match="not one of"):
        aliasing.load_table(["uniform"], ["modulo"], [4], 100)


def test_load_table_progress_bar_runs():
    table = aliasing.load_table(["sequential"], ["roundrobin"], [2, 4], 1000, progress=True)
    assert table["max_over_mean"].tolist() == [1.0, 1.0]


def test_max_over_mean_grid_needs_a_swept_world_size():
    table = aliasing.load_table(["strided"], ["roundrobin"], [4], 1000)
    assert aliasing.max_over_mean_grid(table, 4) == {"strided": {"roundrobin": 4.0}}
    with pytest.raises(ValueError, match=r"no rows for world_size=8; table has \[4\]"):
        aliasing.max_over_mean_grid(table, 8)


def test_make_batches_splits_keys_into_one_kjt_per_rank():
    keys = torch.arange(24)
    batches = aliasing.make_batches(keys, 3, keys_per_sample=4)
    assert len(batches) == 3
    assert all(isinstance(b, KeyedJaggedTensor) for b in batches)
    assert torch.equal(torch.cat([b.values() for b in batches]), keys)
    assert batches[1].lengths().tolist() == [4, 4]
    assert batches[0].keys() == ["item_id"]
    with pytest.raises(ValueError, match="do not split"):
        aliasing.make_batches(torch.arange(10), 3)

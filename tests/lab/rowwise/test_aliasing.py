"""embnb.lab.rowwise.aliasing: per-rank load of key streams under each routing mode, the hot-key
floor's alpha sweep, ids into a table."""

import pandas as pd
import pytest
import torch

from embnb.data import make_keys, zipf_probs
from embnb.lab.rowwise import aliasing
from embnb.rowwise.routing import hash_key, owner_rank
from tests.lab.rowwise.plain_routing import fmix64

MODES = ["continuous", "roundrobin", "hash_roundrobin"]


def test_block_size_for_sizes_the_table_to_the_largest_key():
    assert aliasing.block_size_for(torch.arange(100), 4) == 25
    assert aliasing.block_size_for(torch.tensor([0, 100]), 4) == 26  # ceil(101/4)
    assert aliasing.block_size_for(torch.tensor([3]), 8) == 1
    assert aliasing.block_size_for(torch.empty(0, dtype=torch.int64), 4) == 1
    with pytest.raises(ValueError, match="keys >= 0"):
        aliasing.block_size_for(torch.tensor([-5, -1]), 4)
    # a table of its own size: the keys do not matter
    assert aliasing.block_size_for(torch.tensor([2**60]), 3, table_rows=100) == 34
    with pytest.raises(ValueError, match="table_rows must be an int >= 1, got 0"):
        aliasing.block_size_for(torch.tensor([1]), 3, table_rows=0)


def test_owners_defaults_continuous_to_blocks_of_the_key_range():
    keys = torch.arange(100)
    assert aliasing.owners(keys, 4, "continuous").tolist() == (keys // 25).tolist()
    assert (
        aliasing.owners(keys, 4, "continuous", block_size=10).tolist()
        == owner_rank(keys, 4, "continuous", 10).tolist()
    )
    assert torch.equal(aliasing.owners(keys, 4, "hash_roundrobin"), owner_rank(keys, 4, "hash_roundrobin"))


def test_owners_route_a_tables_ids_by_feistel_roundrobin_dense_and_balanced():
    """Strided ids (every one a multiple of W) pile onto one rank under roundrobin; the table's
    rows (ids reduced into it) spread over every rank, counts differing by at most one."""
    world_size, rows = 8, 1001
    keys = torch.arange(rows) * world_size  # ids past the table go into it (id % rows) first
    counts = aliasing.rank_counts(keys, world_size, "feistel_roundrobin", table_rows=rows)
    assert sorted(counts.tolist()) == [125] * 7 + [126]
    assert aliasing.rank_counts(keys, world_size, "roundrobin").tolist() == [rows] + [0] * 7
    with pytest.raises(ValueError, match="feistel_roundrobin routes a table's ids: give table_rows"):
        aliasing.owners(keys, world_size, "feistel_roundrobin")


@pytest.mark.parametrize("dist_type", MODES)
def test_rank_counts_count_every_key_once(dist_type):
    keys = make_keys("uniform", 5000, seed=1)
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


def test_worked_example_shows_the_key_and_hash_low_bits_side_by_side():
    keys = [0, 8, 13, 2**40 + 16]
    table = aliasing.worked_example(keys, 8, MODES, block_size=2**38)
    assert list(table.columns) == [
        "key",
        "key, low 3 bits",
        "fmix64, low 3 bits",
        "key % 8",
        "fmix64 % 8",
        "owner: continuous",
        "owner: roundrobin",
        "owner: hash_roundrobin",
    ]
    assert table["key, low 3 bits"].tolist() == ["000", "000", "101", "000"]
    assert table["key % 8"].tolist() == [0, 0, 5, 0]
    hashes = [h & (2**64 - 1) for h in hash_key(torch.tensor(keys)).tolist()]
    assert table["fmix64, low 3 bits"].tolist() == [format(h % 8, "03b") for h in hashes]
    assert table["fmix64 % 8"].tolist() == [h % 8 for h in hashes]
    assert table["fmix64 % 8"][0] == 0  # fmix64(0) == 0
    for mode in MODES:
        expected = owner_rank(torch.tensor(keys), 8, mode, 2**38).tolist()
        assert table[f"owner: {mode}"].tolist() == expected


def test_worked_example_shows_8_low_bits_when_w_is_not_a_power_of_two():
    table = aliasing.worked_example([1, 2, 300], 6, ["roundrobin"])
    assert table["key, low 8 bits"].tolist() == ["00000001", "00000010", "00101100"]  # 300 - 256 = 44
    assert table["key % 6"].tolist() == [1, 2, 0]


def test_load_table_covers_every_case_and_finds_aliasing():
    patterns = ["uniform", "strided", "tagged", "zipf"]
    streams = aliasing.KeyStreams(patterns, pattern_options={"zipf": {"alpha": 1.5}})
    table = aliasing.load_table(streams, MODES, [4, 8], num_keys=40_000)
    assert list(table.columns) == [
        "pattern",
        "dist_type",
        "world_size",
        "num_keys",
        "max_over_mean",
        "hot_key_floor",
    ]
    assert len(table) == len(patterns) * len(MODES) * 2
    assert set(table["dist_type"]) == set(MODES)
    at8 = table[table.world_size == 8]
    grid8 = {p: dict(zip(rows.dist_type, rows.max_over_mean)) for p, rows in at8.groupby("pattern")}
    assert grid8["strided"]["roundrobin"] == pytest.approx(4.0, rel=0.01)  # k * 12: 2 of 8 residues
    assert grid8["tagged"]["roundrobin"] == pytest.approx(8 / 3, rel=0.05)  # 3 tags
    for pattern in ("uniform", "strided", "tagged"):
        assert grid8[pattern]["hash_roundrobin"] < 1.1
    strided_rr = table[(table.pattern == "strided") & (table.dist_type == "roundrobin")]
    assert strided_rr["max_over_mean"].tolist() == [4.0, pytest.approx(4.0, rel=0.01)]  # W=4 divides 12
    # Zipf: every routing sits at or above the hot-key floor, near W * p1.
    zipf = table[(table.pattern == "zipf") & (table.world_size == 8)]
    p1 = float(zipf_probs(100_000, 1.5)[0])
    assert zipf["hot_key_floor"].iloc[0] == pytest.approx(8 * p1, rel=0.1)
    assert (zipf["max_over_mean"] >= zipf["hot_key_floor"] - 1e-9).all()
    assert (zipf["max_over_mean"] > 2.5).all()


def test_load_table_is_deterministic_and_passes_pattern_options():
    def sweep(alpha):
        streams = aliasing.KeyStreams(["zipf"], pattern_options={"zipf": {"alpha": alpha}})
        return aliasing.load_table(streams, ["hash_roundrobin"], [8], 20_000)

    mild, steep, again = sweep(1.1), sweep(2.0), sweep(2.0)
    assert steep.equals(again)
    assert steep["hot_key_floor"].iloc[0] > 2 * mild["hot_key_floor"].iloc[0]


def test_load_table_rejects_bad_arguments():
    with pytest.raises(ValueError, match="pattern_options for patterns not swept"):
        aliasing.KeyStreams(["uniform"], pattern_options={"zipf": {}})
    with pytest.raises(ValueError, match=r"table_rows for patterns not swept: \['zipf'\]"):
        aliasing.KeyStreams(["uniform"], table_rows={"zipf": 10})
    with pytest.raises(ValueError, match="unknown pattern"):
        aliasing.load_table(aliasing.KeyStreams(["nope"]), MODES, [4], 100)
    with pytest.raises(ValueError, match="not one of"):
        aliasing.load_table(aliasing.KeyStreams(["uniform"]), ["modulo"], [4], 100)


def test_load_table_progress_bar_runs():
    table = aliasing.load_table(
        aliasing.KeyStreams(["sequential"]), ["roundrobin"], [2, 4], 1000, progress=True
    )
    assert table["max_over_mean"].tolist() == [1.0, 1.0]


def test_load_table_maps_ids_into_the_table_before_its_blocks():
    def sweep(table_rows):
        streams = aliasing.KeyStreams(["sequential"], table_rows={"sequential": table_rows})
        return aliasing.load_table(streams, ["continuous"], [4], 1000)

    # sequential ids 0..999 in a table of 100 rows over 4 ranks: id % 100 puts
    # 10 ids on each row, blocks of 25 rows take 250 ids each
    assert sweep(100)["max_over_mean"].tolist() == [1.0]
    assert sweep(4000)["max_over_mean"].tolist() == [4.0]  # all in the first block of 1000 rows
    # 0..399 in 160 rows: rows 0..79 hold 3 ids, rows 80..159 hold 2; blocks of 40 rows: 120, 120, 80, 80
    odd = aliasing.rank_counts(torch.arange(400), 4, "continuous", table_rows=160)
    assert odd.tolist() == [120, 120, 80, 80]


def test_into_table_is_the_unsigned_modulo_or_the_hash_modulo():
    keys = torch.tensor([0, 7, 2**62 + 3, -1])
    assert aliasing.into_table(keys, 10).tolist() == [0, 7, (2**62 + 3) % 10, (2**64 - 1) % 10]
    hashed = aliasing.into_table(keys, 10, "hash").tolist()
    assert hashed == [fmix64(k) % 10 for k in keys.tolist()]
    with pytest.raises(ValueError, match="how 'crc' is not one of 'modulo', 'hash'"):
        aliasing.into_table(keys, 10, "crc")
    with pytest.raises(ValueError, match="table_rows"):
        aliasing.into_table(keys, 0)
    with pytest.raises(ValueError, match="not both"):
        aliasing.owners(keys[:2], 2, "continuous", block_size=4, table_rows=8)


def test_hash_noise_routes_distinct_keys_of_each_size_and_seed():
    noise = aliasing.hash_noise([10, 100], 4, [0, 1], "uniform")
    assert noise[["keys_per_rank", "seed"]].values.tolist() == [[10, 0], [10, 1], [100, 0], [100, 1]]
    assert noise["distinct_keys"].tolist() == [40, 40, 400, 400]  # 2**40 ids: no collision here
    for row in noise.itertuples():
        keys = make_keys("uniform", row.keys_per_rank * 4, seed=row.seed)
        counts = torch.bincount(owner_rank(keys, 4, "hash_roundrobin"), minlength=4)
        assert row.max_over_mean == pytest.approx(float(counts.max()) * 4 / len(keys))


def test_balls_into_bins_quantiles_match_the_two_bin_case():
    # two bins, 2n balls: max/mean = max(X, 2n - X) / n with X ~ Binomial(2n, 1/2),
    # whose median is 1 + (median of |X - n|) / n; for n = 50, |X - 50| <= 3 has
    # probability 0.6728 and <= 2 has 0.5405, so the median distance is 3.
    band = aliasing.balls_into_bins(50, 2, trials=20_000, quantiles=(0.5,), seed=1)
    assert band[0.5] == pytest.approx(1.06)
    wide = aliasing.balls_into_bins(50, 2, trials=20_000, quantiles=(0.05, 0.95), seed=1)
    assert wide[0.05] < band[0.5] < wide[0.95]


def test_zipf_over_seeds_deduplicates_within_each_step_only():
    runs = aliasing.zipf_over_seeds(4000, 4, ["roundrobin"], [0, 1], [1.5], keys_per_step=1000)
    assert runs["traffic"].tolist() == ["all lookups", "deduplicated per step"] * 2
    for seed in (0, 1):
        keys = make_keys("zipf", 4000, seed=seed, alpha=1.5)
        sent = torch.cat([torch.unique(step) for step in keys.split(1000)])  # each step's distinct keys
        counts = torch.bincount(sent % 4, minlength=4)
        row = runs[(runs.seed == seed) & (runs.traffic == "deduplicated per step")].iloc[0]
        assert row.max_over_mean == pytest.approx(float(counts.max()) * 4 / len(sent))
        assert row.hot_key_floor == aliasing.hot_key_floor(keys, 4)
    with pytest.raises(ValueError, match=r"keys_per_step must be in \[1, num_keys=100\], got 0"):
        aliasing.zipf_over_seeds(100, 4, ["roundrobin"], [0], [1.5], keys_per_step=0)


@pytest.mark.parametrize(
    ("below", "n", "expected"), [(0, 4, 2 / 16), (2, 4, 1.0), (1, 5, 12 / 32), (10, 10, 2 / 1024)]
)
def test_sign_test_is_the_two_sided_binomial_tail(below, n, expected):
    # hand-computed tails: P(X <= 0) = 1/16 for Binomial(4, 1/2), doubled; P(X <= 1) = 6/32 for n = 5
    first = [0.0] * below + [2.0] * (n - below)
    runs = pd.DataFrame(
        [{"seed": s, "dist_type": "a", "traffic": "all lookups", "max_over_mean": first[s]} for s in range(n)]
        + [{"seed": s, "dist_type": "b", "traffic": "all lookups", "max_over_mean": 1.0} for s in range(n)]
    )
    result = aliasing.sign_test(runs, "a", "b")
    assert (result["first_below"], result["seeds"]) == (below, n)
    assert result["p_value"] == pytest.approx(expected)
    with pytest.raises(ValueError, match=r"dist_types \['c'\] not in the runs"):
        aliasing.sign_test(runs, "a", "c")


def test_counted_placement_is_greedy_largest_first():
    keys = torch.tensor([7] * 5 + [3] * 4 + [9] * 3 + [1] * 3 + [2] * 2 + [4])  # counts 5 4 3 3 2 1
    # by hand: 5->r0, 4->r1, 3->r1 (7), 3->r0 (8), 2->r1 (9), 1->r0 (9)
    assert aliasing.counted_placement(keys, 2) == [9, 9]
    assert aliasing.counted_placement(torch.tensor([10**12, 10**12, 5]), 3) == [2, 1, 0]  # big ids


def test_zipf_over_alphas_rows_and_floor_against_counts():
    sweep = aliasing.zipf_over_seeds(
        4000, 4, ["roundrobin", "hash_roundrobin", aliasing.COUNTED], [0, 1], [0.8, 1.5]
    )
    assert len(sweep) == 2 * 2 * 3 and set(sweep.traffic) == {"all lookups"}  # no keys_per_step
    for row in sweep.itertuples():
        keys = make_keys("zipf", 4000, row.seed, alpha=row.alpha)
        top = max(torch.unique(keys, return_counts=True)[1].tolist())
        assert row.hottest_share == top / 4000
        assert row.hot_key_floor == max(1.0, 4 * top / 4000)
        assert row.max_over_mean >= row.hot_key_floor - 1e-12  # no placement splits a key

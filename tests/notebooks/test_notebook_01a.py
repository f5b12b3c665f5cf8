"""Notebook 01a (routing measured at length), executed for real with small parameters.

Each expectation is recomputed here from how the keys are built, from the plain-int routing rule
(tests/lab/rowwise/plain_routing.py, tests/sharder_ranks.owner_local), from random draws made here or from
the raw per-round and per-rank numbers the results record, not from the notebook's own code.
"""

import itertools
import math
import os
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from embnb.data import make_keys, zipf_probs
from embnb.lab.rowwise.routed_loads import case_ids
from tests.lab.rowwise.plain_routing import fmix64
from tests.sharder_ranks import owner_local

WORLD_SIZE = 8
WORLD_SIZES = [5, 6, 12]
STRIDE = 12
PIPELINE_TABLE_ROWS = [100_000_000, 2**27]
HASH_KEYS_PER_RANK = [100, 1_000, 10_000]
ZIPF_ALPHAS = [0.8, 1.05, 1.2, 1.5]
KV_WORLD_SIZE = 2
KV_KEYS_PER_RANK = 512
RESHARD_WORLD_SIZE = 3
ROUTED_WORLD_SIZES = [8, 32]
ROUTED_STRIDE = 8
ROUTED_ALPHA = 1.05
ROUTINGS = ("continuous", "roundrobin", "feistel_roundrobin")
PARAMETERS = {
    "world_size": WORLD_SIZE,
    "num_keys": 50_000,
    "world_sizes": WORLD_SIZES,
    "pipeline_table_rows": PIPELINE_TABLE_ROWS,
    "stride": STRIDE,
    "hash_keys_per_rank": HASH_KEYS_PER_RANK,
    "hash_seeds": 2,
    "zipf_alphas": ZIPF_ALPHAS,
    "zipf_sweep_seeds": 4,
    "kv_world_size": KV_WORLD_SIZE,
    "kv_pattern": "strided",
    "kv_keys_per_rank": KV_KEYS_PER_RANK,
    "embedding_dim": 8,
    "reshard_world_size": RESHARD_WORLD_SIZE,
    "kernel_sizes": [20_000],
    "kernel_threads": [1],
    "kernel_repeats": 3,
    "routed_world_sizes": ROUTED_WORLD_SIZES,
    "routed_ids_per_rank": 1024,
    "routed_bag_size": 16,
    "routed_num_embeddings": 65_536,
    "routed_embedding_dim": 16,
    "routed_stride": ROUTED_STRIDE,
    "routed_alpha": ROUTED_ALPHA,
    "routed_repeats": 2,
    "seed": 0,
}


@pytest.fixture(scope="module")
def run(execute):
    return execute("01a_routing_measured", PARAMETERS)


def kv_keys() -> list[int]:
    """The distinct keys the KV ranks looked up (strided, seed 0)."""
    total = KV_WORLD_SIZE * KV_KEYS_PER_RANK
    return sorted(set(make_keys("strided", total, seed=0, stride=STRIDE).tolist()))


def test_torchrec_and_tbe_refuse_an_id_past_the_table_or_read_row_zero(run):
    outcomes = [r["outcome"] for r in run.results["id_pipeline"]["out_of_range_lookup"]]
    assert outcomes[0].startswith("raised") and outcomes[1].startswith("raised")
    assert outcomes[2].startswith("returned; the bad id's bag equals row 0: True; logged: ")


def test_snowflake_ids_into_the_table_then_blocks(run):
    rows = run.results["id_pipeline"]["rows"]
    keys = make_keys("snowflake", PARAMETERS["num_keys"], seed=0).tolist()
    distinct = sorted(set(keys))
    world_sizes = {*WORLD_SIZES, WORLD_SIZE}
    assert len(rows) == len(PIPELINE_TABLE_ROWS) * 2 * len(world_sizes) * 2
    rows_used = {  # counted here with Python ints, once per table and mapping
        (n, how): len({fmix64(k) % n if how == "hash" else k % n for k in distinct})
        for n in PIPELINE_TABLE_ROWS
        for how in ("modulo", "hash")
    }
    raw = {w: max(Counter(k % w for k in keys).values()) * w / len(keys) for w in world_sizes}
    for r in rows:
        assert r["rows_used"] == rows_used[(r["table_rows"], r["into_table"])]
        if r["into_table"] == "hash":  # random rows: both routings near balanced
            assert r["max_over_mean"] < 1.12, r
        elif r["dist_type"] == "roundrobin" and r["table_rows"] % r["world_size"] == 0:
            # (id % rows) % W == id % W: the raw ids' aliasing, unchanged
            assert r["max_over_mean"] == pytest.approx(raw[r["world_size"]]), r
        if r["dist_type"] == "continuous":
            assert r["max_over_mean"] < 1.5, r
    sharing = {(r["table_rows"], r["into_table"]): r["ids_sharing_a_row"] for r in rows}
    for n in PIPELINE_TABLE_ROWS:
        assert sharing[(n, "modulo")] > 10 * sharing[(n, "hash")]


def test_hashing_noise_is_that_of_a_random_owner(run):
    noise = run.results["hash_noise"]["measured"]
    assert {p["keys_per_rank"] for p in noise} == set(HASH_KEYS_PER_RANK)
    rng = np.random.default_rng(12345)  # not the notebook's draws
    for n in HASH_KEYS_PER_RANK:
        picks = rng.multinomial(n * WORLD_SIZE, np.full(WORLD_SIZE, 1 / WORLD_SIZE), size=20_000)
        low, high = np.quantile(picks.max(axis=1) / n, [0.001, 0.999])
        for point in (p for p in noise if p["keys_per_rank"] == n):
            assert low <= point["max_over_mean"] <= high, (n, point, low, high)
    assert min(p["max_over_mean"] for p in noise if p["keys_per_rank"] == 100) > 1.02


def test_zipf_alpha_sweep_finds_where_the_floor_binds(run):
    sweep = run.results["zipf_alpha_sweep"]
    runs = pd.DataFrame(sweep["runs"])
    assert sorted(runs.alpha.unique()) == ZIPF_ALPHAS
    for r in runs.itertuples():
        expected = WORLD_SIZE * float(zipf_probs(100_000, r.alpha)[0])  # W * p1 from the distribution
        assert r.w_times_p1 == pytest.approx(expected, rel=0.1)
        assert r.hot_key_floor == max(1.0, r.w_times_p1)
        assert r.max_over_mean >= r.hot_key_floor - 1e-9  # no placement splits a key
    binding = [a for a in ZIPF_ALPHAS if WORLD_SIZE * float(zipf_probs(100_000, a)[0]) > 1]
    assert sweep["binds_from_alpha"] == min(binding)
    stats = runs.groupby(["alpha", "dist_type"]).max_over_mean.agg(["median", "min", "max"])
    floor = runs.groupby("alpha").hot_key_floor.median()
    blind = ("roundrobin", "hash_roundrobin")
    for alpha in ZIPF_ALPHAS:
        # the page: the counted placement reaches the floor; the blind modes stay above it
        counted = stats.loc[(alpha, "counted placement (LPT)"), "median"]
        assert counted == pytest.approx(floor[alpha], rel=0.01)
        assert all(stats.loc[(alpha, d), "median"] > counted for d in blind)
    overlap = all(
        max(stats.loc[(a, d), "min"] for d in blind) <= min(stats.loc[(a, d), "max"] for d in blind)
        for a in ZIPF_ALPHAS
    )
    assert sweep["blind_ranges_overlap_at_every_alpha"] is overlap is True


def test_kv_run_served_every_key_once(run):
    kv = run.results["kv"]
    total = KV_WORLD_SIZE * KV_KEYS_PER_RANK
    assert kv["keys_looked_up"] == total
    assert set(kv["keys_served"]) == {"continuous", "roundrobin", "hash_roundrobin"}
    for dist_type, served in kv["keys_served"].items():
        assert len(served) == KV_WORLD_SIZE and sum(served) == total, dist_type
    # strided keys k * 12: even, so roundrobin over 2 ranks sends all to rank 0
    assert kv["keys_served"]["roundrobin"] == [total] + [0] * (KV_WORLD_SIZE - 1)
    assert max(kv["keys_served"]["hash_roundrobin"]) < 1.15 * total / KV_WORLD_SIZE
    assert kv["rows_match"] is True
    for dist_type, rows in kv["rows_held"].items():
        assert sum(rows) == len(kv_keys()), dist_type


def test_the_replay_of_dynamicembs_loader_drops_rows_at_the_same_w_and_strands_them_at_a_new_w(run):
    loaders = run.results["loaders"]
    assert loaders["dynamicemb"]["commit"].startswith("e4fc876")
    assert "keys % world_size == rank" in loaders["dynamicemb"]["filter"]
    keys = kv_keys()
    by_w = {row["world_size"]: row for row in loaders["rows"]}
    assert set(by_w) == {KV_WORLD_SIZE, RESHARD_WORLD_SIZE}
    for row in by_w.values():
        assert row["rows_saved"] == row["embnb_rows_loaded"] == len(keys)
        assert row["embnb_rows_off_owner"] == row["embnb_rows_dropped"] == 0
    same = by_w[KV_WORLD_SIZE]  # rank r reads its own file (hash owner r) and keeps key % W == r
    dropped = sum(k % KV_WORLD_SIZE != fmix64(k) % KV_WORLD_SIZE for k in keys)
    assert (same["dynamicemb_rows_dropped"], same["dynamicemb_rows_off_owner"]) == (dropped, 0)
    assert dropped > 0.4 * len(keys)
    new = by_w[RESHARD_WORLD_SIZE]  # every rank reads every file: nothing dropped, most off owner
    off = sum(k % RESHARD_WORLD_SIZE != fmix64(k) % RESHARD_WORLD_SIZE for k in keys)
    assert (new["dynamicemb_rows_dropped"], new["dynamicemb_rows_off_owner"]) == (0, off)
    assert off > 0.4 * len(keys)


def test_checkpoint_reshard_conserves_rows_and_a_mismatch_raises(run):
    keys = kv_keys()
    new = {row["world_size"]: row for row in run.results["loaders"]["rows"]}[RESHARD_WORLD_SIZE]
    assert new["embnb_rows_loaded"] == len(keys) and new["embnb_rows_exact"] is True
    moved = sum(fmix64(k) % KV_WORLD_SIZE != fmix64(k) % RESHARD_WORLD_SIZE for k in keys)
    assert new["rows_moved_fraction"] == pytest.approx(moved / len(keys))
    third, sigma = 1 / 3, (2 / 9 / len(keys)) ** 0.5  # jump hash 2 -> 3 moves about a third
    assert abs(new["jump_hash_moved_fraction"] - third) < 5 * sigma
    mismatch = run.results["mismatch"]
    assert mismatch["raised"] is True and mismatch["asked_dist_type"] == "roundrobin"
    assert "'hash_roundrobin'" in mismatch["message"] and "'roundrobin'" in mismatch["message"]


def test_the_kernel_ratio_carries_its_range_threads_and_parity(run):
    kernel = run.results["kernel"]
    assert kernel["device"] == "cpu"
    rows = kernel["rows"]
    assert all(r["identical"] and r["world_size"] == WORLD_SIZE and r["threads"] == 1 for r in rows)
    assert {r["num_keys"] for r in rows} == set(PARAMETERS["kernel_sizes"])
    assert all((r["embnb_over_fbgemm"] is not None) == (r["dist_type"] == "continuous") for r in rows)
    ratios = kernel["ratios"]
    assert len(ratios) == sum(r["dist_type"] == "continuous" for r in rows) >= 1
    for ratio, row in zip(ratios, (r for r in rows if r["dist_type"] == "continuous")):
        per_round = [f / e for f, e in zip(row["fbgemm_rounds_s"], row["embnb_rounds_s"])]
        assert len(per_round) == PARAMETERS["kernel_repeats"] and ratio["threads"] == 1
        assert (ratio["low"], ratio["high"]) == pytest.approx((min(per_round), max(per_round)))
        assert ratio["reaches_parity"] is (min(per_round) <= 1 <= max(per_round))


def routed(run) -> dict:
    """Per (stream, W, routing): its ranks' ids, ids replayed and lookup ms, in rank order."""
    cases = {}
    for r in sorted(run.results["routed"]["ranks"], key=lambda r: r["rank"]):
        case = cases.setdefault((r["case"], r["world_size"], r["routing"]), {})
        for key in ("ids", "ids_replayed", "lookup_ms"):
            case.setdefault(key, []).append(r[key])
    for case in cases.values():
        case["ids_max_over_mean"] = max(case["ids"]) * len(case["ids"]) / sum(case["ids"])
    return cases


def test_routed_ids_per_rank_are_the_routings_rules_in_plain_ints(run):
    cases = routed(run)
    n, per_rank = PARAMETERS["routed_num_embeddings"], PARAMETERS["routed_ids_per_rank"]
    assert len(cases) == 3 * len(ROUTED_WORLD_SIZES) * len(ROUTINGS)
    for stream, w in itertools.product(("frequency", "strided", "hashed"), ROUTED_WORLD_SIZES):
        ids = Counter(case_ids(stream, w * per_rank, n, ROUTED_STRIDE, ROUTED_ALPHA, 0).tolist())
        for routing in ROUTINGS:
            c = cases[(stream, w, routing)]
            counts = Counter()
            for i, lookups in ids.items():
                counts[owner_local(routing, i, n, w)[0]] += lookups
            assert c["ids"] == [counts[r] for r in range(w)], (stream, w, routing)
            assert c["ids_replayed"] == c["ids"]
            assert len(c["lookup_ms"]) == w and min(c["lookup_ms"]) > 0


def test_what_each_routing_does_to_each_stream(run):
    cases, per_rank = routed(run), PARAMETERS["routed_ids_per_rank"]
    ratio = {k: c["ids_max_over_mean"] for k, c in cases.items()}
    p1 = float(zipf_probs(PARAMETERS["routed_num_embeddings"], ROUTED_ALPHA)[0])
    for w in ROUTED_WORLD_SIZES:
        total = w * per_rank
        blind = [ratio[("frequency", w, r)] for r in ("roundrobin", "feistel_roundrobin")]
        assert ratio[("frequency", w, "continuous")] > 2 * max(blind)
        hottest = p1 * total - 5 * math.sqrt(total * p1 * (1 - p1))
        for r in ("roundrobin", "feistel_roundrobin"):
            assert max(cases[("frequency", w, r)]["ids"]) >= hottest
        assert ratio[("strided", w, "roundrobin")] == pytest.approx(math.gcd(ROUTED_STRIDE, w), rel=0.1)
        assert ratio[("strided", w, "continuous")] < 1.5 and ratio[("strided", w, "feistel_roundrobin")] < 1.5
        assert all(ratio[("hashed", w, r)] < 1.25 for r in ROUTINGS)


def test_the_step_verdicts_are_recomputed_from_the_per_rank_times(run):
    """The least balanced routing's slowest rank against the others', told apart only beyond the
    rank-to-rank spread that balanced ids show at the same W; no ordering is asserted."""
    cases = routed(run)
    spread = {}
    for w in ROUTED_WORLD_SIZES:
        balanced = [
            max(c["lookup_ms"]) * w / sum(c["lookup_ms"])
            for key, c in cases.items()
            if key[1] == w and c["ids_max_over_mean"] < 1.1
        ]
        spread[w] = max(balanced)
        assert run.results["routed"]["balanced_spread"][str(w)] == pytest.approx(spread[w])
    expected = []
    for stream, w in itertools.product(("frequency", "strided", "hashed"), ROUTED_WORLD_SIZES):
        group = [cases[(stream, w, r)] for r in ROUTINGS]
        ids = [c["ids_max_over_mean"] for c in group]
        if max(ids) / min(ids) < 1.1:
            continue
        worst = int(np.argmax(ids))
        others = [max(c["lookup_ms"]) for i, c in enumerate(group) if i != worst]
        ratio = max(group[worst]["lookup_ms"]) / max(others)
        expected.append((stream, w, ROUTINGS[worst], pytest.approx(ratio), ratio > spread[w]))
    got = [
        (v["case"], v["world_size"], v["least_balanced"], v["slowest_over_others"], v["told_apart"])
        for v in run.results["routed"]["verdicts"]
    ]
    assert got == expected
    # the counts decide which routing is least balanced: torchrec's blocks on frequency ids, id % W on strides
    assert [(g[0], g[2]) for g in got] == [("frequency", "continuous")] * 2 + [("strided", "roundrobin")] * 2


def test_summary_and_figures(run):
    results = run.results
    summary = results["summary"]  # the headline as data: each value read back from its table
    assert summary["bucketize kernel timed on"] == results["kernel"]["machine"]
    saved = next(r for r in results["loaders"]["rows"] if r["world_size"] == KV_WORLD_SIZE)
    assert summary["embnb's replay of dynamicemb's loader at the saved W"] == {
        "world_size": KV_WORLD_SIZE,
        "rows_saved": saved["rows_saved"],
        "dynamicemb_rows_dropped": saved["dynamicemb_rows_dropped"],
    }
    ratios = results["kernel"]["ratios"]
    reach = [r for r in ratios if r["reaches_parity"]]
    assert summary["bucketize ratios whose range reaches parity"] == {"reach": len(reach), "of": len(ratios)}
    verdicts = results["routed"]["verdicts"]
    told = [v for v in verdicts if v["told_apart"]]
    assert summary["routed replay, (stream, W) pairs told apart"] == {
        "told_apart": len(told),
        "of": len(verdicts),
    }
    figures = run.figures()
    assert len(figures) == 3  # hashing's noise, the alpha sweep, the routed replay (3 panels)
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert os.path.getsize(figures[-1]) > 10_000

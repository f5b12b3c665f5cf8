"""Notebook 01 (modulo aliasing), executed for real with small parameters.

The expectations are independent of the notebook: they follow from how the
key streams are built (embnb.data), from counting residues, from the plain
Python routing rule (embnb.lab.rowwise.reference) and from random draws made
here, not from re-running the notebook's own code.
"""

import itertools
import math
import os
from collections import Counter

import numpy as np
import pytest

from embnb.data import make_keys, zipf_probs
from embnb.lab.rowwise.reference import fmix64
from embnb.lab.rowwise.routed_loads import case_ids
from tests.sharder_ranks import owner_local

WORLD_SIZE = 8
WORLD_SIZES = [5, 6, 12]  # with WORLD_SIZE: co-prime to the stride, and sharing 2, 4, 12 with it
STRIDE = 12
KV_WORLD_SIZE = 2
KV_KEYS_PER_RANK = 512
RESHARD_WORLD_SIZE = 3
ZIPF_ALPHA = 1.5
ZIPF_SEEDS = 8
ZIPF_ALPHAS = [0.8, 1.05, 1.2, 1.5]
PIPELINE_TABLE_ROWS = [100_000_000, 2**27]
SNOWFLAKE_TABLE_ROWS = 100_000_000  # the notebook's default
HASH_KEYS_PER_RANK = [100, 1_000, 10_000]
ROUTED_WORLD_SIZES = [8, 32]  # the notebook replays 8 and 64 (issue #47); 32 shows the same at half the ranks
ROUTED_STRIDE = 8
ROUTED_ALPHA = 1.05
ROUTINGS = ("continuous", "roundrobin", "feistel_roundrobin")
PARAMETERS = {
    "world_size": WORLD_SIZE,
    "num_keys": 50_000,
    "world_sizes": WORLD_SIZES,
    "stride": STRIDE,
    "zipf_alpha": ZIPF_ALPHA,
    "zipf_seeds": ZIPF_SEEDS,
    "zipf_alphas": ZIPF_ALPHAS,
    "zipf_sweep_seeds": 4,
    "pipeline_table_rows": PIPELINE_TABLE_ROWS,
    "keys_per_step": 2048,
    "hash_keys_per_rank": HASH_KEYS_PER_RANK,
    "hash_seeds": 2,
    "kv_world_size": KV_WORLD_SIZE,
    "kv_pattern": "strided",
    "kv_keys_per_rank": KV_KEYS_PER_RANK,
    "embedding_dim": 8,
    "reshard_world_size": RESHARD_WORLD_SIZE,
    "seed": 0,
    "kernel_sizes": [20_000],
    "kernel_threads": [1, 0],
    "kernel_repeats": 2,
    "train_world_size": 2,
    "train_steps": 3,
    "train_num_embeddings": 1024,
    "routed_world_sizes": ROUTED_WORLD_SIZES,
    "routed_ids_per_rank": 1024,
    "routed_bag_size": 16,
    "routed_num_embeddings": 65_536,
    "routed_embedding_dim": 16,
    "routed_stride": ROUTED_STRIDE,
    "routed_alpha": ROUTED_ALPHA,
    "routed_repeats": 2,
}
SPREAD = ["uniform", "sequential", "strided", "tagged", "snowflake"]  # not hot


@pytest.fixture(scope="module")
def run(execute):
    return execute("01_modulo_aliasing", PARAMETERS)


def residues_reached(stride: int, world_size: int) -> int:
    """How many residues mod W the multiples of `stride` take, by counting."""
    return len({k * stride % world_size for k in range(world_size)})


def kv_keys() -> list[int]:
    """The distinct keys the KV ranks looked up (strided, seed 0)."""
    total = KV_WORLD_SIZE * KV_KEYS_PER_RANK
    return sorted(set(make_keys("strided", total, seed=0, stride=STRIDE).tolist()))


def test_roundrobin_follows_the_gcd_rule_on_streams_that_do_not_know_w(run):
    rule = run.results["gcd_rule"]
    assert set(rule) == {"strided", "snowflake"}
    for pattern, stride in (("strided", STRIDE), ("snowflake", 4096)):
        assert sorted(map(int, rule[pattern])) == sorted({*WORLD_SIZES, WORLD_SIZE})
        for w, point in rule[pattern].items():
            expected = int(w) / residues_reached(stride, int(w))  # every reached residue equally often
            assert point["rule"] == expected, (pattern, w)
            # sampling noise of 50,000 keys over the reached residues; snowflake
            # ids with a nonzero sequence number spread a little more
            assert point["measured"] == pytest.approx(expected, rel=0.05)
    # the same stream: balanced at W=5 (co-prime), all on one rank at W=12
    assert rule["strided"]["5"]["measured"] < 1.05
    assert rule["strided"]["12"]["measured"] == 12.0


def test_torchrec_and_tbe_refuse_an_id_past_the_table_or_read_row_zero(run):
    outcomes = [r["outcome"] for r in run.results["id_pipeline"]["out_of_range_lookup"]]
    assert outcomes[0].startswith("raised") and outcomes[1].startswith("raised")
    assert outcomes[2].startswith("returned; the bad id's bag equals row 0: True; logged: ")


def test_snowflake_ids_into_the_table_then_blocks(run):
    rows = run.results["id_pipeline"]["rows"]
    sweep = {
        (r["pattern"], r["dist_type"], r["world_size"]): r["max_over_mean"] for r in run.results["sweep"]
    }
    keys = make_keys("snowflake", PARAMETERS["num_keys"], seed=0).tolist()
    distinct = sorted(set(keys))
    world_sizes = {*WORLD_SIZES, WORLD_SIZE}
    assert len(rows) == len(PIPELINE_TABLE_ROWS) * 2 * len(world_sizes) * 2
    rows_used = {  # counted here with Python ints, once per table and mapping
        (n, how): len({fmix64(k) % n if how == "hash" else k % n for k in distinct})
        for n in PIPELINE_TABLE_ROWS
        for how in ("modulo", "hash")
    }
    for r in rows:
        assert r["rows_used"] == rows_used[(r["table_rows"], r["into_table"])]
        if r["into_table"] == "hash":  # random rows: both routings near balanced
            assert r["max_over_mean"] < 1.12, r
        elif r["dist_type"] == "roundrobin" and r["table_rows"] % r["world_size"] == 0:
            # (id % rows) % W == id % W: the raw ids' aliasing, unchanged
            assert r["max_over_mean"] == sweep[("snowflake", "roundrobin", r["world_size"])], r
        if r["dist_type"] == "continuous":  # ids in the table: blocks no longer alias like key % W
            assert r["max_over_mean"] < 1.5, r
    # id % rows keeps the ids' shared factor: far more ids share a row than under the hash
    sharing = {(r["table_rows"], r["into_table"]): r["ids_sharing_a_row"] for r in rows}
    for n in PIPELINE_TABLE_ROWS:
        assert sharing[(n, "modulo")] > 10 * sharing[(n, "hash")]
    # the sweep's continuous snowflake column routes id % snowflake_table_rows in blocks
    block = -(-SNOWFLAKE_TABLE_ROWS // WORLD_SIZE)
    per_rank = Counter(k % SNOWFLAKE_TABLE_ROWS // block for k in keys)
    expected = max(per_rank.values()) * WORLD_SIZE / len(keys)
    assert sweep[("snowflake", "continuous", WORLD_SIZE)] == pytest.approx(expected)


def test_hash_roundrobin_balances_every_stream_without_hot_keys(run):
    ratios = run.results["max_over_mean"]
    for pattern in SPREAD:
        assert 1.0 <= ratios[pattern]["hash_roundrobin"] < 1.12, pattern
    # tags 1, 2, 5 in the low 3 bits: 3 of 8 residues under roundrobin
    assert ratios["tagged"]["roundrobin"] == pytest.approx(WORLD_SIZE / 3, rel=0.05)


def test_hashing_noise_is_that_of_a_random_owner(run):
    noise = run.results["hash_noise"]["measured"]
    assert {p["keys_per_rank"] for p in noise} == set(HASH_KEYS_PER_RANK)
    rng = np.random.default_rng(12345)  # not the notebook's draws
    for n in HASH_KEYS_PER_RANK:
        # max/mean when each key picks a rank at random, 20,000 times
        picks = rng.multinomial(n * WORLD_SIZE, np.full(WORLD_SIZE, 1 / WORLD_SIZE), size=20_000)
        ratios = picks.max(axis=1) / n
        low, high = np.quantile(ratios, [0.001, 0.999])
        for point in (p for p in noise if p["keys_per_rank"] == n):
            assert low <= point["max_over_mean"] <= high, (n, point, low, high)
    # and the noise is real: at 100 keys per rank it is far from balanced
    assert min(p["max_over_mean"] for p in noise if p["keys_per_rank"] == 100) > 1.02


def test_hashing_does_not_fix_hot_keys_and_is_no_worse_on_them(run):
    results = run.results
    expected_floor = WORLD_SIZE * float(zipf_probs(100_000, ZIPF_ALPHA)[0])
    assert results["zipf_hot_key_floor"] == pytest.approx(expected_floor, rel=0.1)
    runs = results["zipf_seeds"]
    assert {r["seed"] for r in runs} == set(range(ZIPF_SEEDS))
    for r in runs:
        if r["traffic"] == "all lookups":
            assert r["max_over_mean"] >= r["hot_key_floor"] - 1e-9  # no routing splits a key
    pairs = {(r["seed"], r["dist_type"], r["traffic"]): r["max_over_mean"] for r in runs}
    for seed, dist_type in itertools.product(range(ZIPF_SEEDS), ("roundrobin", "hash_roundrobin")):
        # sending each distinct key once a step takes load off the hot rank
        assert pairs[(seed, dist_type, "deduplicated per step")] < pairs[(seed, dist_type, "all lookups")]
    # the sign test, recomputed by enumerating every outcome of fair coins
    hash_, modulo = (
        [pairs[(s, d, "all lookups")] for s in range(ZIPF_SEEDS)] for d in ("hash_roundrobin", "roundrobin")
    )
    below = sum(h < m for h, m in zip(hash_, modulo))
    n = sum(h != m for h, m in zip(hash_, modulo))
    extreme = sum(
        abs(sum(flips) - n / 2) >= abs(below - n / 2) for flips in itertools.product((0, 1), repeat=n)
    )
    sign = results["zipf_sign_test"]
    assert (sign["first_below"], sign["seeds"]) == (below, n)
    assert sign["p_value"] == pytest.approx(extreme / 2**n)
    assert sign["p_value"] > 0.05  # what the prose says: the seeds do not tell the modes apart


def test_zipf_alpha_sweep_finds_where_the_floor_binds(run):
    sweep = run.results["zipf_alpha_sweep"]
    per_alpha = {r["alpha"]: r for r in sweep["per_alpha"]}
    assert sorted(per_alpha) == ZIPF_ALPHAS
    for alpha, r in per_alpha.items():
        expected = WORLD_SIZE * float(zipf_probs(100_000, alpha)[0])  # W * p1 from the distribution
        assert r["w_times_p1"] == pytest.approx(expected, rel=0.1)
        assert r["hot_key_floor"] == max(1.0, r["w_times_p1"])
    for run_ in sweep["runs"]:
        assert run_["max_over_mean"] >= run_["hot_key_floor"] - 1e-9  # no placement splits a key
    # binds where W * p1 > 1, computed from zipf_probs here (0.86 at 1.05, 1.57 at 1.2 for W=8)
    binding = [a for a in ZIPF_ALPHAS if WORLD_SIZE * float(zipf_probs(100_000, a)[0]) > 1]
    assert sweep["binds_from_alpha"] == min(binding)
    blind = ("roundrobin", "hash_roundrobin")
    for alpha, r in per_alpha.items():
        # the prose: the counted placement reaches the floor; the blind modes stay above it
        assert r["counted placement (LPT)"]["median"] == pytest.approx(r["hot_key_floor"], rel=0.01)
        for d in blind:
            assert r[d]["median"] > r["counted placement (LPT)"]["median"]
        # and roundrobin and hash_roundrobin overlap over seeds at every alpha
        assert max(r[d]["low"] for d in blind) <= min(r[d]["high"] for d in blind), alpha
    assert sweep["blind_ranges_overlap_at_every_alpha"] is True
    for d in blind:
        excess = {a: r[d]["excess"] for a, r in per_alpha.items()}
        assert sweep["largest_excess_alpha"][d] == max(excess, key=excess.get)
    assert f"binds (W p1 > 1) from alpha {sweep['binds_from_alpha']}" in run.results["summary"]


def test_kv_run_served_every_key_once(run):
    kv = run.results["kv"]
    total = KV_WORLD_SIZE * KV_KEYS_PER_RANK
    assert kv["keys_looked_up"] == total
    assert set(kv["keys_served"]) == {"continuous", "roundrobin", "hash_roundrobin"}
    for dist_type, served in kv["keys_served"].items():
        assert len(served) == KV_WORLD_SIZE
        assert sum(served) == total, dist_type
    # strided keys k * 12: even, so roundrobin over 2 ranks sends all to rank 0
    assert kv["keys_served"]["roundrobin"] == [total] + [0] * (KV_WORLD_SIZE - 1)
    hashed = kv["keys_served"]["hash_roundrobin"]
    assert max(hashed) < 1.15 * total / KV_WORLD_SIZE
    assert kv["rows_match"] is True
    for dist_type, rows in kv["rows_held"].items():
        assert sum(rows) == len(kv_keys()), dist_type


def test_dynamicemb_drops_rows_at_the_same_w_and_strands_them_at_a_new_w(run):
    loaders = run.results["loaders"]
    assert loaders["dynamicemb"]["commit"].startswith("e4fc876")
    assert "get_loading_files" in loaders["dynamicemb"]["files"]
    assert "keys % world_size == rank" in loaders["dynamicemb"]["filter"]
    keys = kv_keys()
    by_w = {row["world_size"]: row for row in loaders["rows"]}
    assert set(by_w) == {KV_WORLD_SIZE, RESHARD_WORLD_SIZE}  # the same W and a new one
    for row in by_w.values():
        assert row["rows_saved"] == row["embnb_rows_loaded"] == len(keys)
        assert row["embnb_rows_off_owner"] == row["embnb_rows_dropped"] == 0
    # the same W: rank r reads its own file (hash owner r) and keeps key % W == r
    same = by_w[KV_WORLD_SIZE]
    dropped = sum(k % KV_WORLD_SIZE != fmix64(k) % KV_WORLD_SIZE for k in keys)
    assert (same["dynamicemb_rows_dropped"], same["dynamicemb_rows_off_owner"]) == (dropped, 0)
    assert same["dynamicemb_rows_loaded"] == len(keys) - dropped
    assert dropped > 0.4 * len(keys)
    # a new W: every rank reads every file; nothing dropped, most rows off their owner
    new = by_w[RESHARD_WORLD_SIZE]
    off = sum(k % RESHARD_WORLD_SIZE != fmix64(k) % RESHARD_WORLD_SIZE for k in keys)
    assert (new["dynamicemb_rows_dropped"], new["dynamicemb_rows_off_owner"]) == (0, off)
    assert new["dynamicemb_rows_loaded"] == len(keys)
    assert off > 0.4 * len(keys)


def test_checkpoint_reshard_conserves_rows_and_counts_the_moves(run):
    ckpt = run.results["checkpoint"]
    keys = kv_keys()
    assert ckpt["dist_type"] == "hash_roundrobin"
    assert ckpt["saved_world_size"] == KV_WORLD_SIZE
    assert len(ckpt["rows_saved"]) == KV_WORLD_SIZE
    assert len(ckpt["rows_loaded"]) == RESHARD_WORLD_SIZE
    assert sum(ckpt["rows_saved"]) == sum(ckpt["rows_loaded"]) == ckpt["distinct_keys_loaded"] == len(keys)
    assert ckpt["every_key_on_owner"] is True
    assert ckpt["rows_exact"] is True
    moved = sum(fmix64(k) % KV_WORLD_SIZE != fmix64(k) % RESHARD_WORLD_SIZE for k in keys)
    assert ckpt["rows_moved_fraction"] == pytest.approx(moved / len(keys))
    # jump hash from 2 to 3 buckets moves about the new bucket's third (5 binomial sigmas)
    third, sigma = 1 / 3, (2 / 9 / len(keys)) ** 0.5
    assert abs(ckpt["jump_hash_moved_fraction"] - third) < 5 * sigma


def test_dist_type_mismatch_raised(run):
    mismatch = run.results["mismatch"]
    assert mismatch["raised"] is True
    assert mismatch["asked_dist_type"] == "roundrobin"
    assert "'hash_roundrobin'" in mismatch["message"]
    assert "'roundrobin'" in mismatch["message"]


def test_summary_figures_and_explorer(run):
    summary = run.results["summary"]
    assert summary.startswith(f"strided (stride {STRIDE}) under roundrobin: W=5 1.0")
    assert "W=6 6.00" in summary and "W=12 12.00" in summary
    assert "hashing does not fix hot keys" in summary
    assert f"reloaded at W={KV_WORLD_SIZE} (same W): dynamicemb's loader drops" in summary
    figures = run.figures()
    # heatmap, trend, hash noise, zipf bars, zipf seeds, zipf alpha sweep, KV bars, measured
    assert len(figures) == 8
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert run.widgets_shown_by("LoadExplorer(") == 1


def test_kernel_table_checks_outputs_before_timing_at_each_thread_count(run):
    kernel = run.results["kernel"]
    assert kernel["device"] == "cpu"
    rows = kernel["rows"]
    assert {r["dist_type"] for r in rows} == {"continuous", "hash_roundrobin"}
    assert all(r["identical"] and r["world_size"] == WORLD_SIZE for r in rows)
    assert {r["num_keys"] for r in rows} == set(PARAMETERS["kernel_sizes"])  # exactly the keys asked for
    # every case at one thread and at all cores, the thread count in each row
    assert sorted((r["dist_type"], r["threads"]) for r in rows) == sorted(
        itertools.product(("continuous", "hash_roundrobin"), sorted({1, os.cpu_count()}))
    )
    # FBGEMM has a continuous mode only: it is the peer there and nowhere else.
    assert all((r["embnb_over_fbgemm"] is not None) == (r["dist_type"] == "continuous") for r in rows)


def test_the_fbgemm_ratio_is_stated_with_its_range_over_rounds(run):
    rows = [r for r in run.results["kernel"]["rows"] if r["embnb_over_fbgemm"] is not None]
    sentence = run.results["kernel"]["fbgemm_ratio_sentence"]
    assert rows
    for r in rows:
        per_round = [f / e for f, e in zip(r["fbgemm_rounds_s"], r["embnb_rounds_s"])]
        assert len(per_round) == PARAMETERS["kernel_repeats"]
        assert (r["embnb_over_fbgemm_low"], r["embnb_over_fbgemm_high"]) == pytest.approx(
            (min(per_round), max(per_round))
        )
        if r["threads"] == 1:
            assert f"{r['embnb_over_fbgemm']:.2f}x ({min(per_round):.2f}-{max(per_round):.2f}," in sentence


def test_the_page_core_agrees_with_the_library(run):
    """Section 1's rule, written in the page's cell, against embnb.rowwise on the same keys."""
    assert run.results["page_core_agrees"] == dict.fromkeys(
        ("fmix64", "continuous", "roundrobin", "hash_roundrobin"), True
    )


def routed(run) -> dict:
    return {(c["case"], c["world_size"], c["routing"]): c for c in run.results["routed"]["cases"]}


def test_routed_ids_per_rank_are_the_routings_rules_in_plain_ints(run):
    """Section 8's counts, recomputed from each stream's ids with the rule each routing promises
    (tests/sharder_ranks.owner_local: plain ints, the Feistel network written again); the
    replayed lookups received the same ids, and every rank was timed."""
    cases = routed(run)
    n, per_rank = PARAMETERS["routed_num_embeddings"], PARAMETERS["routed_ids_per_rank"]
    assert len(cases) == 3 * len(ROUTED_WORLD_SIZES) * len(ROUTINGS)
    for stream, w in itertools.product(("frequency", "strided", "hashed"), ROUTED_WORLD_SIZES):
        ids = Counter(case_ids(stream, w * per_rank, n, ROUTED_STRIDE, ROUTED_ALPHA, 0).tolist())
        for routing in ROUTINGS:
            c = cases[(stream, w, routing)]
            counts = Counter()  # each distinct id's owner once, weighted by its lookups
            for i, lookups in ids.items():
                counts[owner_local(routing, i, n, w)[0]] += lookups
            assert c["ids_per_rank"] == [counts[r] for r in range(w)], (stream, w, routing)
            assert c["ids_replayed"] == c["ids_per_rank"]
            storage = n if routing == "continuous" else w * -(-n // w)
            assert sum(c["rows_per_rank"]) == storage and len(c["lookup_ms"]) == w
            assert min(c["lookup_ms"]) > 0
            assert c["ids_max_over_mean"] == pytest.approx(max(c["ids_per_rank"]) * w / (w * per_rank))


def test_what_each_routing_does_to_each_stream(run):
    """The summary's claims per stream, from the counts (the layouts; no timing involved)."""
    cases, per_rank = routed(run), PARAMETERS["routed_ids_per_rank"]
    ratio = {k: c["ids_max_over_mean"] for k, c in cases.items()}
    p1 = float(zipf_probs(PARAMETERS["routed_num_embeddings"], ROUTED_ALPHA)[0])
    for w in ROUTED_WORLD_SIZES:
        total = w * per_rank
        # frequency: torchrec's blocks pile the hot ids onto rank 0; round-robin spreads them, but
        # not below the hottest id's own weight (5 binomial sigmas under its expected count)
        blind = [ratio[("frequency", w, r)] for r in ("roundrobin", "feistel_roundrobin")]
        assert ratio[("frequency", w, "continuous")] > 2 * max(blind)
        assert cases[("frequency", w, "continuous")]["busiest_rank"] == 0
        hottest = p1 * total - 5 * math.sqrt(total * p1 * (1 - p1))
        for r in ("roundrobin", "feistel_roundrobin"):
            assert max(cases[("frequency", w, r)]["ids_per_rank"]) >= hottest
        # strided: id % W reaches W / gcd(stride, W) ranks; the others spread
        assert ratio[("strided", w, "roundrobin")] == pytest.approx(math.gcd(ROUTED_STRIDE, w), rel=0.1)
        assert ratio[("strided", w, "continuous")] < 1.5 and ratio[("strided", w, "feistel_roundrobin")] < 1.5
        # hashed: balanced whatever the routing
        assert all(ratio[("hashed", w, r)] < 1.25 for r in ROUTINGS)
    findings = run.results["routed"]["findings"]
    assert findings[2].startswith("hashed ids") and findings[2].endswith("routing changes nothing here.")
    assert findings[0].endswith("the routings differ.") and findings[1].endswith("the routings differ.")


def test_the_busiest_ranks_measured_slower_where_the_ids_are_imbalanced(run):
    """The count printed and summarized, recomputed from the per-rank lists; and what the summary
    says of it: in most imbalanced cases (relations timer noise does not flip at these sizes:
    thousands of ids against none or a few hundred)."""
    heavy = [c for c in run.results["routed"]["cases"] if c["ids_max_over_mean"] >= 2]
    slower = 0
    for c in heavy:
        top = max(c["ids_per_rank"])
        busy = [t for n, t in zip(c["ids_per_rank"], c["lookup_ms"]) if n == top]
        rest = [t for n, t in zip(c["ids_per_rank"], c["lookup_ms"]) if n != top]
        slower += bool(rest) and np.median(busy) > np.median(rest)
    line = f"In {slower} of {len(heavy)} cases with ids max/mean >= 2, the ranks owning the most ids"
    findings = run.results["routed"]["findings"]
    assert findings[4].startswith(line)
    below = sum(c["time_max_over_mean"] < c["ids_max_over_mean"] for c in heavy)
    summary = run.results["summary"]
    assert f"is below ids max/mean in {below} of {len(heavy)} cases with ids max/mean >= 2" in summary
    assert f"the ranks owning the most ids measured slower in {slower} of them" in summary
    assert findings[5].startswith(f"Lookup time max/mean is below ids max/mean in {below}")
    balanced = [
        c["time_max_over_mean"] for c in run.results["routed"]["cases"] if c["ids_max_over_mean"] < 1.1
    ]
    assert findings[6].endswith(
        f"is {min(balanced):.2f} to {max(balanced):.2f}: the replay's rank-to-rank spread, not the ids."
    )
    assert len(heavy) >= 4 and slower > len(heavy) / 2
    # the routing with the least balanced ids against the step (its slowest rank), where they differ
    pairs = []
    for stream, w in itertools.product(("frequency", "strided", "hashed"), ROUTED_WORLD_SIZES):
        cases = [routed(run)[(stream, w, r)] for r in ROUTINGS]
        ids = [c["ids_max_over_mean"] for c in cases]
        if max(ids) / min(ids) >= 1.1:
            worst = int(np.argmax(ids))
            slowest = [max(c["lookup_ms"]) for c in cases]
            others = slowest[:worst] + slowest[worst + 1 :]
            pairs.append(
                (stream, w, ROUTINGS[worst], slowest[worst] > max(others), slowest[worst] / min(others))
            )
    assert [(p[0], p[2]) for p in pairs] == [
        ("frequency", "continuous"),
        ("frequency", "continuous"),
        ("strided", "roundrobin"),
        ("strided", "roundrobin"),
    ]  # the counts decide which routing is worst: torchrec's blocks on frequency ids, id % W on strides
    slowest_count = sum(p[3] for p in pairs)
    assert (
        f"had the slowest rank of all routings in {slowest_count} of {len(pairs)} (stream, W) pairs"
        in (findings[3])
    )
    for stream, w, routing, _, ratio in pairs:
        assert (
            f"{stream} W={w} {routing} {ratio:.2f}x" in findings[3]
            and f"{stream} W={w} {routing} {ratio:.2f}x" in summary
        )
    assert f"had the slowest rank in {slowest_count} of {len(pairs)} (stream, W) pairs" in summary
    # the headline's caveat, as the summary states it first: time is far less imbalanced than ids
    # where one rank owns most ids (continuous, ids numbered by frequency, at the largest W)
    hot = routed(run)[("frequency", max(ROUTED_WORLD_SIZES), "continuous")]
    assert hot["time_max_over_mean"] < hot["ids_max_over_mean"] / 2


def test_the_dmp_ranks_received_the_ids_the_layout_names(run):
    """The DMP job: per routing and step, the ids torchrec's input all-to-all delivered to each
    rank equal the plain-int rule's count over both ranks' local ids."""
    training = run.results["routed"]["training"]
    w, n = training["world_size"], PARAMETERS["train_num_embeddings"]
    rows = {row["routing"]: row for row in training["rows"]}
    assert set(rows) == set(ROUTINGS)
    for routing, row in rows.items():
        assert row["routing_on_module"] == routing and row["received_equals_layout"] is True
        local = training["local_ids"][routing]
        for step in range(PARAMETERS["train_steps"]):
            counts = Counter(owner_local(routing, i, n, w)[0] for rank in local for i in rank[step])
            got = [training["ids_received"][routing][rank][step] for rank in range(w)]
            assert got == [counts[r] for r in range(w)], (routing, step)
        assert sum(row["local_rows"]) == (n if routing == "continuous" else w * -(-n // w))
        assert math.isfinite(row["loss_last"])
    # ids numbered by frequency: torchrec's blocks give rank 0 the hot half of the vocabulary
    ratio = {r: row["ids_max_over_mean"] for r, row in rows.items()}
    assert ratio["continuous"] > max(ratio["roundrobin"], ratio["feistel_roundrobin"])
    assert "DMP ranks received the layout's ids: True" in run.results["summary"]

"""Notebook 01 (modulo aliasing), executed for real with small parameters.

The expectations are independent of the notebook: they follow from how the
key streams are built (embnb.data) and from counting, not from re-running
the notebook's own code.
"""

import pytest

from embnb.data import make_keys, zipf_probs

WORLD_SIZE = 8
KV_WORLD_SIZE = 2
KV_KEYS_PER_RANK = 512
RESHARD_WORLD_SIZE = 3
ZIPF_ALPHA = 1.5
PARAMETERS = {
    "world_size": WORLD_SIZE,
    "num_keys": 50_000,
    "world_sizes": [4, 8],
    "zipf_alpha": ZIPF_ALPHA,
    "kv_world_size": KV_WORLD_SIZE,
    "kv_pattern": "strided",
    "kv_keys_per_rank": KV_KEYS_PER_RANK,
    "embedding_dim": 8,
    "reshard_world_size": RESHARD_WORLD_SIZE,
    "seed": 0,
    "kernel_sizes": [20_000],
    "kernel_repeats": 2,
}
ALIASED = ["strided", "snowflake"]  # every key shares its low bits
SPREAD = ["uniform", "sequential", "strided", "tagged", "snowflake"]  # not hot


@pytest.fixture(scope="module")
def run(execute):
    return execute("01_modulo_aliasing", PARAMETERS)


def test_aliased_streams_land_on_one_rank_under_roundrobin(run):
    ratios = run.results["max_over_mean"]
    assert ratios["strided"]["roundrobin"] == WORLD_SIZE  # all keys on one rank
    # snowflake: a handful of ids have a nonzero sequence
    assert ratios["snowflake"]["roundrobin"] > 0.95 * WORLD_SIZE
    # tags 1, 2, 5 in the low 3 bits: 3 of 8 residues
    assert ratios["tagged"]["roundrobin"] == pytest.approx(WORLD_SIZE / 3, rel=0.05)


def test_hash_roundrobin_balances_every_stream_without_hot_keys(run):
    ratios = run.results["max_over_mean"]
    for pattern in SPREAD:
        assert 1.0 <= ratios[pattern]["hash_roundrobin"] < 1.12, pattern


def test_hashing_does_not_fix_hot_keys(run):
    results = run.results
    zipf = results["max_over_mean"]["zipf"]
    floor = results["zipf_hot_key_floor"]
    expected_floor = WORLD_SIZE * float(zipf_probs(100_000, ZIPF_ALPHA)[0])
    assert floor == pytest.approx(expected_floor, rel=0.1)
    for dist_type, ratio in zipf.items():
        assert ratio >= floor - 1e-9, dist_type  # no routing splits a key
        assert ratio > 2.5, dist_type  # far above balanced
    # the hottest key alone explains most of the imbalance, so hashing
    # cannot do much better than roundrobin
    assert floor > 0.65 * max(zipf.values())
    assert zipf["hash_roundrobin"] > 0.8 * zipf["roundrobin"]


def test_sweep_covers_every_case(run):
    sweep = run.results["sweep"]
    assert len(sweep) == 6 * 3 * 2  # patterns x dist_types x world sizes
    assert {row["world_size"] for row in sweep} == {4, 8}
    strided_rr = [row for row in sweep if row["pattern"] == "strided" and row["dist_type"] == "roundrobin"]
    assert {row["world_size"]: row["max_over_mean"] for row in strided_rr} == {4: 4.0, 8: 8.0}


def test_kv_run_served_every_key_once(run):
    kv = run.results["kv"]
    total = KV_WORLD_SIZE * KV_KEYS_PER_RANK
    assert kv["keys_looked_up"] == total
    assert set(kv["keys_served"]) == {"continuous", "roundrobin", "hash_roundrobin"}
    for dist_type, served in kv["keys_served"].items():
        assert len(served) == KV_WORLD_SIZE
        assert sum(served) == total, dist_type
    # strided keys k * W + 0: roundrobin sends all of them to rank 0
    assert kv["keys_served"]["roundrobin"] == [total] + [0] * (KV_WORLD_SIZE - 1)
    hashed = kv["keys_served"]["hash_roundrobin"]
    assert max(hashed) < 1.15 * total / KV_WORLD_SIZE
    assert kv["rows_match"] is True
    # rows stored = distinct keys, independent of the notebook
    distinct = make_keys("strided", total, KV_WORLD_SIZE, seed=0).unique().numel()
    for dist_type, rows in kv["rows_held"].items():
        assert sum(rows) == distinct, dist_type


def test_checkpoint_reshard_conserves_rows(run):
    ckpt = run.results["checkpoint"]
    assert ckpt["dist_type"] == "hash_roundrobin"
    assert ckpt["saved_world_size"] == KV_WORLD_SIZE
    assert len(ckpt["rows_saved"]) == KV_WORLD_SIZE
    assert len(ckpt["rows_loaded"]) == RESHARD_WORLD_SIZE
    distinct = make_keys("strided", KV_WORLD_SIZE * KV_KEYS_PER_RANK, KV_WORLD_SIZE, seed=0).unique().numel()
    assert sum(ckpt["rows_saved"]) == sum(ckpt["rows_loaded"]) == distinct
    assert ckpt["distinct_keys_loaded"] == distinct
    assert all(rows > 0 for rows in ckpt["rows_loaded"])
    assert ckpt["every_key_on_owner"] is True
    assert ckpt["rows_exact"] is True
    # a `key % W == rank` loader agrees with the hash owner about 1/W of the time
    assert ckpt["naive_loader_misplaced_fraction"] == pytest.approx(1 - 1 / RESHARD_WORLD_SIZE, abs=0.08)


def test_dist_type_mismatch_raised(run):
    mismatch = run.results["mismatch"]
    assert mismatch["raised"] is True
    assert mismatch["asked_dist_type"] == "roundrobin"
    assert "'hash_roundrobin'" in mismatch["message"]
    assert "'roundrobin'" in mismatch["message"]


def test_summary_figures_and_explorer(run):
    assert run.results["summary"].startswith(f"strided W={WORLD_SIZE}: roundrobin max/mean 8.00")
    figures = run.figures()
    assert len(figures) == 4  # heatmap, zipf bars, trend, KV bars
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert run.widgets_shown_by("LoadExplorer(") == 1


def test_kernel_table_checks_outputs_before_timing(run):
    kernel = run.results["kernel"]
    assert kernel["device"] == "cpu"
    rows = kernel["rows"]
    assert {r["dist_type"] for r in rows} == {"continuous", "hash_roundrobin"}
    assert all(r["identical"] and r["world_size"] == WORLD_SIZE for r in rows)
    # FBGEMM has a continuous mode only: it is the peer there and nowhere else.
    assert all((r["embnb_over_fbgemm"] is not None) == (r["dist_type"] == "continuous") for r in rows)

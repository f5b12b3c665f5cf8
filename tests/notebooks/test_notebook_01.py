"""Notebook 01 (modulo aliasing, the teaching page), executed for real with small parameters.

The expectations are independent of the notebook: they follow from how the key streams are built
(embnb.data), from counting residues, from the plain Python routing rule
(tests/lab/rowwise/plain_routing.py, tests/sharder_ranks.owner_local) and from enumerating coin flips, not
from re-running the notebook's own code.
"""

import itertools
import math
from collections import Counter

import pytest

from embnb.data import make_keys, zipf_probs
from tests.lab.rowwise.plain_routing import fmix64
from tests.sharder_ranks import owner_local

WORLD_SIZE = 8
WORLD_SIZES = [5, 6, 12]  # with WORLD_SIZE: co-prime to the stride, and sharing 2, 4, 12 with it
STRIDE = 12
ZIPF_ALPHA = 1.5
ZIPF_SEEDS = 8
ROUTINGS = ("continuous", "roundrobin", "feistel_roundrobin")
PARAMETERS = {
    "world_size": WORLD_SIZE,
    "num_keys": 50_000,
    "world_sizes": WORLD_SIZES,
    "stride": STRIDE,
    "zipf_alpha": ZIPF_ALPHA,
    "zipf_seeds": ZIPF_SEEDS,
    "keys_per_step": 2048,
    "train_world_size": 2,
    "train_steps": 3,
    "train_num_embeddings": 1024,
    "seed": 0,
}
SPREAD = ["uniform", "sequential", "strided", "tagged", "snowflake"]  # not hot


@pytest.fixture(scope="module")
def run(execute):
    return execute("01_modulo_aliasing", PARAMETERS)


def residues_reached(stride: int, world_size: int) -> int:
    """How many residues mod W the multiples of `stride` take, by counting."""
    return len({k * stride % world_size for k in range(world_size)})


def test_the_worked_example_is_the_plain_int_rule(run):
    rows = run.results["worked_example"]
    assert {r["pattern"] for r in rows} == {"sequential", "strided", "tagged", "snowflake"}
    for r in rows:
        assert r[f"key % {WORLD_SIZE}"] == r["key"] % WORLD_SIZE
        assert r[f"fmix64 % {WORLD_SIZE}"] == fmix64(r["key"]) % WORLD_SIZE
        assert r["owner: roundrobin"] == r["key"] % WORLD_SIZE
        assert r["owner: hash_roundrobin"] == fmix64(r["key"]) % WORLD_SIZE
        assert r["key, low 3 bits"] == format(r["key"] % 8, "03b")


def test_the_page_core_agrees_with_the_library(run):
    assert run.results["page_core_agrees"] == dict.fromkeys(
        ("fmix64", "continuous", "roundrobin", "hash_roundrobin"), True
    )


def test_roundrobin_follows_the_gcd_rule_on_streams_that_do_not_know_w(run):
    rule = {(r["pattern"], r["world_size"]): r for r in run.results["gcd_rule"]}
    assert {p for p, _ in rule} == {"strided", "snowflake"}
    for pattern, stride in (("strided", STRIDE), ("snowflake", 4096)):
        for w in {*WORLD_SIZES, WORLD_SIZE}:
            expected = w / residues_reached(stride, w)  # every reached residue equally often
            assert rule[(pattern, w)]["gcd(s, W)"] == expected, (pattern, w)
            # sampling noise of 50,000 keys; snowflake ids with a sequence number spread a little more
            assert rule[(pattern, w)]["measured"] == pytest.approx(expected, rel=0.05)
    assert rule[("strided", 5)]["measured"] < 1.05  # co-prime: balanced
    assert rule[("strided", 12)]["measured"] == 12.0  # W divides the stride: one rank


def test_hash_roundrobin_balances_every_stream_without_hot_keys(run):
    sweep = {
        (r["pattern"], r["dist_type"], r["world_size"]): r["max_over_mean"] for r in run.results["sweep"]
    }
    for pattern, w in itertools.product(SPREAD, {*WORLD_SIZES, WORLD_SIZE}):
        assert 1.0 <= sweep[(pattern, "hash_roundrobin", w)] < 1.12, (pattern, w)
    # tags 1, 2, 5 in the low 3 bits: 3 of 8 residues under roundrobin
    assert sweep[("tagged", "roundrobin", WORLD_SIZE)] == pytest.approx(WORLD_SIZE / 3, rel=0.05)
    # the sweep's continuous snowflake column: id % snowflake_table_rows (10**8), in blocks
    keys = make_keys("snowflake", PARAMETERS["num_keys"], seed=0).tolist()
    block = -(-100_000_000 // WORLD_SIZE)
    per_rank = Counter(k % 100_000_000 // block for k in keys)
    expected = max(per_rank.values()) * WORLD_SIZE / len(keys)
    assert sweep[("snowflake", "continuous", WORLD_SIZE)] == pytest.approx(expected)


def test_hashing_does_not_fix_hot_keys_and_the_sign_test_is_recounted(run):
    runs = run.results["zipf_seeds"]
    expected_floor = WORLD_SIZE * float(zipf_probs(100_000, ZIPF_ALPHA)[0])
    assert {r["seed"] for r in runs} == set(range(ZIPF_SEEDS))
    for r in runs:
        assert r["hot_key_floor"] == pytest.approx(expected_floor, rel=0.1)
        if r["traffic"] == "all lookups":
            assert r["max_over_mean"] >= r["hot_key_floor"] - 1e-9  # no routing splits a key
    pairs = {(r["seed"], r["dist_type"], r["traffic"]): r["max_over_mean"] for r in runs}
    for seed, dist_type in itertools.product(range(ZIPF_SEEDS), ("roundrobin", "hash_roundrobin")):
        # sending each distinct key once a step takes load off the hot rank
        assert pairs[(seed, dist_type, "deduplicated per step")] < pairs[(seed, dist_type, "all lookups")]
    hash_, modulo = (
        [pairs[(s, d, "all lookups")] for s in range(ZIPF_SEEDS)] for d in ("hash_roundrobin", "roundrobin")
    )
    below = sum(h < m for h, m in zip(hash_, modulo))
    n = sum(h != m for h, m in zip(hash_, modulo))
    extreme = sum(
        abs(sum(flips) - n / 2) >= abs(below - n / 2) for flips in itertools.product((0, 1), repeat=n)
    )
    sign = run.results["zipf_sign_test"]
    assert (sign["first_below"], sign["seeds"]) == (below, n)
    assert sign["p_value"] == pytest.approx(extreme / 2**n)
    assert sign["p_value"] > 0.05  # what the page reads off: the seeds do not tell the modes apart


def test_the_dmp_ranks_received_the_ids_the_layout_names(run):
    """Per routing and step, the ids torchrec's input all-to-all delivered to each rank equal the
    plain-int rule's count over both ranks' local ids; the state dict keys carry the layout."""
    training = run.results["training"]
    w, n = training["world_size"], PARAMETERS["train_num_embeddings"]
    rows = {row["routing"]: row for row in training["rows"]}
    assert set(rows) == set(ROUTINGS)
    for routing, row in rows.items():
        assert row["routing_on_module"] == routing and row["received_equals_layout"] is True
        ranks = training["ranks"][routing]
        for step in range(PARAMETERS["train_steps"]):
            counts = Counter(
                owner_local(routing, i, n, w)[0] for rank in ranks for i in rank["local_ids"][step]
            )
            got = [rank["ids_received"][step] for rank in ranks]
            assert got == [counts[r] for r in range(w)], (routing, step)
        assert sum(row["local_rows"]) == (n if routing == "continuous" else w * -(-n // w))
        assert math.isfinite(row["loss_last"])
        key = row["state_dict_key"]
        assert (
            key == "embedding_bags.table.weight"
            if routing == "continuous"
            else key.startswith(f"embedding_bags.table.weight@{routing}(world_size={w}")
        )
    # ids numbered by frequency: torchrec's blocks give rank 0 the hot half of the vocabulary
    ratio = {r: row["ids_max_over_mean"] for r, row in rows.items()}
    assert ratio["continuous"] > max(ratio["roundrobin"], ratio["feistel_roundrobin"])


def test_summary_figures_and_explorer(run):
    results = run.results
    summary = results["summary"]  # the headline as data: each value read back from its table
    at_w = [r for r in results["sweep"] if (r["pattern"], r["world_size"]) == ("strided", WORLD_SIZE)]
    assert summary["busiest rank over mean, strided ids"] == {
        r["dist_type"]: r["max_over_mean"] for r in at_w
    }
    assert (summary["stride"], summary["world_size"]) == (STRIDE, WORLD_SIZE)
    sign = results["zipf_sign_test"]
    assert summary["Zipf seeds, hash_roundrobin below roundrobin"] == {
        "first_below": sign["first_below"],
        "seeds": sign["seeds"],
    }
    figures = run.figures()
    assert len(figures) == 2  # the heatmap, the Zipf seeds
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert run.widgets_shown_by("LoadExplorer(") == 1

"""embnb.lab.rowwise.hot_keys: the Zipf alpha sweep and where the hot-key floor binds."""

import pytest
import torch

from embnb.data import make_keys
from embnb.lab.rowwise import hot_keys


def test_counted_placement_is_greedy_largest_first():
    keys = torch.tensor([7] * 5 + [3] * 4 + [9] * 3 + [1] * 3 + [2] * 2 + [4])  # counts 5 4 3 3 2 1
    loads = hot_keys.counted_placement(keys, 2)
    # by hand: 5->r0, 4->r1, 3->r1 (7), 3->r0 (8), 2->r1 (9), 1->r0 (9)
    assert loads == [9, 9]
    assert hot_keys.counted_placement(torch.tensor([10**12, 10**12, 5]), 3) == [
        2,
        1,
        0,
    ]  # big ids: unique path


def test_alpha_sweep_rows_and_floor_against_counts():
    sweep = hot_keys.alpha_sweep([0.8, 1.5], 4000, 4, ["roundrobin", "hash_roundrobin"], [0, 1])
    assert len(sweep) == 2 * 2 * 3
    for row in sweep.itertuples():
        keys = make_keys("zipf", 4000, row.seed, alpha=row.alpha)
        top = max(torch.unique(keys, return_counts=True)[1].tolist())
        assert row.hottest_share == top / 4000
        assert row.hot_key_floor == max(1.0, 4 * top / 4000)
        assert row.max_over_mean >= row.hot_key_floor - 1e-12  # no placement splits a key


def test_floor_findings_name_the_binding_alpha_and_the_largest_excess():
    sweep = hot_keys.alpha_sweep(
        [0.8, 1.05, 1.2, 1.5], 20_000, 8, ["roundrobin", "hash_roundrobin"], range(3)
    )
    findings = hot_keys.floor_findings(sweep)
    per_alpha = {r["alpha"]: r for r in findings["per_alpha"]}
    binding = [a for a, r in per_alpha.items() if r["w_times_p1"] > 1]
    assert findings["binds_from_alpha"] == min(binding)
    for d in ("roundrobin", "hash_roundrobin"):
        excess = {a: r[d]["excess"] for a, r in per_alpha.items()}
        assert findings["largest_excess_alpha"][d] == max(excess, key=excess.get)
    overlap = all(
        max(r[d]["low"] for d in ("roundrobin", "hash_roundrobin"))
        <= min(r[d]["high"] for d in ("roundrobin", "hash_roundrobin"))
        for r in per_alpha.values()
    )
    assert findings["blind_ranges_overlap_at_every_alpha"] == overlap
    with pytest.raises(ValueError, match="empty"):
        hot_keys.floor_findings(sweep.iloc[:0])

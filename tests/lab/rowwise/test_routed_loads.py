"""embnb.lab.rowwise.routed_loads: the id streams, the counts per rank against the routings'
promised rules in plain ints (tests/sharder_ranks.owner_local), a small replay with real kernels."""

from collections import Counter

import pytest
import torch

from embnb.data import zipf_probs
from embnb.lab.rowwise import job, routed_loads
from embnb.lab.rowwise.routed_loads import LoadsConfig, RoutedCase, case_ids, measure_loads
from tests.sharder_ranks import owner_local


def test_the_frequency_stream_numbers_the_vocabulary_by_frequency():
    ids = case_ids("frequency", 200_000, 1000, 1, 1.2, seed=3)
    counts = Counter(ids.tolist())
    assert 0 <= min(counts) and max(counts) < 1000
    # id 0 carries p1 of the draws (5 binomial sigmas), and the first ids are the hottest
    p1 = float(zipf_probs(1000, 1.2)[0])
    assert abs(counts[0] / 200_000 - p1) < 5 * (p1 * (1 - p1) / 200_000) ** 0.5
    assert counts[0] > counts[1] > counts[2] > counts[10] > counts[500]


def test_strided_and_hashed_streams():
    strided = case_ids("strided", 5000, 1000, 8, 1.0, seed=0)
    assert all(i % 8 == 0 and 0 <= i < 1000 for i in strided.tolist())
    assert len(set(strided.tolist())) == 125  # every multiple of 8 below 1000, by 5000 draws
    hashed = case_ids("hashed", 5000, 1000, 8, 1.0, seed=0)
    assert 0 <= int(hashed.min()) and int(hashed.max()) < 1000
    with pytest.raises(ValueError, match="'zipf'"):
        case_ids("zipf", 10, 10, 1, 1.0, 0)


def test_a_small_replay_counts_each_rank_as_the_routings_promise_and_times_every_rank():
    config = LoadsConfig(
        world_sizes=(4,), ids_per_rank=64, bag_size=8, num_embeddings=1000, embedding_dim=8, repeats=2
    )
    loads = measure_loads(config)
    assert len(loads.cases) == 3 * 3
    for c in loads.cases:
        ids = case_ids(c.case, 4 * 64, 1000, config.stride, config.alpha, config.seed).tolist()
        owners = Counter(owner_local(c.routing, i, 1000, 4)[0] for i in ids)
        assert c.ids_per_rank == [owners[r] for r in range(4)], (c.case, c.routing)
        assert c.ids_replayed == c.ids_per_rank  # the replayed lookups got exactly those ids
        assert len(c.lookup_ms) == 4 and min(c.lookup_ms) > 0
        assert all(low <= t <= high for t, (low, high) in zip(c.lookup_ms, c.lookup_ms_range))
    # stride 8 over 4 ranks: roundrobin puts every id on rank 0
    assert loads.case("strided", 4, "roundrobin").ids_per_rank == [256, 0, 0, 0]
    assert loads.to_json()["cases"][0]["ids_max_over_mean"] == loads.cases[0].ids_max_over_mean


def _case(routing, ids, times):
    n = len(ids)
    return RoutedCase("hashed", n, routing, [1] * n, ids, ids, times, times, [[t, t] for t in times])


def test_step_verdicts_tell_routings_apart_only_beyond_the_balanced_spread():
    config = LoadsConfig(world_sizes=(2,), cases=("hashed",), routings=("continuous", "roundrobin"))
    alike = routed_loads.RoutedLoads(
        config,
        [_case("continuous", [10, 10], [1.0, 1.0]), _case("roundrobin", [21, 19], [1.0, 1.1])],
        "cpu",
    )
    assert routed_loads.step_verdicts(alike) == []  # ids within 1.1x: nothing to tell apart
    assert routed_loads.rank_spread(alike, 2) == pytest.approx(1.1 / 1.05)
    skewed = routed_loads.RoutedLoads(
        config,
        [_case("continuous", [10, 10], [1.0, 1.2]), _case("roundrobin", [20, 0], [2.0, 0.5])],
        "cpu",
    )
    (verdict,) = routed_loads.step_verdicts(skewed)
    # roundrobin: least balanced ids; its slowest rank 2.0 ms over continuous's 1.2; spread 1.2 / 1.1
    assert verdict["least_balanced"] == "roundrobin" and verdict["ids_max_over_mean"] == 2.0
    assert verdict["slowest_over_others"] == pytest.approx(2.0 / 1.2)
    assert verdict["balanced_spread"] == pytest.approx(1.2 / 1.1)
    assert verdict["told_apart"] is True
    noisy = routed_loads.RoutedLoads(
        config,
        [_case("continuous", [10, 10], [1.0, 3.0]), _case("roundrobin", [20, 0], [2.0, 0.5])],
        "cpu",
    )
    assert routed_loads.step_verdicts(noisy)[0]["told_apart"] is False  # within the spread


def test_training_rows_compare_received_ids_with_the_layout():
    config = job.TrainConfig(num_embeddings=8, steps=1)
    local = [[[0, 1, 2]], [[5, 6, 7]]]  # rank 0's and rank 1's ids of the one step
    ok = {"ids_received": [3], "losses": [1.0], "routing": "continuous", "local_rows": 4}
    runs = {"continuous": [{**ok, "local_ids": local[0]}, {**ok, "local_ids": local[1]}]}
    (row,) = job.training_rows(runs, config)
    assert row["received_equals_layout"] is True  # blocks of 4: ids 0-2 and 5-7 split 3 and 3
    runs["continuous"][0]["ids_received"] = [4]
    assert job.training_rows(runs, config)[0]["received_equals_layout"] is False
    assert torch.equal(torch.tensor(row["ids_received"]), torch.tensor([3, 3]))


def test_the_figure_has_a_panel_per_stream_at_one_world_size_and_names_its_device():
    from embnb.lab.rowwise.figures import routed_loads_figure

    config = LoadsConfig(
        world_sizes=(2, 3), cases=("hashed", "strided"), routings=("continuous", "roundrobin")
    )
    cases = [
        RoutedCase(c, w, r, [1] * w, [1] * w, [1] * w, [1.0] * w, [1.0] * w, [[0.5, 2.0]] * w)
        for c in config.cases
        for w in (2, 3)
        for r in config.routings
    ]
    fig = routed_loads_figure(routed_loads.RoutedLoads(config, cases, "x"), device="CPU (x)")
    assert [ax.get_title() for ax in fig.axes] == ["hashed ids", "strided ids"]
    assert fig._suptitle.get_text().startswith("W = 3,") and "CPU (x)" in fig._suptitle.get_text()

"""embnb.lab.rowwise.routed_loads: the id streams, the counts per rank against the routings'
promised rules in plain ints (tests/sharder_ranks.owner_local), a small replay with real kernels."""

from collections import Counter

import pytest
import torch

from embnb.data import zipf_probs
from embnb.lab.rowwise import routed_loads
from embnb.lab.rowwise.routed_loads import LoadsConfig, RoutedCase, case_ids, describe, measure_loads
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


def test_describe_says_when_routing_changes_nothing_and_counts_the_slower_busy_ranks():
    config = LoadsConfig(world_sizes=(2,), cases=("hashed",), routings=("continuous", "roundrobin"))
    alike = routed_loads.RoutedLoads(
        config,
        [_case("continuous", [10, 10], [1.0, 1.0]), _case("roundrobin", [21, 19], [1.0, 1.1])],
        "cpu",
    )
    lines = describe(alike)
    assert lines[0].startswith("hashed ids, max/mean of ids per rank (of lookup time): W=2: continuous 1.00")
    assert lines[0].endswith("routing changes nothing here.")
    skewed = routed_loads.RoutedLoads(
        config,
        [_case("continuous", [10, 10], [1.0, 1.0]), _case("roundrobin", [20, 0], [2.0, 0.5])],
        "cpu",
    )
    lines = describe(skewed)
    assert lines[0].endswith("the routings differ.")
    # roundrobin: least balanced ids, slowest rank 2.0 ms against continuous's 1.0
    assert "had the slowest rank of all routings in 1 of 1 (stream, W) pairs" in lines[1]
    assert lines[1].endswith("hashed W=2 roundrobin 2.00x.")
    assert lines[2].startswith("In 1 of 1 cases with ids max/mean >= 2")
    assert routed_loads.busiest_slower(skewed.cases[1])
    assert not routed_loads.busiest_slower(_case("roundrobin", [20, 0], [0.5, 2.0]))


def test_training_rows_compare_received_ids_with_the_layout():
    config = routed_loads.TrainConfig(num_embeddings=8, steps=1)
    local = [[[0, 1, 2]], [[5, 6, 7]]]  # rank 0's and rank 1's ids of the one step
    ok = {"ids_received": [3], "losses": [1.0], "routing": "continuous", "local_rows": 4}
    runs = {"continuous": [{**ok, "local_ids": local[0]}, {**ok, "local_ids": local[1]}]}
    (row,) = routed_loads.training_rows(runs, config)
    assert row["received_equals_layout"] is True  # blocks of 4: ids 0-2 and 5-7 split 3 and 3
    runs["continuous"][0]["ids_received"] = [4]
    assert routed_loads.training_rows(runs, config)[0]["received_equals_layout"] is False
    assert torch.equal(torch.tensor(row["ids_received"]), torch.tensor([3, 3]))


def test_the_figure_has_a_panel_per_stream_and_world_size_and_names_its_device():
    from embnb.lab.rowwise.plots import routed_loads_figure

    config = LoadsConfig(world_sizes=(2, 3), cases=("hashed",), routings=("continuous", "roundrobin"))
    cases = [
        RoutedCase("hashed", w, r, [1] * w, [1] * w, [1] * w, [1.0] * w, [1.0] * w, [[0.5, 2.0]] * w)
        for w in (2, 3)
        for r in config.routings
    ]
    fig = routed_loads_figure(routed_loads.RoutedLoads(config, cases, "x"), device="CPU (x)")
    assert [ax.get_title() for ax in fig.axes] == ["hashed ids, W = 2", "hashed ids, W = 3"]
    assert "CPU (x)" in fig._suptitle.get_text()

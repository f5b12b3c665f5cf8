"""embnb.lab.rowwise.routed_loads: the id streams, the counts per rank against the routings'
promised rules in plain ints (tests/sharder_ranks.owner_local), a small replay with real kernels."""

from collections import Counter

import pandas as pd
import pytest

from embnb.data import zipf_probs
from embnb.lab.rowwise import job, routed_loads
from embnb.lab.rowwise.routed_loads import LoadsConfig, case_ids, measure_loads
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
    assert len(loads) == 3 * 3 * 4  # a row per (stream, routing, rank)
    for (case, _, routing), ranks in loads.groupby(["case", "world_size", "routing"]):
        ids = case_ids(case, 4 * 64, 1000, config.stride, config.alpha, config.seed).tolist()
        owners = Counter(owner_local(routing, i, 1000, 4)[0] for i in ids)
        assert ranks["rank"].tolist() == [0, 1, 2, 3]
        assert ranks["ids"].tolist() == [owners[r] for r in range(4)], (case, routing)
        assert ranks["ids_replayed"].tolist() == ranks["ids"].tolist()  # the lookups got exactly those ids
        assert (ranks.lookup_ms > 0).all() and (ranks.lookup_ms_low <= ranks.lookup_ms).all()
        assert (ranks.lookup_ms <= ranks.lookup_ms_high).all()
    # stride 8 over 4 ranks: roundrobin puts every id on rank 0
    strided = loads[(loads.case == "strided") & (loads.routing == "roundrobin")]
    assert strided["ids"].tolist() == [256, 0, 0, 0]
    assert routed_loads.case_table(loads).loc[("strided", 4, "roundrobin"), "ids_max_over_mean"] == 4.0


def _cases(routings: dict[str, tuple[list[int], list[float]]]) -> pd.DataFrame:
    """A case_table of the hashed stream at W = 2 from each routing's (ids, ms) per rank."""
    rows = [
        {"case": "hashed", "world_size": len(ids), "routing": r, "rank": k, "ids": ids[k], "lookup_ms": ms[k]}
        for r, (ids, ms) in routings.items()
        for k in range(len(ids))
    ]
    return routed_loads.case_table(pd.DataFrame(rows))


def test_step_verdicts_tell_routings_apart_only_beyond_the_balanced_spread():
    alike = _cases({"continuous": ([10, 10], [1.0, 1.0]), "roundrobin": ([21, 19], [1.0, 1.1])})
    assert routed_loads.step_verdicts(alike) == []  # ids within 1.1x: nothing to tell apart
    assert routed_loads.rank_spread(alike, 2) == pytest.approx(1.1 / 1.05)
    skewed = _cases({"continuous": ([10, 10], [1.0, 1.2]), "roundrobin": ([20, 0], [2.0, 0.5])})
    (verdict,) = routed_loads.step_verdicts(skewed)
    # roundrobin: least balanced ids; its slowest rank 2.0 ms over continuous's 1.2; spread 1.2 / 1.1
    assert verdict["least_balanced"] == "roundrobin" and verdict["ids_max_over_mean"] == 2.0
    assert verdict["slowest_over_others"] == pytest.approx(2.0 / 1.2)
    assert verdict["balanced_spread"] == pytest.approx(1.2 / 1.1)
    assert verdict["told_apart"] is True
    noisy = _cases({"continuous": ([10, 10], [1.0, 3.0]), "roundrobin": ([20, 0], [2.0, 0.5])})
    assert routed_loads.step_verdicts(noisy)[0]["told_apart"] is False  # within the spread


def test_training_rows_compare_received_ids_with_the_layout():
    ok = {"ids_received": [3], "ids_by_layout": [3], "losses": [1.0], "routing": "continuous"}
    ok |= {"local_rows": 4, "state_dict_key": "k"}
    runs = {"continuous": [ok, ok]}
    (row,) = job.training_rows(runs)
    assert row["received_equals_layout"] is True and row["ids_received"] == [3, 3]
    runs["continuous"] = [ok, {**ok, "ids_received": [4]}]
    assert job.training_rows(runs)[0]["received_equals_layout"] is False

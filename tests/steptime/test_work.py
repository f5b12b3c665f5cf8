"""What each rank is fed, against oracles written id by id in plain Python;
the link model against torchrec's bandwidths; Spearman against its formula."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    table_row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb.data import zipf_probs
from embnb.planner.topology import make_topology
from embnb.steptime.batch import batch_from_keys, feature_pooling_factors, make_batch
from embnb.steptime.comms import Collective, RankComms, plan_comms, routing_comms
from embnb.steptime.kernels import fbgemm_cuda_available
from embnb.steptime.measure import StepOptions, join_rounds, lookup_steps
from embnb.steptime.step import measure_routing
from embnb.steptime.work import devices_per_host, plan_shards, plan_work, routing_work
from embnb.steptime.world import kernel_device, measure_world

TABLES = [
    EmbeddingBagConfig(name="a", feature_names=["fa"], num_embeddings=97, embedding_dim=24),
    EmbeddingBagConfig(name="b", feature_names=["fb", "fb2"], num_embeddings=50, embedding_dim=32),
]
CONSTRAINTS = {
    "a": ParameterConstraints(pooling_factors=[3.0]),
    "b": ParameterConstraints(pooling_factors=[2.0, 4.0]),
}


def bags(batch, rank, feature):
    """Rank `rank`'s bags of `feature` as Python lists."""
    f = batch.feature_names.index(feature)
    ids, out = batch.ids[rank][f].tolist(), []
    for n in batch.lengths[rank][f].tolist():
        out.append(ids[:n])
        ids = ids[n:]
    return out


def flatten(groups_bags):
    return [len(b) for b in groups_bags], [i for b in groups_bags for i in b]


def test_the_batch_has_the_pooling_factors_as_mean_bag_lengths():
    batch = make_batch(TABLES, CONSTRAINTS, 2, 4000, seed=1)
    assert feature_pooling_factors(TABLES, None) == {"fa": 1.0, "fb": 1.0, "fb2": 1.0}  # torchrec's default
    for f, factor in zip(batch.feature_names, [3.0, 2.0, 4.0]):
        mean = torch.cat([batch.lengths[r][batch.feature_names.index(f)] for r in range(2)]).double().mean()
        assert abs(float(mean) - factor) < 0.1
    kjt = batch.kjt(1)
    assert kjt.keys() == ["fa", "fb", "fb2"] and kjt["fb2"].values().tolist() == batch.ids[1][2].tolist()


def test_plan_work_feeds_each_shard_what_torchrecs_input_dist_delivers():
    world = 3
    ebc = EmbeddingBagCollection(tables=TABLES, device=torch.device("meta"))
    plan = construct_module_sharding_plan(
        ebc,
        {"a": column_wise(ranks=[2, 0, 2], compute_kernel="fused"), "b": data_parallel()},
        local_size=world,
        world_size=world,
        device_type="cpu",
    )
    batch = make_batch(TABLES, CONSTRAINTS, world, 5, seed=2)
    shards = plan_shards(plan, TABLES, world)
    for rank in range(world):
        work = plan_work(shards, batch, rank)
        groups = {g.sharding_type: g for g in work.groups}
        # data-parallel: both features of b, the rank's own samples only
        dp = groups["data_parallel"]
        assert dp.batch_size == 5 and dp.feature_shard == [0, 0]
        assert (dp.lengths.tolist(), dp.ids.tolist()) == flatten(
            bags(batch, rank, "fb") + bags(batch, rank, "fb2")
        )
        # column-wise: each shard on this rank gets every sample of the global batch, every id
        everyone = [b for r in range(world) for b in bags(batch, r, "fa")]
        cw = groups.get("column_wise")
        mine = [c for c, r in enumerate([2, 0, 2]) if r == rank]
        if not mine:
            assert cw is None
            continue
        assert [(s.col_offset, s.cols) for s in cw.shards] == [(8 * c, 8) for c in mine]
        assert (cw.lengths.tolist(), cw.ids.tolist()) == flatten(everyone * len(mine))
        # bytes read: every id's row of its shard, fp32: b's 32 columns, each column block's 8
        own = sum(len(b) for f in ("fb", "fb2") for b in bags(batch, rank, f))
        assert work.bytes_read == 4 * (32 * own + 8 * len(mine) * sum(len(b) for b in everyone))
        assert work.dense_width == 24 + 32 + 32  # every feature's pooled width, on every rank


def test_zipf_batches_keep_each_tables_hot_row_at_its_zipf_share():
    """ids="zipf": every table's ids in its rows, its hottest row the same in batches of other seeds
    and on both of its features (the table's hot rows fixed), carrying Zipf's top share."""
    top = {}
    for seed in (1, 2):
        batch = make_batch(TABLES, CONSTRAINTS, 2, 2000, seed=seed, ids="zipf", zipf_alpha=1.2)
        for f, (feature, table) in enumerate(zip(batch.feature_names, batch.feature_tables)):
            ids = torch.cat([batch.ids[r][f] for r in range(2)])
            assert ids.numel() == int(torch.cat([batch.lengths[r][f] for r in range(2)]).sum())
            rows = {"a": 97, "b": 50}[table]
            assert 0 <= int(ids.min()) and int(ids.max()) < rows
            counts = torch.bincount(ids, minlength=rows)
            top.setdefault(table, set()).add(int(counts.argmax()))
            share = float(counts.max()) / ids.numel()
            assert share == pytest.approx(float(zipf_probs(rows, 1.2)[0]), abs=0.03), (feature, seed)
    assert all(len(hot) == 1 for hot in top.values())
    with pytest.raises(ValueError, match="ids .pareto. is not one of .uniform., .zipf."):
        make_batch(TABLES, CONSTRAINTS, 2, 4, ids="pareto")


def test_lookup_steps_share_one_ranks_tbes_over_batches():
    """lookup_steps: one call per work (its ids at its batch), in any order, through one set of
    TBEs; works of other TBE groups refused."""
    shards = plan_shards(
        construct_module_sharding_plan(
            EmbeddingBagCollection(tables=TABLES, device=torch.device("meta")),
            {
                "a": table_wise(rank=0, compute_kernel="fused"),
                "b": table_wise(rank=1, compute_kernel="fused"),
            },
            local_size=2,
            world_size=2,
            device_type="cpu",
        ),
        TABLES,
        2,
    )
    works = [plan_work(shards, make_batch(TABLES, CONSTRAINTS, 2, b, seed=b), 0) for b in (4, 16)]
    assert works[1].bytes_read > works[0].bytes_read
    steps = lookup_steps(works, StepOptions(optimizer="exact_sgd", learning_rate=1.0))
    for step in steps + steps:
        step()
    with pytest.raises(ValueError, match="different TBE groups"):
        lookup_steps([works[0], plan_work(shards, make_batch(TABLES, CONSTRAINTS, 2, 4), 1)])


@pytest.mark.parametrize("dist_type", ["continuous", "roundrobin", "hash_roundrobin"])
def test_routing_work_feeds_each_rank_the_keys_it_owns(dist_type):
    world, rows = 4, 97
    table = [TABLES[0]]
    batch = make_batch(table, {"a": CONSTRAINTS["a"]}, world, 6, seed=3)
    block = math.ceil(rows / world)
    mask = (1 << 64) - 1

    def fmix64(key):  # dynamicemb's hash, on Python's unbounded ints
        key &= mask
        key ^= key >> 33
        key = (key * 0xFF51AFD7ED558CCD) & mask
        key ^= key >> 33
        key = (key * 0xC4CEB9FE1A85EC53) & mask
        return key ^ (key >> 33)

    def owner_and_row(key):
        if dist_type == "continuous":
            return key // block, key % block
        if dist_type == "roundrobin":
            return key % world, (key // world) % block
        hashed = fmix64(key)  # owner from all 64 bits; the row from the low 63
        return hashed % world, ((hashed % 2**63) // world) % block

    everyone = [b for r in range(world) for b in bags(batch, r, "fa")]
    for rank in range(world):
        (group,) = routing_work(batch, dist_type, {"a": rows}, {"a": 24}, rank).groups
        expected = [[owner_and_row(k)[1] for k in b if owner_and_row(k)[0] == rank] for b in everyone]
        assert (group.lengths.tolist(), group.ids.tolist()) == flatten(expected)
        assert group.shards[0].rows == block and all(i < block for i in group.ids.tolist())


def test_measure_routing_times_every_rank_and_phase():
    batch = make_batch([TABLES[0]], None, 2, 8, seed=0)
    times = measure_routing(batch, "roundrobin", {"a": 97}, {"a": 24}, warmup=1, repeats=3, hidden=(8,))
    assert [r.rank for r in times.ranks] == [0, 1] and times.threads == 1 and len(times.comms) == 2
    assert sum(r.num_ids for r in times.ranks) == int(torch.cat(batch.lengths[0] + batch.lengths[1]).sum())
    for rank in times.ranks:
        assert set(rank.phases) == {"lookup_forward", "lookup_backward", "dense_forward", "dense_backward"}
        assert all(len(t.wall_s) == len(t.cpu_s) == 3 for t in rank.phases.values())
        # the step is the sum of its phases, repeat by repeat; the lookups of the first two
        assert rank.compute.cpu_s == [sum(v) for v in zip(*(t.cpu_s for t in rank.phases.values()))]
        forward, backward = rank.phases["lookup_forward"], rank.phases["lookup_backward"]
        assert rank.lookup.wall_s == [a + b for a, b in zip(forward.wall_s, backward.wall_s)]
        assert rank.compute.median_s("cpu") > 0
    assert times.critical_rank() in (0, 1)


def test_rounds_join_into_one_measurement_repeat_by_repeat():
    """join_rounds: rank r's values in each phase are the rounds' values in round order (here 1 + 2
    repeats), the comms the first round's; rounds of another shape are refused by name."""
    batch = make_batch([TABLES[0]], None, 2, 8, seed=0)
    rounds = [
        measure_routing(batch, "roundrobin", {"a": 97}, {"a": 24}, warmup=0, repeats=n, hidden=(8,))
        for n in (1, 2)
    ]
    joined = join_rounds(rounds)
    assert joined.repeats == 3 and joined.comms is rounds[0].comms and "2 rounds" in joined.notes[-1]
    for position, rank in enumerate(joined.ranks):
        for phase, timing in rank.phases.items():
            parts = [t.ranks[position].phases[phase] for t in rounds]
            assert timing.wall_s == parts[0].wall_s + parts[1].wall_s
            assert timing.cpu_s == parts[0].cpu_s + parts[1].cpu_s
        assert rank.lookup.cpu_s == [v for t in rounds for v in t.ranks[position].lookup.cpu_s]
    three = measure_routing(
        make_batch([TABLES[0]], None, 3, 2), "roundrobin", {"a": 97}, {"a": 24}, repeats=1
    )
    with pytest.raises(ValueError, match=r"rounds\[1\] has \(ranks, device, threads, warmup\) \(3,"):
        join_rounds([rounds[0], three])
    with pytest.raises(ValueError, match="rounds is empty"):
        join_rounds([])


def test_a_worlds_plans_in_interleaved_rounds_pair_round_by_round():
    """measure_world: each plan of the rounds measured once per round (1 timed repeat each), joined;
    the per-round step is each round's slowest rank (read here from a table of every rank's step per
    round) and each plan's step minus the reference's is paired round by round (numpy's mean and sd,
    scipy's t); a plan measured alone has its repeats and no pair; a plan steptime cannot replay
    keeps its error, the others still run."""
    from scipy import stats

    ebc = EmbeddingBagCollection(tables=TABLES, device=torch.device("meta"))
    tw = construct_module_sharding_plan(
        ebc, {"a": table_wise(rank=0), "b": table_wise(rank=1)}, local_size=2, world_size=2, device_type="cpu"
    )
    cw = construct_module_sharding_plan(
        ebc,
        {"a": column_wise(ranks=[0, 1]), "b": table_wise(rank=0)},
        local_size=2,
        world_size=2,
        device_type="cpu",
    )
    broken = {"a": tw["a"]}  # table b placed nowhere
    batch = make_batch(TABLES, CONSTRAINTS, 2, 8, seed=0)
    plans = {"tw": ShardingPlan({"": tw}), "cw": ShardingPlan({"": cw}), "broken": ShardingPlan({"": broken})}
    world = measure_world(
        plans,
        TABLES,
        batch,
        rounds=3,
        reference="tw",
        alone={"tw again": plans["tw"]},
        alone_repeats=2,
        warmup=0,
        hidden=(8,),
    )
    assert list(world.plans) == ["tw", "cw", "broken", "tw again"] and world.clock == "cpu"
    broken = world.plans["broken"]
    assert not broken.measured and "places no shard of tables ['b']" in broken.error
    for name in ("tw", "cw", "tw again"):
        plan = world.plans[name]
        times = plan.times
        assert times.repeats == (2 if name == "tw again" else 3), name
        steps = pd.DataFrame([r.compute.values("cpu") for r in times.ranks])  # rows: ranks, columns: rounds
        assert plan.step_ms == pytest.approx((steps.max(axis=0) * 1e3).tolist()), name
        lookups = pd.DataFrame([r.lookup.values("cpu") for r in times.ranks])
        assert plan.lookup_ms == pytest.approx((lookups.max(axis=0) * 1e3).tolist()), name
        assert plan.critical_rank == int(steps.median(axis=1).idxmax()), name
    assert world.plans["tw"].minus_reference is None and world.plans["tw again"].minus_reference is None
    diffs = np.array(world.plans["cw"].step_ms) - np.array(world.plans["tw"].step_ms)
    half = stats.t.ppf(0.975, 2) * diffs.std(ddof=1) / np.sqrt(3)
    got = world.plans["cw"].minus_reference
    assert (got.mean, got.ci_low, got.ci_high) == pytest.approx(
        (diffs.mean(), diffs.mean() - half, diffs.mean() + half)
    )
    told = "slower" if got.ci_low > 0 else "faster" if got.ci_high < 0 else None
    assert world.told_apart() == ({"cw": told} if told else {})
    with pytest.raises(ValueError, match="rounds must be an int >= 1, got 0"):
        measure_world(plans, TABLES, batch, rounds=0)
    with pytest.raises(ValueError, match="repeats: one per round here"):
        measure_world(plans, TABLES, batch, rounds=2, repeats=3)
    with pytest.raises(ValueError, match="reference 'dp' is not one of the plans"):
        measure_world(plans, TABLES, batch, rounds=2, reference="dp")


def test_kernel_device_runs_cuda_only_with_fbgemms_cuda_kernels():
    assert kernel_device("cpu") == ("cpu", "")
    for asked in ("cuda", "auto"):
        device, note = kernel_device(asked)
        if fbgemm_cuda_available():
            assert (device, note) == ("cuda", "")
        else:  # skipped, and says so: never a crash
            assert device == "cpu" and f"device={asked!r}" in note and "CUDA measurement is skipped" in note
    with pytest.raises(ValueError, match="'gpu'"):
        kernel_device("gpu")


def test_bad_configurations_are_named():
    ebc = EmbeddingBagCollection(tables=TABLES, device=torch.device("meta"))
    plan = construct_module_sharding_plan(
        ebc, {"a": table_wise(rank=0), "b": table_wise(rank=1)}, local_size=2, world_size=2, device_type="cpu"
    )
    with pytest.raises(ValueError, match="shard on rank 1, outside world_size 1"):
        plan_shards(plan, TABLES, 1)
    with pytest.raises(ValueError, match="places no shard of tables \\['b'\\]"):
        plan_shards({"a": plan["a"]}, TABLES, 2)
    with pytest.raises(ValueError, match="dist_type 'modulo' is not one of"):
        measure_routing(make_batch(TABLES, None, 2, 2), "modulo", {}, {})
    # a table-row-wise table whose row blocks sit on two hosts (ranks 1 and 2 of hosts of 2)
    hosts = construct_module_sharding_plan(
        ebc,
        {"a": table_row_wise(host_index=0), "b": table_wise(rank=0)},
        local_size=2,
        world_size=4,
        device_type="cpu",
    )
    split = [s for s in plan_shards(hosts, TABLES, 4) if s.table == "a"]
    assert devices_per_host(split, 4) == 2
    moved = [dataclasses.replace(s, rank=s.rank + 1) for s in split]
    with pytest.raises(
        ValueError, match=r"span all 2 devices of one host.*a \(columns from 0\): ranks \[1, 2\]"
    ):
        devices_per_host(moved, 4)
    with pytest.raises(ValueError, match="a world of 3"):
        devices_per_host(split, 3)
    # the measuring options, as every measure_* call passes them
    routed = (make_batch([TABLES[0]], None, 2, 2), "roundrobin", {"a": 97}, {"a": 24})
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        measure_routing(*routed, repeats=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 0, got -1"):
        measure_routing(*routed, warmup=-1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'repeat'"):
        measure_routing(*routed, repeat=3)
    if not torch.cuda.is_available():
        batch = make_batch(TABLES, None, 2, 2)
        with pytest.raises(ValueError, match="no CUDA kernels"):
            measure_routing(batch, "roundrobin", {"a": 97, "b": 50}, {"a": 24, "b": 32}, device="cuda")


def test_computed_comms_use_torchrecs_bandwidths():
    topology = make_topology(4, "cpu")
    world = topology.world_size
    comms = RankComms(
        0,
        [
            Collective("x", "all_to_all_single", "forward", 4000, 8000, 1000),
            Collective("y", "all_reduce", "backward", 4000, 4000, 4000 // world, False),
        ],
    )
    intra = topology.comms_bandwidths.intra_host_bw  # one host: every device on it
    all_reduce = topology.comms_bandwidths.inter_host_bw * topology.local_world_size
    expected_ms = (8000 - 1000) / intra + 2 * (world - 1) / world * 4000 / all_reduce
    assert comms.computed_seconds(topology) == pytest.approx(expected_ms / 1e3)
    assert (comms.sent_bytes, comms.received_bytes) == (8000, 12000)
    # hosts of 2: a world-wide all-to-all crosses hosts, a within-host reduce-scatter does not
    hosts = make_topology(4, "cpu", local_world_size=2)
    bandwidths = hosts.comms_bandwidths
    split = RankComms(
        0,
        [
            Collective("x", "all_to_all_single", "forward", 4000, 8000, 1000),
            Collective("z", "reduce_scatter_tensor", "forward", 6000, 3000, 3000, within_host=True),
        ],
    )
    expected_ms = (8000 - 1000) / bandwidths.inter_host_bw + (6000 - 3000) / bandwidths.intra_host_bw
    assert split.computed_seconds(hosts) == pytest.approx(expected_ms / 1e3)


def test_routing_comms_continuous_is_torchrecs_row_wise_and_every_id_arrives_once():
    from torchrec.distributed.sharding_plan import row_wise

    world = 3
    batch = make_batch(TABLES, CONSTRAINTS, world, 7, seed=4)
    rows = {t.name: t.num_embeddings for t in TABLES}
    dims = {t.name: t.embedding_dim for t in TABLES}
    ebc = EmbeddingBagCollection(tables=TABLES, device=torch.device("meta"))
    plan = construct_module_sharding_plan(
        ebc,
        {t.name: row_wise(compute_kernel="fused") for t in TABLES},
        local_size=world,
        world_size=world,
        device_type="cpu",
    )
    shards = plan_shards(plan, TABLES, world)
    for rank in range(world):  # continuous blocks of ceil(rows / W): torchrec's row-wise, byte for byte
        ours = routing_comms(batch, "continuous", rows, dims, rank)
        torchrecs = plan_comms(shards, batch, rank)
        assert [(c.kind, c.sent_bytes, c.received_bytes, c.kept_bytes) for c in ours.collectives] == [
            (c.kind, c.sent_bytes, c.received_bytes, c.kept_bytes) for c in torchrecs.collectives
        ]
    for dist_type in ("roundrobin", "hash_roundrobin"):
        comms = [routing_comms(batch, dist_type, rows, dims, r) for r in range(world)]
        ids = [next(c for c in rc.collectives if c.name.endswith("input ids")) for rc in comms]
        assert sum(c.sent_bytes for c in ids) == sum(c.received_bytes for c in ids)  # each id to one owner
        for rank, c in enumerate(ids):
            (group,) = routing_work(batch, dist_type, rows, dims, rank).groups
            assert c.received_bytes == 8 * group.ids.numel()


def test_batch_from_keys_cuts_each_stream_into_bags():
    batch = batch_from_keys([torch.arange(7), torch.arange(100, 103)], bag_size=3)
    assert batch.local_batch_size == 3 and batch.world_size == 2
    assert batch.lengths[0][0].tolist() == [3, 3, 1] and batch.lengths[1][0].tolist() == [3, 0, 0]
    assert batch.global_bags(0)[1].tolist() == [*range(7), 100, 101, 102]
    with pytest.raises(ValueError, match="bag_size must be an int >= 1, got 0"):
        batch_from_keys([torch.arange(3)], bag_size=0)

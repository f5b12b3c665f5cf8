"""embnb.planner.replica and embnb.planner.partitioner against torchrec itself:
every plan placed by torchrec's GreedyPerfPartitioner and rated by its
NoopPerfModel (the oracle) must come out of the replica, and out of
HeapSearchPartitioner, with the same verdict, the same rating to the bit, and
each shard on the same rank (None where torchrec set none)."""

import logging

import numpy as np
import pytest
import torch
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError
from torchrec.distributed.planner.utils import reset_shard_rank

from embnb import planner
from embnb._torchrec_private import best_plan, num_proposals
from embnb.lab.planner.comparison import Planning, compare_proposers, default_proposers, timing_breakdown
from embnb.lab.planner.models import enumerate_options, fused_table_gb, make_model
from embnb.planner.partitioner import HeapSearchPartitioner
from embnb.planner.proposer import FIRST_REASON
from embnb.planner.replica import GreedyPerfReplica
from embnb.planner.space import SearchSpace, by_table
from embnb.planner.topology import reserved_topology

logging.getLogger("torchrec").setLevel(logging.ERROR)


def torchrec_answer(proposal, storage_constraint, topology, partitioner=GreedyPerfPartitioner):
    """`partitioner`'s verdict (placed, rating) on `proposal`, the ranks it gave each shard, and
    its error's message where it placed none."""
    message = None
    try:
        plan = partitioner().partition(proposal, storage_constraint)
        verdict = (True, NoopPerfModel(topology).rate(plan))
    except PlannerError as error:
        verdict, message = (False, None), str(error)
    ranks = [[shard.rank for shard in option.shards] for option in proposal]
    reset_shard_rank(proposal)
    return verdict, ranks, message


def check_random_plans(options, storage_constraint, topology, native, num_plans, seed) -> set[bool]:
    """Random plans placed by torchrec, by the replica and by HeapSearchPartitioner: the same
    verdict, rating and ranks (and, from the partitioners, the same error). Returns the verdicts
    seen."""
    replica = GreedyPerfReplica(options, storage_constraint, native=native)
    assert (replica._native is not None) == native
    rng = np.random.default_rng(seed)
    outcomes = set()
    for k in range(num_plans):
        # uniform random plans, and plans leaning to each table's smallest option (more of them fit)
        choice = np.array([rng.integers(len(table)) for table in options])
        if k % 2:
            smallest = [min(range(len(t)), key=lambda o: t[o].total_storage.hbm) for t in options]
            choice = np.where(rng.random(len(options)) < 0.8, smallest, choice)
        proposal = [table[o] for table, o in zip(options, choice)]
        answer = torchrec_answer(proposal, storage_constraint, topology)
        assert torchrec_answer(proposal, storage_constraint, topology, HeapSearchPartitioner) == answer
        (placed, rating), ranks, _ = answer
        # the native op must answer every plan here itself (it models every kind these options have)
        placement = replica._native.place(choice) if native else replica.place(choice)
        assert placement is not None
        assert (placement.placed, placement.rating) == (placed, rating)
        assert placement.ranks == ranks
        if placed:
            assert max(placement.loads) == rating
        outcomes.add(placed)
    return outcomes


GRID_TYPES = ["grid_shard", "table_row_wise", "table_column_wise", "table_wise"]


def with_grid_sharding(constraints):
    """Every third table may also be grid-sharded (torchrec offers it only when asked)."""
    return {
        name: ParameterConstraints(pooling_factors=c.pooling_factors, sharding_types=GRID_TYPES)
        if i % 3 == 0
        else c
        for i, (name, c) in enumerate(constraints.items())
    }


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
@pytest.mark.parametrize(
    ("num_tables", "world_size", "local_world_size", "hbm_fraction", "grid"),
    [
        (12, 2, None, 0.6, False),
        (30, 8, None, 0.5, False),
        (20, 8, None, 3, False),
        (16, 64, None, 0.5, False),
        # several hosts: host-level types placed host by host (_cohost_partition), grid over hosts
        (12, 4, 2, 0.6, False),
        (30, 16, 8, 0.5, False),
        (16, 32, 8, 0.5, True),
        (20, 24, 8, 1.0, True),
    ],
)
def test_replica_places_and_rates_like_torchrec(
    num_tables, world_size, local_world_size, hbm_fraction, grid, native
):
    model = make_model(num_tables, seed=world_size)
    constraints = with_grid_sharding(model.constraints) if grid else model.constraints
    hbm_cap_gb = fused_table_gb(model.tables) / world_size * hbm_fraction
    topology = planner.make_topology(
        world_size, "cuda", hbm_cap_gb=hbm_cap_gb, local_world_size=local_world_size
    )
    enumerated = enumerate_options(model.tables, topology, 512, constraints)
    storage_constraint = reserved_topology(topology, enumerated, 512)
    options = SearchSpace(by_table(enumerated.options), storage_constraint).options
    kinds = {option.sharding_type for table in options for option in table}
    assert local_world_size is None or {"table_row_wise", "table_column_wise"} <= kinds
    assert ("grid_shard" in kinds) == grid
    outcomes = check_random_plans(
        options, storage_constraint, topology, native, 150 if local_world_size is None else 100, num_tables
    )
    assert outcomes == {True, False} or hbm_fraction > 1  # both verdicts were checked where HBM binds


@pytest.mark.parametrize(
    ("hosts", "hbm_cap_gb", "native"),
    [(16, 0.1, False), (16, 0.1, True), (64, 0.2, True), (128, 0.4, True)],
    ids=["16-hosts-python", "16-hosts-native", "64-hosts-native", "128-hosts-native"],
)
def test_replica_on_16_to_128_hosts(hosts, hbm_cap_gb, native):
    """At the scale the largest users plan (128 hosts of 8: 1,024 devices), with a few tables:
    host-level options (table-row-wise, table-column-wise, grid) placed host by host as torchrec
    places them. Options from embnb's enumerator (equal to torchrec's, tests/planner/test_enumerator;
    torchrec's takes seconds per table at 1,024 devices)."""
    model = make_model(5, seed=hosts)
    topology = planner.make_topology(8 * hosts, "cuda", hbm_cap_gb=hbm_cap_gb, local_world_size=8)
    constraints = with_grid_sharding(model.constraints)
    enumerated = enumerate_options(model.tables, topology, 512, constraints, enumerator="embnb")
    storage_constraint = reserved_topology(topology, enumerated, 512)
    options = SearchSpace(by_table(enumerated.options), storage_constraint).options
    kinds = {option.sharding_type for table in options for option in table}
    assert {"table_row_wise", "table_column_wise", "grid_shard"} <= kinds
    assert check_random_plans(options, storage_constraint, topology, native, 30, hosts) == {True, False}


def test_native_placement_names_bad_input():
    model = make_model(4, seed=2)
    topology = planner.make_topology(2, "cuda", hbm_cap_gb=4)
    enumerated = enumerate_options(model.tables, topology, 512, model.constraints)
    storage_constraint = reserved_topology(topology, enumerated, 512)
    options = SearchSpace(by_table(enumerated.options), storage_constraint).options
    args = GreedyPerfReplica(options, storage_constraint, native=True)._native.args
    num_options = sum(len(table) for table in options)
    with pytest.raises(
        RuntimeError, match=rf"choice\[1\] = {num_options} is not an option in \[0, {num_options}\)"
    ):
        torch.ops.embnb.greedy_place(torch.tensor([0, num_options, 0, 0]), *args)
    with pytest.raises(RuntimeError, match="choice must be a contiguous 1-D Long CPU tensor"):
        torch.ops.embnb.greedy_place(torch.zeros(4, dtype=torch.int32), *args)
    with pytest.raises(RuntimeError, match="local_world_size 0 must be >= 1"):
        torch.ops.embnb.greedy_place(torch.zeros(4, dtype=torch.long), *args[:11], 0, 2, *args[13:])
    with pytest.raises(RuntimeError, match="host_size 3 must be >= 1 and divide the 2 devices"):
        torch.ops.embnb.greedy_place(torch.zeros(4, dtype=torch.long), *args[:12], 3, *args[13:])
    parts, totals = args[6], args[7]  # per distinct value; one row short:
    with pytest.raises(RuntimeError, match=rf"parts \({len(parts) - 1} rows\), totals \({len(totals)}\)"):
        torch.ops.embnb.greedy_place(torch.zeros(4, dtype=torch.long), *args[:6], parts[:-1], *args[7:])
    # KernelCallPerfModel's terms (args[13:]: shard groups, option pairs, pair ms, kernel_call_ms): none here
    assert args[13].numel() == args[14].numel() == args[15].numel() == 0 and args[16] == 0.0
    with pytest.raises(RuntimeError, match=r"shard_group \(0\) must hold a group per shard \(\d+\)"):
        torch.ops.embnb.greedy_place(torch.zeros(4, dtype=torch.long), *args[:16], 0.5)
    with pytest.raises(RuntimeError, match=r"option_pair \(0\) must hold a pair per option"):
        torch.ops.embnb.greedy_place(
            torch.zeros(4, dtype=torch.long), *args[:15], torch.ones(2).double(), 0.0
        )


def test_replica_leaves_key_value_column_wise_to_torchrec():
    model = make_model(6, seed=1)
    constraints = {
        name: ParameterConstraints(
            pooling_factors=c.pooling_factors, sharding_types=["column_wise"], compute_kernels=["key_value"]
        )
        for name, c in model.constraints.items()
    }
    topology = planner.make_topology(4, "cuda", hbm_cap_gb=4, local_world_size=2)
    enumerated = enumerate_options(model.tables, topology, 512, constraints)
    storage_constraint = reserved_topology(topology, enumerated, 512)
    options = SearchSpace(by_table(enumerated.options), storage_constraint).options
    assert {(o.sharding_type, o.compute_kernel) for table in options for o in table} == {
        ("column_wise", "key_value")
    }
    for native in (False, True):
        replica = GreedyPerfReplica(options, storage_constraint, native=native)
        assert replica.place(np.zeros(len(options), dtype=np.int64)) is None


def plan_with(proposer, enumerated, topology, perf_model=None, constraints=None):
    from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    planner_ = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=512,
        storage_reservation=FixedPercentageStorageReservation(0.15),
        proposer=[proposer],
        performance_model=perf_model,
        constraints=constraints,
        debug=False,
    )
    planner_.plan(enumerated.module, enumerated.sharders)
    best = best_plan(planner_)
    rating = NoopPerfModel(topology).rate(best)
    reset_shard_rank(enumerated.options)
    return rating, num_proposals(planner_)


@pytest.mark.parametrize(("world_size", "local_world_size"), [(8, None), (16, 8), (16, 4)])
def test_replaying_finds_the_same_plan_with_fewer_proposals(world_size, local_world_size):
    """On one host and on several: the planner partitions the first proposal
    and the replica's best, and the plan equals proposing every plan."""
    model = make_model(25, seed=3)
    topology = planner.make_topology(
        world_size,
        "cuda",
        hbm_cap_gb=fused_table_gb(model.tables) / (2 * world_size),
        local_world_size=local_world_size,
    )
    enumerated = enumerate_options(model.tables, topology, 512, model.constraints)
    replayed, proposed = (
        planner.DynamicProgrammingProposer(),
        planner.DynamicProgrammingProposer(replay=False),
    )
    rating, proposals = plan_with(replayed, enumerated, topology)
    rating_all, proposals_all = plan_with(proposed, enumerated, topology)
    assert rating == rating_all
    assert proposals == 2 < proposals_all
    assert replayed.num_replayed > 0 and proposed.num_replayed == 0
    # why each plan went to the planner: the first brings the devices' memory, the second checks the replica
    assert replayed.feedback_reasons == [
        FIRST_REASON,
        f"the replica's best plan (rated {rating!r}), for the planner to check",
    ]
    assert replayed.num_disagreements == 0 and proposed.num_disagreements == 0
    assert proposed.feedback_reasons == [FIRST_REASON] + ["replay off: every plan goes to the planner"] * (
        proposals_all - 1
    )


def test_a_plan_the_replica_does_not_model_goes_to_the_planner_and_says_why():
    model = make_model(8, seed=1)
    kv_cw = {"sharding_types": ["column_wise"], "compute_kernels": ["key_value"]}
    constraints = {
        name: ParameterConstraints(pooling_factors=c.pooling_factors, **(kv_cw if name == "table_2" else {}))
        for name, c in model.constraints.items()
    }
    topology = planner.make_topology(
        8, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 16, local_world_size=4
    )
    enumerated = enumerate_options(model.tables, topology, 512, constraints)
    # without pruning: table_2's key-value option is so slow that no plan could beat the first otherwise
    proposer = planner.DynamicProgrammingProposer(prune=False)
    _, proposals = plan_with(proposer, enumerated, topology, constraints=constraints)
    unmodelled = "the replica does not model it: table 'table_2': column_wise with key_value"
    assert proposals == len(proposer.feedback_reasons) > 2
    assert proposer.feedback_reasons[0] == FIRST_REASON
    # every plan has table_2's key-value column-wise option: the planner places all but the first
    assert set(proposer.feedback_reasons[1:]) == {unmodelled}
    assert proposer.num_disagreements == 0 and proposer.num_replayed == 0


def test_a_perf_model_unlike_the_replica_turns_replay_off():
    class Doubled(NoopPerfModel):  # the planner rates every plan twice NoopPerfModel's
        def rate(self, plan):
            return 2 * super().rate(plan)

    model = make_model(10, seed=4)
    topology = planner.make_topology(4, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 8)
    enumerated = enumerate_options(model.tables, topology, 512, model.constraints)
    proposer = planner.DynamicProgrammingProposer()
    rating, _ = plan_with(proposer, enumerated, topology, perf_model=Doubled(topology))
    assert proposer._replay is False  # switched off once the check failed; searched again
    rating_all, _ = plan_with(
        planner.DynamicProgrammingProposer(replay=False), enumerated, topology, perf_model=Doubled(topology)
    )
    assert rating == rating_all
    # one disagreement, saying both ratings: the planner's is twice the replica's
    assert proposer.num_disagreements == 1
    checked = proposer.feedback_reasons[1]
    predicted = float(checked.split("rated ")[1].split(")")[0])
    assert proposer.disagreements == [
        f"the planner rated it {2 * predicted!r}; the replica of GreedyPerfPartitioner and NoopPerfModel "
        f"predicted rated {predicted!r} (the planner's partitioner or perf model is not the one the "
        "replica replays)"
    ]
    assert proposer.feedback_reasons[2] == FIRST_REASON  # searched again from the start


def test_a_disagreement_names_the_rating_the_replica_replays():
    """With a KernelCallPerfModel, the replica rates as that model does, and a planner rating
    otherwise (here torchrec's NoopPerfModel, blind to the kernel calls) is told by its name."""
    model = make_model(10, seed=4)
    topology = planner.make_topology(4, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 8)
    enumerated = enumerate_options(model.tables, topology, 512, model.constraints)
    rating = planner.KernelCallPerfModel(topology, kernel_call_ms=0.5)
    proposer = planner.DynamicProgrammingProposer(performance_model=rating)
    plan_with(proposer, enumerated, topology, perf_model=NoopPerfModel(topology))
    assert proposer.num_disagreements == 1
    (said,) = proposer.disagreements
    assert "the replica of GreedyPerfPartitioner and KernelCallPerfModel(kernel_call_ms=0.5, " in said
    assert "NoopPerfModel" not in said


def test_timing_breakdown_parts_add_up_to_the_planning_time():
    model = make_model(8, seed=5)
    topology = planner.make_topology(4, "cuda", hbm_cap_gb=fused_table_gb(model.tables) / 8)
    comparison = compare_proposers(
        model.tables,
        topology,
        Planning(512, model.constraints),
        {k: v for k, v in default_proposers().items() if k in ("embnb DP", "torchrec DP")},
    )
    breakdown = timing_breakdown(comparison)
    assert list(breakdown.index) == ["embnb DP", "torchrec DP"]
    parts = breakdown.proposer_s + breakdown.partitioner_s + breakdown.planner_rest_s
    assert np.allclose(parts, comparison.plan_s)
    assert (breakdown[["proposer_s", "partitioner_s", "planner_rest_s"]] >= 0).all().all()
    assert (breakdown.enumerate_s == comparison.attrs["enumerate_s"]).all()
    # torchrec's DP has every proposal placed by torchrec's partitioner; embnb's DP only its best
    assert breakdown.proposals["embnb DP"] <= 2 < breakdown.proposals["torchrec DP"]

"""embnb.planner.perf_model: KernelCallPerfModel, a torchrec PerfModel pricing a rank as it runs.

Oracles, all torchrec's own: its `NoopPerfModel` (the rating at zero coefficients), its sharding
classes' TBE grouping (`group_tables`, run by `create_embedding_bag_sharding` on the plan torchrec's
`to_sharding_plan` writes: the kernel calls per rank), its `GreedyPerfPartitioner` (the placement)
and its `EmbeddingShardingPlanner` (the planner that runs the model). The rating with coefficients
is recomputed here from those: per rank the shard perfs plus the coefficient times torchrec's
groups, the slowest, plus the coefficients of the (module, sharding type) pairs torchrec's plan has.
"""

import logging
import math

import numpy as np
import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder, ShardedEmbeddingBagCollection
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner, to_sharding_plan
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError
from torchrec.distributed.planner.utils import reset_shard_rank
from torchrec.distributed.types import CacheParams, ShardingEnv
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb import planner
from embnb._torchrec_private import best_plan, num_proposals
from embnb.lab.planner.models import enumerate_options, fused_table_gb, make_model
from embnb.planner.calibration import Calibration
from embnb.planner.perf_model import KernelCallPerfModel
from embnb.planner.replica import GreedyPerfReplica
from embnb.planner.space import SearchSpace, by_table
from embnb.planner.topology import reserved_topology

logging.getLogger("torchrec").setLevel(logging.ERROR)

BATCH = 512
# The sharding types torchrec's sharding classes build without a process group (table-row-wise
# and grid sharding make intra- and cross-host groups): the grouping oracle's.
LOCAL_TYPES = ["table_wise", "row_wise", "column_wise", "data_parallel", "table_column_wise"]
FUSED = ["fused", "fused_uvm", "fused_uvm_caching"]


def torchrec_kernel_calls(module, module_plan, world_size, prefix="embedding_bags."):
    """Per rank, the TBE groups torchrec's sharding classes make of `module_plan` (its
    `group_tables`: one lookup kernel per group, per sharding type)."""
    infos = ShardedEmbeddingBagCollection.create_grouped_sharding_infos(module, module_plan, prefix, None)
    calls = [0] * world_size
    for sharding_infos in infos.values():
        sharding = ShardedEmbeddingBagCollection.create_embedding_bag_sharding(
            sharding_infos, ShardingEnv.from_local(world_size, 0), torch.device("meta")
        )
        for rank, groups in enumerate(sharding._grouped_embedding_configs_per_rank):
            calls[rank] += len(groups)
    return calls


def grouping_model(seed, num_tables=12):
    """Tables whose TBE keys differ in every way a plan or a config can make them differ: data
    type, pooling, stochastic rounding, the fused kernels (one key), prefetched caching with
    widths that differ (a bucket per width)."""
    rng = np.random.default_rng(seed)
    tables, constraints = [], {}
    for i in range(num_tables):
        name = f"t{i}"
        tables.append(
            EmbeddingBagConfig(
                name=name,
                feature_names=[f"f{i}"],
                num_embeddings=int(rng.integers(1_000, 200_000)),
                embedding_dim=int(rng.choice([16, 32, 64, 128])),
                data_type=DataType.FP16 if rng.random() < 0.25 else DataType.FP32,
                pooling=PoolingType.MEAN if rng.random() < 0.25 else PoolingType.SUM,
            )
        )
        extra = {}
        if rng.random() < 0.25:
            extra["stochastic_rounding"] = False
        if rng.random() < 0.3:
            extra["cache_params"] = CacheParams(prefetch_pipeline=True)
        constraints[name] = ParameterConstraints(
            sharding_types=list(rng.choice(LOCAL_TYPES, size=2, replace=False)),
            compute_kernels=[*rng.choice(FUSED, size=2, replace=False), "dense"],
            pooling_factors=[float(rng.choice([1, 4, 16]))],
            **extra,
        )
    return tables, constraints


def random_plans(options, storage_constraint, num_plans, seed):
    """Random proposals placed by torchrec's GreedyPerfPartitioner (those it places)."""
    rng = np.random.default_rng(seed)
    for _ in range(num_plans):
        proposal = [table[rng.integers(len(table))] for table in options]
        try:
            yield GreedyPerfPartitioner().partition(proposal, storage_constraint)
        except PlannerError:
            pass
        finally:
            reset_shard_rank(proposal)


@pytest.mark.parametrize("seed", range(4))
def test_kernel_calls_are_torchrecs_tbe_groups(seed):
    tables, constraints = grouping_model(seed)
    topology = planner.make_topology(4, "cuda", hbm_cap_gb=64, local_world_size=2)
    enumerated = enumerate_options(tables, topology, BATCH, constraints)
    kernels = {o.compute_kernel for o in enumerated.options}
    assert {"fused", "fused_uvm", "fused_uvm_caching", "dense"} <= kernels
    storage_constraint = reserved_topology(topology, enumerated, BATCH)
    model = KernelCallPerfModel(topology, kernel_call_ms=1.0)
    checked, counts = 0, set()
    for plan in random_plans(by_table(enumerated.options), storage_constraint, 40, seed):
        expected = torchrec_kernel_calls(enumerated.module, to_sharding_plan(plan, topology).plan[""], 4)
        assert model.kernel_calls(plan) == expected
        counts.update(expected)
        checked += 1
        reset_shard_rank(plan)
    assert checked >= 20 and max(counts) >= 3  # plans where groups split on a rank were checked


def test_fused_kernels_share_a_tbe_and_a_prefetched_width_does_not():
    """The key's two kernel rules, on a plan built for them: `fused`, `fused_uvm` and
    `fused_uvm_caching` tables of one type on one rank are one TBE (torchrec's
    _get_compute_kernel_type); with the prefetch pipeline, each width is its own."""
    tables = [
        EmbeddingBagConfig(name=f"t{i}", feature_names=[f"f{i}"], num_embeddings=5000, embedding_dim=dim)
        for i, dim in enumerate([32, 32, 32, 64, 32])
    ]
    kernels = ["fused", "fused_uvm", "fused_uvm_caching", "fused_uvm_caching", "fused_uvm_caching"]
    constraints = {
        f"t{i}": ParameterConstraints(
            sharding_types=["table_wise"],
            compute_kernels=[kernel],
            cache_params=CacheParams(prefetch_pipeline=True) if i >= 3 else None,
        )
        for i, kernel in enumerate(kernels)
    }
    topology = planner.make_topology(1, "cuda", hbm_cap_gb=16)
    module = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    the_planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints=constraints)
    sharding_plan = the_planner.plan(module, [EmbeddingBagCollectionSharder()])
    plan = best_plan(the_planner)
    # t0-t2: one fused TBE; t3 (64 wide) and t4 (32 wide), prefetched: one each
    assert torchrec_kernel_calls(module, sharding_plan.plan[""], 1) == [3]
    assert KernelCallPerfModel(topology, 1.0).kernel_calls(plan) == [3]


def expected_rating(plan, topology, kernel_call_ms, collective_ms, modules):
    """The rating recomputed from torchrec's parts: NoopPerfModel's per-rank sums, torchrec's TBE
    groups per rank, and its plan's (module, sharding type) pairs."""
    sharding_plan = to_sharding_plan(plan, topology)
    sums = [0.0] * topology.world_size
    for option in plan:
        for shard in option.shards:
            sums[shard.rank] += shard.perf.total
    calls = [0] * topology.world_size
    for path, module in modules.items():
        for rank, count in enumerate(
            torchrec_kernel_calls(module, sharding_plan.plan[path], topology.world_size)
        ):
            calls[rank] += count
    pairs = sorted({(path, p.sharding_type) for path, mp in sharding_plan.plan.items() for p in mp.values()})
    fixed = sum(collective_ms.get(sharding_type, 0.0) for _, sharding_type in pairs)
    return max(s + kernel_call_ms * c for s, c in zip(sums, calls)) + fixed


def test_rating_is_the_slowest_ranks_shards_and_calls_plus_the_collectives():
    tables, constraints = grouping_model(7)
    topology = planner.make_topology(4, "cuda", hbm_cap_gb=64)
    enumerated = enumerate_options(tables, topology, BATCH, constraints)
    storage_constraint = reserved_topology(topology, enumerated, BATCH)
    collective_ms = {"table_wise": 0.2, "row_wise": 0.15, "column_wise": 0.1}
    model = KernelCallPerfModel(topology, kernel_call_ms=0.3, collective_ms=collective_ms)
    checked = 0
    for plan in random_plans(by_table(enumerated.options), storage_constraint, 20, 7):
        expected = expected_rating(plan, topology, 0.3, collective_ms, {"": enumerated.module})
        assert model.rate(plan) == pytest.approx(expected, rel=1e-12)
        assert model.rate(plan) > NoopPerfModel(topology).rate(plan)
        checked += 1
        reset_shard_rank(plan)
    assert checked >= 10


class NoopChecked(KernelCallPerfModel):
    """The model at zero coefficients, checking each plan torchrec's planner rates against
    NoopPerfModel's rating of it (to the bit) as the planner runs."""

    def rate(self, plan):
        ours, theirs = super().rate(plan), NoopPerfModel(self._topology).rate(plan)
        assert ours == theirs, (ours, theirs)
        self.rated += 1
        return ours


@pytest.mark.parametrize(("world_size", "local_world_size"), [(4, None), (8, 4)])
def test_zero_coefficients_rate_as_noop_perf_model_on_torchrecs_proposals(world_size, local_world_size):
    """torchrec's planner with its default proposers (greedy, grid search, uniform) rating every
    proposal with the model at zero coefficients, and random placed plans."""
    model = make_model(12, seed=world_size)
    topology = planner.make_topology(
        world_size,
        "cuda",
        hbm_cap_gb=fused_table_gb(model.tables) / world_size * 0.7,
        local_world_size=local_world_size,
    )
    enumerated = enumerate_options(model.tables, topology, BATCH, model.constraints)
    checker = NoopChecked(topology)
    checker.rated = 0
    the_planner = EmbeddingShardingPlanner(
        topology=topology, batch_size=BATCH, constraints=model.constraints, performance_model=checker
    )
    the_planner.plan(enumerated.module, enumerated.sharders)
    assert 10 < checker.rated <= num_proposals(the_planner)  # every plan placed (cache hits aside)
    storage_constraint = reserved_topology(topology, enumerated, BATCH)
    zero = KernelCallPerfModel(topology, 0.0, {"row_wise": 0.0})
    checked = 0
    for plan in random_plans(by_table(enumerated.options), storage_constraint, 60, world_size):
        assert zero.rate(plan) == NoopPerfModel(topology).rate(plan)
        checked += 1
        reset_shard_rank(plan)
    assert checked >= 20


def replica_options(num_tables, world_size, local_world_size, hbm_fraction, seed, grid=False):
    model = make_model(num_tables, seed=seed)
    constraints = model.constraints
    if grid:  # every third table may be grid-sharded too (torchrec offers it only when asked)
        types = ["grid_shard", "table_row_wise", "table_column_wise", "table_wise"]
        constraints = {
            name: ParameterConstraints(pooling_factors=c.pooling_factors, sharding_types=types)
            if i % 3 == 0
            else c
            for i, (name, c) in enumerate(constraints.items())
        }
    topology = planner.make_topology(
        world_size,
        "cuda",
        hbm_cap_gb=fused_table_gb(model.tables) / world_size * hbm_fraction,
        local_world_size=local_world_size,
    )
    enumerated = enumerate_options(model.tables, topology, BATCH, constraints)
    storage_constraint = reserved_topology(topology, enumerated, BATCH)
    return topology, storage_constraint, SearchSpace(by_table(enumerated.options), storage_constraint).options


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
@pytest.mark.parametrize(
    ("num_tables", "world_size", "local_world_size", "hbm_fraction", "grid"),
    [(12, 2, None, 0.6, False), (25, 8, None, 0.5, False), (20, 8, 4, 0.6, False), (16, 16, 8, 0.6, True)],
)
def test_replica_rates_as_the_model_plan_by_plan(
    num_tables, world_size, local_world_size, hbm_fraction, grid, native
):
    topology, storage_constraint, options = replica_options(
        num_tables, world_size, local_world_size, hbm_fraction, world_size, grid
    )
    model = KernelCallPerfModel(
        topology, kernel_call_ms=0.37, collective_ms={"table_wise": 0.11, "row_wise": 0.05, "grid_shard": 0.2}
    )
    replica = GreedyPerfReplica(options, storage_constraint, native=native, performance_model=model)
    assert (replica._native is not None) == native
    rng = np.random.default_rng(num_tables)
    verdicts = set()
    for k in range(80):
        choice = np.array([rng.integers(len(table)) for table in options])
        if k % 2:  # lean to each table's smallest option: more of them fit
            smallest = [min(range(len(t)), key=lambda o: t[o].total_storage.hbm) for t in options]
            choice = np.where(rng.random(len(options)) < 0.8, smallest, choice)
        proposal = [table[o] for table, o in zip(options, choice)]
        try:
            plan = GreedyPerfPartitioner().partition(proposal, storage_constraint)
            placed, rating, costs = True, model.rate(plan), model.rank_costs(plan)
        except PlannerError:
            placed, rating, costs = False, None, None
        reset_shard_rank(proposal)
        placement = replica._native.place(choice) if native else replica.place(choice)
        assert (placement.placed, placement.rating) == (placed, rating)
        if placed:
            assert placement.loads.tolist() == costs
        verdicts.add(placed)
    assert verdicts == {True, False}


def test_torchrecs_planner_runs_the_model_and_the_dp_keeps_its_fast_path():
    """torchrec's own EmbeddingShardingPlanner with `performance_model=KernelCallPerfModel`:
    embnb's DP given the same model partitions two proposals (the replica's ratings are the
    planner's), and finds the plan proposing every plan finds; torchrec's default proposers plan
    under it too, and its chosen plan is rated as the model rates it."""
    model_spec = make_model(20, seed=11)
    topology = planner.make_topology(8, "cuda", hbm_cap_gb=fused_table_gb(model_spec.tables) / 16)
    enumerated = enumerate_options(model_spec.tables, topology, BATCH, model_spec.constraints)
    model = KernelCallPerfModel(
        topology, kernel_call_ms=0.5, collective_ms={"table_wise": 0.3, "row_wise": 0.2}
    )

    def plan(proposer):
        the_planner = EmbeddingShardingPlanner(
            topology=topology,
            batch_size=BATCH,
            constraints=model_spec.constraints,
            performance_model=model,
            **({} if proposer is None else {"proposer": [proposer]}),
        )
        the_planner.plan(enumerated.module, enumerated.sharders)
        chosen = best_plan(the_planner)
        rating = model.rate(chosen)
        reset_shard_rank(enumerated.options)
        return rating, num_proposals(the_planner)

    replayed = planner.DynamicProgrammingProposer(performance_model=model)
    every = planner.DynamicProgrammingProposer(replay=False, performance_model=model)
    rating, proposals = plan(replayed)
    rating_all, proposals_all = plan(every)
    assert rating == rating_all and proposals == 2 < proposals_all
    assert replayed.num_disagreements == 0 and replayed.best_rating == rating
    torchrec_rating, _ = plan(None)  # torchrec's default proposers, rated by the model
    assert math.isfinite(torchrec_rating)
    # a DP not told of the model predicts NoopPerfModel's ratings: the check fails, replay goes off;
    # proposing every plan of its search, which makes no knapsack runs with fewer TBE groups, it
    # finds a plan the model rates worse here
    blind = planner.DynamicProgrammingProposer()
    assert plan(blind)[0] > rating_all and blind.num_disagreements == 1


def test_create_planner_rates_with_the_calibrations_terms():
    model_spec = make_model(15, seed=12)
    topology = planner.make_topology(4, "cuda", hbm_cap_gb=fused_table_gb(model_spec.tables) / 8)
    calibration = Calibration(
        "cuda", "test", {}, kernel_call_ms=0.4, collective_ms={"table_wise": 0.25, "column_wise": 0.1}
    )
    module = EmbeddingBagCollection(tables=model_spec.tables, device=torch.device("meta"))
    the_planner = planner.create_planner(
        topology,
        BATCH,
        constraints=model_spec.constraints,
        calibration=calibration,
        storage_reservation="fixed",
    )
    the_planner.plan(module, [EmbeddingBagCollectionSharder()])
    proposer = the_planner.dp_proposer
    assert proposer.performance_model.kernel_call_ms == 0.4
    assert proposer.num_disagreements == 0 and num_proposals(the_planner) == 1
    chosen = best_plan(the_planner)
    expected = expected_rating(chosen, topology, 0.4, calibration.collective_ms, {"": module})
    assert the_planner.rating == proposer.best_rating == pytest.approx(expected, rel=1e-12)
    assert the_planner.rating > max(the_planner.rank_perf)


def test_bad_coefficients_raise_naming_the_value():
    topology = planner.make_topology(2, "cuda", hbm_cap_gb=1)
    with pytest.raises(ValueError, match=r"kernel_call_ms must be a finite number >= 0, got -1"):
        KernelCallPerfModel(topology, kernel_call_ms=-1)
    with pytest.raises(
        ValueError, match=r"collective_ms\['row_wise'\] must be a finite number >= 0, got nan"
    ):
        KernelCallPerfModel(topology, collective_ms={"row_wise": math.nan})
    with pytest.raises(ValueError, match=r"sharding type must be one of .*, got 'rowwise'"):
        KernelCallPerfModel(topology, collective_ms={"rowwise": 1.0})
    with pytest.raises(TypeError, match="performance_model must be a KernelCallPerfModel or None"):
        planner.DynamicProgrammingProposer(performance_model=NoopPerfModel(topology))

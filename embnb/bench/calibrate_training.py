"""The calibrate bench's training set and speed probe (items 1 and 5 of `embnb.bench.calibrate`'s
docstring): random plans measured rank by rank, and one fixed rank timed as the run goes."""

from __future__ import annotations

import argparse
import copy
from typing import Any

import numpy as np
import torch
from torchrec.distributed.planner.planners import to_sharding_plan
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb.lab.planner.candidates import plan_shape
from embnb.lab.planner.models import Enumerated, enumerate_options, make_model
from embnb.planner.calibration import measured_ranks
from embnb.planner.perf_model import KernelCallPerfModel
from embnb.planner.topology import make_topology
from embnb.steptime import StepTimes, make_batch, measure_plan
from embnb.steptime.work import HOST_LEVEL_SHARDING_TYPES

DP_MAX_PARAMS = 1 << 20  # data-parallel in the random plans: tables of up to 1M parameters (4 MiB fp32)


def random_plan(
    enumerated: Enumerated, world_size: int, rng: np.random.Generator, data_parallel: bool = True
) -> list:
    """Each table: a random sharding type, a random option of it, its shards on random ranks (a
    data-parallel table has a shard on every rank). Data-parallel only for tables of at most
    `DP_MAX_PARAMS` parameters, as planners choose it: every rank updates the whole table each step;
    `data_parallel=False`: none.
    No host-level type (a CUDA topology offers table_row_wise and grid_shard even on one host): their
    shards must span one host's devices, and a random rank per shard would not."""
    by_table: dict[str, dict[str, list]] = {}
    for option in enumerated.options:
        if option.sharding_type in HOST_LEVEL_SHARDING_TYPES:
            continue
        if option.sharding_type == "data_parallel" and (not data_parallel or _params(option) > DP_MAX_PARAMS):
            continue
        by_table.setdefault(option.name, {}).setdefault(option.sharding_type, []).append(option)
    plan = []
    for kinds in by_table.values():
        kind = sorted(kinds)[rng.integers(len(kinds))]
        option = copy.deepcopy(kinds[kind][rng.integers(len(kinds[kind]))])
        for index, shard in enumerate(option.shards):
            shard.rank = index if kind == "data_parallel" else int(rng.integers(world_size))
        plan.append(option)
    return plan


def _params(option) -> int:
    rows, cols = option.tensor.shape
    return rows * cols


def _measure(plan, tables, batch, opts) -> StepTimes:
    """`measure_plan` of a torchrec plan at the bench's device, threads, warm-up and repeats."""
    return measure_plan(
        plan,
        tables,
        batch,
        device=opts.device,
        threads=opts.threads,
        warmup=opts.warmup,
        repeats=opts.repeats,
    )


def training_set(opts: argparse.Namespace) -> tuple[list, list[dict[str, Any]]]:
    """The measured ranks of every random plan (item 1), and a row per plan for the JSON."""
    rng = np.random.default_rng(opts.seed)
    ranks, rows = [], []
    for seed in opts.train_seeds:
        model = make_model(opts.tables, seed=seed, max_rows=opts.max_rows)
        for world_size in opts.train_world_sizes:
            topology = make_topology(world_size, opts.device)
            enumerated = enumerate_options(
                model.tables, topology, opts.batch_size, model.constraints, "embnb"
            )
            batch = make_batch(model.tables, model.constraints, world_size, opts.batch_size, opts.seed)
            for index in range(opts.train_plans):
                # every other plan without data-parallel tables: planners' plans leave most ranks
                # without one, and a training set where every rank held one fitted the others with
                # the dense kernel's cost mixed in (issue #69)
                data_parallel = index % 2 == 0
                options = random_plan(enumerated, world_size, rng, data_parallel)
                times = _measure(to_sharding_plan(options, topology), model.tables, batch, opts)
                measured = measured_ranks(
                    options,
                    times,
                    topology,
                    enumerated.sharders,
                    model.constraints,
                    opts.clock,
                    opts.cache_bytes,
                )
                ranks += measured
                calls = KernelCallPerfModel(topology).kernel_calls(options)
                held = [
                    {
                        "rank": r.rank,
                        "lookup_ms": r.lookup.median_s(opts.clock) * 1e3,
                        "kernel_calls": calls[r.rank],
                        "tbe_groups": list(r.groups),
                    }
                    for r in times.ranks
                    if r.groups
                ]
                rows.append(
                    {
                        "seed": seed,
                        "world_size": world_size,
                        "plan": index,
                        "data_parallel": data_parallel,
                        "shape": plan_shape(options),
                        "ranks": len(measured),
                        "measured_ranks": held,
                    }
                )
                print(f"train seed={seed} W={world_size:>2} plan {index}: {plan_shape(options)}", flush=True)
    return ranks, rows


PROBE_TABLES, PROBE_SEED, PROBE_WORLD = 4, 99, 8  # the speed probe's fixed work


def speed_probe(opts: argparse.Namespace) -> tuple[float, int]:
    """The machine's speed now: one fixed rank's measured lookups (ms, `opts.clock`) and its ids: the
    tables of `make_model(PROBE_TABLES, seed=PROBE_SEED)`, all table-wise on rank 0 of
    `PROBE_WORLD`, on the bench's batch size, seed, device and repeats. The bench times it before the
    training set, after it and after the held-out worlds: the same work each time, so a change
    between the three is the machine's (issue #69: the same plans came 8-12% apart in two runs)."""
    model = make_model(PROBE_TABLES, seed=PROBE_SEED, max_rows=opts.max_rows)
    plan = construct_module_sharding_plan(
        EmbeddingBagCollection(tables=model.tables, device=torch.device("meta")),
        {table.name: table_wise(rank=0) for table in model.tables},
        local_size=PROBE_WORLD,
        world_size=PROBE_WORLD,
        device_type=torch.device(opts.device).type,
    )
    batch = make_batch(model.tables, model.constraints, PROBE_WORLD, opts.batch_size, opts.seed)
    rank = _measure(plan, model.tables, batch, opts).ranks[0]
    return rank.lookup.median_s(opts.clock) * 1e3, rank.num_ids

"""Plans to measure, each with torchrec's own estimate beside it: the planners' plans and poor ones
built on purpose from the same options (`candidate_plans`), measured rank by rank on one batch
(`measure_placed`, over `embnb.steptime.measure_world`). Notebook 03a and `python -m embnb.bench
steptime` run it."""

from __future__ import annotations

import copy
import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.planners import to_sharding_plan
from torchrec.distributed.planner.types import ShardingOption, Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from embnb._checks import check_choice, check_int
from embnb.lab.planner.comparison import UVM_KERNELS, Planning, default_proposers
from embnb.lab.planner.models import Enumerated, Model, enumerate_options
from embnb.lab.planner.planning import rank_loads
from embnb.planner.calibration import Calibration, estimators
from embnb.planner.enumerator import make_enumerator
from embnb.planner.perf_model import KernelCallPerfModel
from embnb.planner.proposer import DynamicProgrammingProposer
from embnb.planner.topology import make_topology
from embnb.steptime import GlobalBatch, WorldTimes, kernel_device, make_batch, measure_world

__all__ = ["CandidatePlan", "candidate_plans", "one_kind_on", "estimated_per_rank", "plan_shape", "PLANNERS"]
__all__ += ["POOR", "REFERENCE", "CALIBRATED", "MeasuredCandidates", "measure_candidates", "measure_placed"]
__all__ += ["plan_row"]

PLANNERS = ("embnb DP", "torchrec DP", "Greedy", "torchrec default")
POOR = "poor on purpose"  # the note of the plans built to be slow
REFERENCE = "embnb DP"  # every other planner's measured step is paired with its, round by round
CALIBRATED = "embnb DP (calibrated)"  # embnb's DP over a calibration's estimates (`candidate_plans`)
PAIRED_FIELDS = ("mean", "ci_low", "ci_high")  # of its step minus embnb DP's, round by round (ms)


@dataclass(frozen=True)
class CandidatePlan:
    """A placed plan (ShardingOptions with their shards' ranks and torchrec's estimates), or None
    with the reason; torchrec's rating (NoopPerfModel: the slowest rank's estimated total, ms)."""

    name: str
    options: list[ShardingOption] | None
    rating: float
    note: str = ""
    planning_s: float = math.nan


def one_kind_on(enumerated: Enumerated, sharding_type: str, ranks: Sequence[int]) -> list[ShardingOption]:
    """Every table's option of `sharding_type` (one shard per table, or
    every rank for data-parallel), table i on `ranks[i % len(ranks)]`."""
    chosen = {}
    for option in enumerated.options:
        if option.sharding_type == sharding_type and option.name not in chosen:
            chosen[option.name] = option
    missing = {o.name for o in enumerated.options} - set(chosen)
    if missing:
        raise ValueError(f"no {sharding_type!r} option for tables {sorted(missing)[:5]}")
    placed = [copy.deepcopy(option) for option in chosen.values()]
    for i, option in enumerate(placed):
        if sharding_type != "data_parallel" and len(option.shards) != 1:
            raise ValueError(f"{sharding_type!r} option of {option.name!r} has {len(option.shards)} shards")
        for rank, shard in enumerate(option.shards):  # data-parallel: a shard on every rank
            shard.rank = rank if sharding_type == "data_parallel" else ranks[i % len(ranks)]
    return placed


def candidate_plans(
    model: Model,
    topology: Topology,
    batch_size: int,
    *,
    timeout_s: float = 120.0,
    enumerated: Enumerated | None = None,
    planners: Sequence[str] = PLANNERS,
    poor: bool = True,
    calibration: Calibration | None = None,
) -> dict[str, CandidatePlan]:
    """The plans of `planners` (names of `default_proposers`, over one enumeration); with a
    `calibration`, embnb's DP planning over its estimates (`CALIBRATED`: the enumeration's estimates
    calibrated, plans rated with its kernel calls, as `embnb.planner.create_planner(calibration=...)`
    plans); with `poor`, poor ones: every table table-wise on rank 0, on ranks 0 and 1, and every
    table data-parallel."""
    check_int("batch_size", batch_size, low=1)
    enumerated = enumerated or enumerate_options(
        model.tables, topology, batch_size, model.constraints, "embnb"
    )
    proposers = default_proposers()
    runs = [
        (name, proposers[check_choice("planner", name, tuple(proposers))](), enumerated) for name in planners
    ]
    if calibration is not None:
        estimator = estimators(calibration, topology, model.constraints)
        chosen = make_enumerator("embnb", topology, batch_size, model.constraints, estimator=estimator)
        options = chosen.enumerate(enumerated.module, enumerated.sharders)
        rating = KernelCallPerfModel.from_calibration(topology, calibration)
        calibrated = Enumerated(enumerated.module, enumerated.sharders, options, 0.0)
        runs.append((CALIBRATED, DynamicProgrammingProposer(performance_model=rating), calibrated))
    plans, planning = {}, Planning(batch_size, model.constraints, timeout_s=timeout_s)
    for name, proposer, over in runs:
        run = planning.run(proposer, over, topology, name)
        plans[name] = CandidatePlan(name, run.plan, run.perf_rating, run.note, run.seconds)
    if not poor:
        return plans
    rate = NoopPerfModel(topology).rate
    for k in (1, 2):
        options = one_kind_on(enumerated, "table_wise", list(range(k)))
        name = f"all table-wise on {k} rank{'s' if k > 1 else ''}"
        plans[name] = CandidatePlan(name, options, rate(options), POOR)
    options = one_kind_on(enumerated, "data_parallel", [])
    plans["all data-parallel"] = CandidatePlan("all data-parallel", options, rate(options), POOR)
    return plans


def estimated_per_rank(options: Sequence[ShardingOption], world_size: int) -> dict[str, list[float]]:
    """torchrec's estimates summed per rank (`rank_loads`), in seconds: `total` (what its rating takes
    the maximum of), `compute` (forward + backward compute) and `comms` (forward + backward
    communication)."""
    loads = rank_loads(options, world_size) / 1e3
    return {"total": loads.perf.tolist(), "compute": loads.compute.tolist(), "comms": loads.comms.tolist()}


def plan_shape(options: Sequence[ShardingOption]) -> dict[str, int]:
    """Tables per sharding type, and the shards of all of them."""
    shape = dict(Counter(o.sharding_type for o in options))
    shape["shards"] = sum(len(o.shards) for o in options)
    return shape


def plan_row(candidate: CandidatePlan, topology: Topology) -> dict[str, Any]:
    """A candidate before any measurement: its name, whether poor on purpose, torchrec's rating and
    its total per rank (ms), its shape and tables in UVM (the last three where it has a plan)."""
    note = candidate.note
    row = {"plan": candidate.name, "poor": note == POOR, "rating_ms": candidate.rating, "note": note}
    options = candidate.options
    if options is not None:
        row |= {
            "estimated_per_rank_ms": rank_loads(options, topology.world_size).perf.tolist(),
            "shape": plan_shape(options),
            "uvm_tables": sum(o.compute_kernel in UVM_KERNELS for o in options),
        }
    return row


@dataclass(frozen=True)
class MeasuredCandidates:
    """`candidate_plans` of one model on `topology`, measured (`world`); `device_note`: why the
    kernels ran on the CPU when a GPU was asked for (`embnb.steptime.kernel_device`)."""

    topology: Topology
    candidates: dict[str, CandidatePlan]
    world: WorldTimes
    device_note: str = ""

    def rows(self) -> list[dict[str, Any]]:
        """One per candidate: torchrec's rating and its total per rank (ms), the plan's shape and
        tables in UVM, then on the world's clock (ms) the slowest rank's step per round and their
        median, the slowest rank's lookups (median over rounds), each rank's median lookups, its step
        minus embnb DP's round by round (`minus_embnb_dp_mean`, `_ci_low`, `_ci_high`: the 95%
        t-interval, ms) and its `verdict` (None: not paired)."""
        rows = []
        for name, candidate in self.candidates.items():
            plan = self.world.plans.get(name)
            note = candidate.note or (plan.error if plan else "")
            if plan is None and candidate.options is not None:
                note += "; not measured here"
            row = plan_row(candidate, self.topology) | {"note": note}
            if plan is not None and plan.measured:
                clock, times = self.world.clock, plan.times
                row |= {
                    "step_ms": plan.median_step_ms,
                    "step_ms_rounds": plan.step_ms,
                    "lookup_ms": statistics.median(plan.lookup_ms),
                    "critical_rank": plan.critical_rank,
                    "lookup_per_rank_ms": [r.lookup.median_s(clock) * 1e3 for r in times.ranks],
                    **{f"minus_embnb_dp_{k}": getattr(plan.minus_reference, k, None) for k in PAIRED_FIELDS},
                    "verdict": plan.verdict,
                }
            rows.append(row)
        return rows

    def record(self) -> dict[str, Any]:
        """What a results JSON keeps: the world, where and how it was measured, and `rows`."""
        world = self.world
        return {
            "world_size": self.topology.world_size,
            "hosts": self.topology.world_size // self.topology.local_world_size,
            "device": world.device,
            "device_name": world.machine,
            "clock": world.clock,
            "device_note": self.device_note,
            "rounds": world.rounds,
            "plans": self.rows(),
            "told_apart": world.told_apart(),
        }


def measure_candidates(
    model: Model,
    world_size: int,
    batch_size: int,
    rounds: int,
    *,
    device: str = "cpu",
    seed: int = 0,
    timeout_s: float = 120.0,
    **options: Any,
) -> MeasuredCandidates:
    """`candidate_plans` of `model` for one host of `world_size` devices of the kind the kernels run
    on (`kernel_device(device)`), measured by `measure_placed` (`options`: its own) on one global
    batch of `batch_size` samples per rank (seed `seed`)."""
    check_int("world_size", world_size, low=2)
    topology = make_topology(world_size, kernel_device(device)[0])
    candidates = candidate_plans(model, topology, batch_size, timeout_s=timeout_s)
    batch = make_batch(model.tables, model.constraints, world_size, batch_size, seed)
    return measure_placed(topology, candidates, model.tables, batch, rounds, device=device, **options)


def measure_placed(
    topology: Topology,
    candidates: Mapping[str, CandidatePlan],
    tables: Sequence[EmbeddingBagConfig],
    batch: GlobalBatch,
    rounds: int,
    *,
    device: str = "cpu",
    poor: Sequence[str] | None = None,
    **options: Any,
) -> MeasuredCandidates:
    """Plans placed on `topology` (`candidate_plans`, or `candidates_from_json`) measured rank by
    rank on `batch` where the kernels run (`kernel_device(device)`): the planners' plans in `rounds`
    interleaved rounds, each paired with embnb DP's, then the poor plans named in `poor` (None: all).
    `options`: `measure_world`'s (`alone_repeats`: timed steps of each poor plan) and
    `embnb.steptime.StepOptions`' fields (threads, warmup, hidden)."""
    device, note = kernel_device(device)
    placed = {
        n: to_sharding_plan(c.options, topology) for n, c in candidates.items() if c.options is not None
    }
    planners = {n: plan for n, plan in placed.items() if candidates[n].note != POOR}
    alone = {n: plan for n, plan in placed.items() if n not in planners and (poor is None or n in poor)}
    reference = REFERENCE if REFERENCE in planners else None
    world = measure_world(
        planners, tables, batch, rounds, reference=reference, alone=alone, device=device, **options
    )
    return MeasuredCandidates(topology, dict(candidates), world, note)

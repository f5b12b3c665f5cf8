"""Running proposers in torchrec's planner and comparing them: side by side,
as the memory budget shrinks, and against brute force on small instances.

Every proposer plans over the same enumerated options (`Enumerated`, from
`embnb.planner.topology.enumerate_options`) with a fresh
`EmbeddingShardingPlanner`.

    run = run_planner(DynamicProgrammingProposer(), enumerated, topology, 512)
    table = compare_proposers(tables, topology, batch_size=512)   # one row per proposer
    sweep = budget_sweep(enumerated, [2.0, 1.0, 0.5], world_size=8, batch_size=512)
    study = quality_study(20)                                      # rating / brute-force best
"""

from __future__ import annotations

import collections
import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.proposers import (
    MAX_PROPOSALS,
    GreedyProposer,
    GridSearchProposer,
    UniformProposer,
)
from torchrec.distributed.planner.proposers import (
    DynamicProgrammingProposer as TorchrecDynamicProgrammingProposer,
)
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    PlannerError,
    Proposer,
    ShardingOption,
    Stats,
    Topology,
)
from torchrec.distributed.planner.utils import reset_shard_rank
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embnb._checks import check_int
from embnb._torchrec_private import num_proposals, planner_proposers
from embnb.lab.planner.brute_force import brute_force_rating
from embnb.lab.planner.explain import memory_ratio
from embnb.lab.planner.models import Enumerated, Model, enumerate_options, fused_table_gb, make_model
from embnb.planner.enumerator import default_enumerator
from embnb.planner.factory import create_planner
from embnb.planner.proposer import DynamicProgrammingProposer
from embnb.planner.space import GB
from embnb.planner.topology import make_topology

__all__ = [
    "PlanRun",
    "run_planner",
    "EndToEnd",
    "time_end_to_end",
    "rank_loads",
    "ProposerFactory",
    "default_proposers",
    "compare_proposers",
    "timing_breakdown",
    "budget_sweep",
    "random_instance",
    "quality_study",
    "quality_summary",
]


class _Replay(Enumerator):
    """An Enumerator that hands out one enumeration again."""

    def __init__(self, options: list[ShardingOption]) -> None:
        self._options = options

    def enumerate(self, module: nn.Module, sharders: list) -> list[ShardingOption]:
        reset_shard_rank(self._options)
        return list(self._options)

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        pass  # estimates were populated when enumerated


class _TimedPartitioner(GreedyPerfPartitioner):
    """torchrec's default partitioner, timed."""

    seconds = 0.0

    def partition(self, proposal, storage_constraint, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super().partition(proposal, storage_constraint, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


class _TimedProposer(Proposer):
    """A proposer, its load/propose/feedback timed."""

    def __init__(self, proposer: Proposer) -> None:
        self.proposer, self.seconds = proposer, 0.0

    def _timed(self, method: str, *args, **kwargs):
        start = time.perf_counter()
        try:
            return getattr(self.proposer, method)(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def load(self, search_space, enumerator=None) -> None:
        self._timed("load", search_space=search_space, enumerator=enumerator)

    def propose(self):
        return self._timed("propose")

    def feedback(self, partitionable, plan=None, perf_rating=None, storage_constraint=None) -> None:
        self._timed("feedback", partitionable, plan, perf_rating, storage_constraint)


class _KeepBestPlan(Stats):
    """torchrec calls Stats.log with the best plan; keep it."""

    best_plan: list[ShardingOption] | None = None

    def log(
        self,
        sharding_plan,
        topology,
        batch_size,
        storage_reservation,
        num_proposals,
        num_plans,
        run_time,
        best_plan,
        *args,
        **kwargs,
    ) -> None:
        if sharding_plan.plan:  # on failure torchrec logs its last proposal, ranks -1
            self.best_plan = best_plan


@dataclass(frozen=True)
class PlanRun:
    """One EmbeddingShardingPlanner.plan: its best plan (None if none) and how it went."""

    proposer: str  # its name
    plan: list[ShardingOption] | None  # placed (shard ranks set); None: no plan
    perf_rating: float  # NoopPerfModel's rating of the plan (the slowest rank); NaN: no plan
    proposals: int  # proposals the planner evaluated
    seconds: float  # planning took
    timed_out: bool  # the time limit cut a proposer short
    note: str  # why there is no plan, else ""
    proposer_s: float = math.nan  # of `seconds`, in the proposers' load, propose and feedback
    partitioner_s: float = math.nan  # of `seconds`, in torchrec's GreedyPerfPartitioner


def run_planner(
    proposer: Proposer | list[Proposer],
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    *,
    name: str = "",
    storage_reservation_percentage: float = 0.15,
    constraints: dict[str, ParameterConstraints] | None = None,
    timeout_s: float | None = None,
) -> PlanRun:
    """Plan with torchrec's EmbeddingShardingPlanner and these proposers."""
    proposers = proposer if isinstance(proposer, list) else [proposer]
    timed = [_TimedProposer(p) for p in proposers]
    partitioner = _TimedPartitioner()
    keep = _KeepBestPlan()
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        enumerator=_Replay(enumerated.options),
        storage_reservation=FixedPercentageStorageReservation(percentage=storage_reservation_percentage),
        proposer=timed,
        partitioner=partitioner,
        stats=[keep],
        constraints=constraints,
        debug=False,
        timeout_seconds=None if timeout_s is None else max(1, math.ceil(timeout_s)),
    )
    note = ""
    start = time.perf_counter()
    try:
        planner.plan(enumerated.module, enumerated.sharders)
    except PlannerError as error:  # a proposer's own reason says more than torchrec's summary
        reasons = [getattr(p, "no_plan_reason", None) for p in proposers]
        reason = next(filter(None, reasons), None) or str(error).strip().splitlines()[0]
        note = "no plan: " + reason[:200]
    except Exception as error:  # e.g. torchrec's DP divides by zero on CPU topologies
        note = f"failed: {type(error).__name__}: {str(error).strip()[:160]}"
    seconds = time.perf_counter() - start
    reset_shard_rank(enumerated.options)
    plan = keep.best_plan
    rating = NoopPerfModel(topology).rate(plan) if plan else math.nan
    # The planner stops asking at its time limit; a proposer that still has a proposal was cut.
    timed_out = (
        timeout_s is not None
        and seconds >= math.ceil(timeout_s)
        and any(p.propose() is not None for p in proposers)
    )
    return PlanRun(
        name or "+".join(type(p).__name__ for p in proposers),
        plan,
        rating,
        num_proposals(planner),
        seconds,
        timed_out,
        note,
        sum(p.seconds for p in timed),
        partitioner.seconds,
    )


@dataclass(frozen=True)
class EndToEnd:
    """`create_planner(...).plan(module, sharders)` timed as a user calls it."""

    enumerator: str  # create_planner's enumerator ("embnb" or "torchrec")
    seconds: list[float]  # every run's, each from a fresh module and planner
    rating: float  # the DP's rating of its plan (inf: no plan)
    same_rating_every_run: bool

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)


def time_end_to_end(
    tables: Sequence[EmbeddingBagConfig],
    topology: Topology,
    batch_size: int,
    constraints: dict[str, ParameterConstraints] | None = None,
    *,
    repeats: int = 1,
    enumerator: str | None = None,
    storage_reservation: str | None = None,
) -> EndToEnd:
    """From the model to the plan: an EmbeddingBagCollection of `tables` (on
    meta) planned by `create_planner(topology, batch_size, constraints=...,
    enumerator=..., storage_reservation=...)` (None: create_planner's
    default), `repeats` times (the garbage of the run before collected
    first, outside the timing)."""
    check_int("repeats", repeats, low=1)
    seconds, ratings = [], []
    for _ in range(repeats):
        module = EmbeddingBagCollection(tables=list(tables), device=torch.device("meta"))
        reserve = {} if storage_reservation is None else {"storage_reservation": storage_reservation}
        chosen = create_planner(
            topology, batch_size, constraints=constraints, enumerator=enumerator, **reserve
        )
        gc.collect()
        start = time.perf_counter()
        chosen.plan(module, [EmbeddingBagCollectionSharder()])
        seconds.append(time.perf_counter() - start)
        ratings.append(planner_proposers(chosen)[0].best_rating)  # create_planner's DP
        del module, chosen
    name = default_enumerator() if enumerator is None else enumerator
    return EndToEnd(name, seconds, ratings[0], len(set(ratings)) == 1)


def rank_loads(plan: list[ShardingOption], world_size: int) -> pd.DataFrame:
    """Perf and memory (GiB) of a placed plan, one row per rank."""
    loads = np.zeros((world_size, 3))
    for option in plan:
        for shard in option.shards:
            loads[shard.rank] += [shard.perf.total, shard.storage.hbm / GB, shard.storage.ddr / GB]
    return pd.DataFrame(loads, columns=["perf", "hbm_gb", "ddr_gb"]).rename_axis("rank")


ProposerFactory = Callable[[], "Proposer | list[Proposer]"]


def default_proposers(bins_per_device: int = 100) -> dict[str, ProposerFactory]:
    """This DP and torchrec's proposers, each alone, and torchrec's default set."""
    check_int("bins_per_device", bins_per_device, low=1)
    return {
        "embnb DP": lambda: DynamicProgrammingProposer(bins_per_device=bins_per_device),
        "torchrec DP": lambda: TorchrecDynamicProgrammingProposer(hbm_bins_per_device=bins_per_device),
        "Greedy": lambda: GreedyProposer(),
        "Uniform": lambda: UniformProposer(),
        "GridSearch": lambda: GridSearchProposer(),
        "torchrec default": lambda: [
            GridSearchProposer(),
            GreedyProposer(),
            GreedyProposer(use_depth=False),
            UniformProposer(),
        ],
    }


def compare_proposers(
    tables: Sequence[EmbeddingBagConfig] | None,
    topology: Topology,
    batch_size: int,
    *,
    constraints: dict[str, ParameterConstraints] | None = None,
    proposers: dict[str, ProposerFactory] | None = None,
    timeout_s: float | None = None,
    storage_reservation_percentage: float = 0.15,
    enumerated: Enumerated | None = None,
    progress: bool = False,
    repeats: int = 1,
) -> pd.DataFrame:
    """One row per proposer: the best plan's perf rating (slowest rank), its
    largest HBM and DDR per device, feasible or not, the plans the proposer
    considered (for embnb's DP, also those it placed itself with its
    replica) and the proposals torchrec's partitioner placed, planning
    seconds (median, min and max over `repeats` runs), end to end with the
    enumeration, whether `timeout_s` cut it short, and a note.

    Options are enumerated once (`enumerated`, from `enumerate_options` for
    this topology's world size and device; else now, from `tables`) and every
    proposer plans over them with a fresh EmbeddingShardingPlanner; the
    enumeration's seconds are in `.attrs["enumerate_s"]`.
    """
    enumerated = enumerated or enumerate_options(tables, topology, batch_size, constraints)
    proposers = default_proposers() if proposers is None else proposers
    if not proposers:
        raise ValueError("proposers is empty: pass at least one name -> proposer factory")
    combinations = math.prod(collections.Counter(o.fqn for o in enumerated.options).values())
    names = list(proposers)
    if progress:
        from tqdm.auto import tqdm

        names = tqdm(names, desc="proposers")
    check_int("repeats", repeats, low=1)
    rows = []
    for name in names:
        runs = []
        for _ in range(repeats):
            made = proposers[name]()
            run = run_planner(
                made,
                enumerated,
                topology,
                batch_size,
                name=name,
                storage_reservation_percentage=storage_reservation_percentage,
                constraints=constraints,
                timeout_s=timeout_s,
            )
            runs.append(run)
        rows.append(_comparison_row(name, runs, made, enumerated, topology.world_size, combinations))
    table = pd.DataFrame(rows).set_index("proposer")
    table.attrs.update(
        enumerate_s=enumerated.seconds, num_options=len(enumerated.options), combinations=combinations
    )
    return table


def _comparison_row(
    name: str,
    runs: list[PlanRun],
    made: Proposer | list[Proposer],
    enumerated: Enumerated,
    world_size: int,
    combinations: int,
) -> dict[str, Any]:
    """One proposer's row of `compare_proposers` from its repeated runs (the
    plan of the first; `made`: the proposers of the last, for their counts)."""
    run, seconds = runs[0], [r.seconds for r in runs]
    made = made if isinstance(made, list) else [made]
    considered = sum(
        p.num_knapsack_proposals + p.num_refinements for p in made if hasattr(p, "num_refinements")
    )
    loads = rank_loads(run.plan, world_size) if run.plan else None
    note = run.note
    if name == "GridSearch" and combinations > MAX_PROPOSALS:  # torchrec skips it then
        note = f"skipped: {combinations:.3g} combinations > {MAX_PROPOSALS}"
    return {
        "proposer": name,
        "perf_rating": run.perf_rating,
        "max_hbm_gb": loads["hbm_gb"].max() if loads is not None else math.nan,
        "max_ddr_gb": loads["ddr_gb"].max() if loads is not None else math.nan,
        "feasible": run.plan is not None,
        "plans_considered": considered or run.proposals,
        "proposals": run.proposals,
        "plan_s": statistics.median(seconds),
        "plan_s_min": min(seconds),
        "plan_s_max": max(seconds),
        "end_to_end_s": enumerated.seconds + statistics.median(seconds),
        "proposer_s": run.proposer_s,
        "partitioner_s": run.partitioner_s,
        "timed_out": any(r.timed_out for r in runs),
        "note": note,
    }


def timing_breakdown(comparison: pd.DataFrame) -> pd.DataFrame:
    """Where each proposer's planning time went, one row per proposer of a
    `compare_proposers` table: torchrec's enumeration of the options (once,
    shared by all), the proposer's own work, torchrec's partitioner, the rest
    of torchrec's planner (rating, copying the best plan), end to end with
    the enumeration, the plans the proposer considered and the proposals the
    partitioner placed."""
    breakdown = pd.DataFrame(
        {
            "enumerate_s": comparison.attrs.get("enumerate_s", math.nan),
            "proposer_s": comparison.proposer_s,
            "partitioner_s": comparison.partitioner_s,
            "planner_rest_s": comparison.plan_s - comparison.proposer_s - comparison.partitioner_s,
            "plan_s": comparison.plan_s,
            "end_to_end_s": comparison.attrs.get("enumerate_s", math.nan) + comparison.plan_s,
            "plans_considered": comparison.get("plans_considered", comparison.proposals),
            "proposals": comparison.proposals,
        }
    )
    return breakdown


def random_instance(
    seed: int, num_tables: int = 3, world_size: int | None = None, compute_device: str = "cuda"
) -> tuple[Model, Topology]:
    """A small model and a topology whose HBM (DDR on CPU) binds: per device,
    15% to 120% of the fp32 rows of all tables spread evenly."""
    rng = np.random.default_rng(seed)
    world_size = int(rng.integers(2, 5)) if world_size is None else world_size
    model = make_model(num_tables, seed)
    budget = fused_table_gb(model.tables) / world_size * rng.uniform(0.15, 1.2)
    if compute_device == "cpu":
        return model, make_topology(world_size, "cpu", ddr_cap_gb=budget)
    return model, make_topology(world_size, "cuda", hbm_cap_gb=budget)


def quality_study(
    num_instances: int,
    seed: int = 0,
    num_tables: int = 3,
    batch_size: int = 512,
    proposers: dict[str, ProposerFactory] | None = None,
    progress: bool = False,
    storage_reservation_percentage: float = 0.15,
) -> pd.DataFrame:
    """Each proposer's rating over the brute-force best, on random small
    instances: one row per instance and proposer (ratio inf: no plan where
    brute force found one; NaN: GridSearch skipped, as torchrec skips it past
    MAX_PROPOSALS combinations; instances without any plan are left out).
    Brute force and every proposer keep the same storage reservation."""
    check_int("num_instances", num_instances, low=1)
    proposers = proposers or {k: v for k, v in default_proposers().items() if k != "torchrec default"}
    seeds = range(seed, seed + num_instances)
    if progress:
        from tqdm.auto import tqdm

        seeds = tqdm(seeds, desc="instances")
    rows = []
    for instance in seeds:
        model, topology = random_instance(instance, num_tables)
        enumerated = enumerate_options(model.tables, topology, batch_size, model.constraints)
        best = brute_force_rating(enumerated, topology, batch_size, storage_reservation_percentage)
        if not math.isfinite(best):
            continue
        combinations = math.prod(collections.Counter(o.fqn for o in enumerated.options).values())
        for name, make in proposers.items():
            if name == "GridSearch" and combinations > MAX_PROPOSALS:
                rating = math.nan
            else:
                run = run_planner(
                    make(),
                    enumerated,
                    topology,
                    batch_size,
                    name=name,
                    constraints=model.constraints,
                    storage_reservation_percentage=storage_reservation_percentage,
                )
                rating = run.perf_rating if run.plan else math.inf
            rows.append(
                {
                    "instance": instance,
                    "world_size": topology.world_size,
                    "proposer": name,
                    "perf_rating": rating,
                    "brute_force": best,
                    "ratio": rating / best,
                }
            )
    return pd.DataFrame(rows)


def quality_summary(study: pd.DataFrame, tolerance: float = 1.02) -> pd.DataFrame:
    """Per proposer of a `quality_study`: the worst (`max`) and `median` ratio
    to brute force, and the share of instances within `tolerance`."""
    ratios = study.groupby("proposer", sort=False).ratio
    summary = ratios.agg(["max", "median"])
    within = f"within {round((tolerance - 1) * 100):g}%"
    summary[within] = study.assign(ok=study.ratio <= tolerance).groupby("proposer", sort=False).ok.mean()
    return summary


def budget_sweep(
    enumerated: Enumerated,
    hbm_caps_gb: Sequence[float],
    world_size: int,
    batch_size: int,
    *,
    constraints: dict[str, ParameterConstraints] | None = None,
    proposers: dict[str, ProposerFactory] | None = None,
    timeout_s: float | None = None,
    ddr_cap_gb: float | None = None,
    storage_reservation_percentage: float = 0.15,
    progress: bool = False,
) -> pd.DataFrame:
    """compare_proposers at each HBM budget per device (GPU topologies; the
    options do not depend on the budget, so one enumeration serves all),
    every proposer with the same storage reservation; column `memory_ratio`:
    `embnb.lab.planner.explain.memory_ratio` at that budget (below 1 memory binds)."""
    if not hbm_caps_gb:
        raise ValueError("hbm_caps_gb is empty: give at least one HBM budget per device")
    caps = list(hbm_caps_gb)
    if progress:
        from tqdm.auto import tqdm

        caps = tqdm(caps, desc="budgets")
    frames = []
    for cap in caps:
        topology = make_topology(world_size, "cuda", hbm_cap_gb=cap, ddr_cap_gb=ddr_cap_gb)
        table = compare_proposers(
            None,
            topology,
            batch_size,
            constraints=constraints,
            proposers=proposers,
            timeout_s=timeout_s,
            storage_reservation_percentage=storage_reservation_percentage,
            enumerated=enumerated,
        )
        ratio = memory_ratio(enumerated, topology, batch_size, storage_reservation_percentage)
        frames.append(table.reset_index().assign(hbm_cap_gb=cap, memory_ratio=ratio))
    return pd.concat(frames, ignore_index=True)

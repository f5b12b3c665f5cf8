"""Proposers side by side in torchrec's planner: each over the same enumerated options with a
fresh `EmbeddingShardingPlanner` (`run_planner`), under the same storage reservation; again as the
HBM budget shrinks (`budget_sweep`), against brute force on random small instances
(`quality_study`), and embnb's DP piece by piece (`ablation_table`)."""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from torchrec.distributed.planner import proposers as torchrec_proposers
from torchrec.distributed.planner.proposers import MAX_PROPOSALS
from torchrec.distributed.planner.types import ParameterConstraints, Proposer, Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from tqdm.auto import tqdm

from embnb._checks import check_int
from embnb.lab.planner.explain import brute_force_rating, memory_ratio
from embnb.lab.planner.models import Enumerated, Model, enumerate_options, fused_table_gb, make_model
from embnb.lab.planner.planning import rank_loads, run_planner
from embnb.planner.proposer import DynamicProgrammingProposer
from embnb.planner.topology import make_topology

__all__ = ["Planning", "ProposerFactory", "default_proposers", "compare_proposers", "timing_breakdown"]
__all__ += ["budget_sweep", "random_instance", "quality_study", "quality_summary", "LADDER", "ablation_table"]

ProposerFactory = Callable[[], "Proposer | list[Proposer]"]
UVM_KERNELS = ("fused_uvm", "fused_uvm_caching")  # rows in DDR: FBGEMM runs them only on a GPU


@dataclass(frozen=True)
class Planning:
    """How every proposer plans, alike for all of them: the batch size per rank torchrec's
    estimators assume, FixedPercentageStorageReservation's share, each proposer's time limit and
    the planning runs per proposer (seconds are their median and range)."""

    batch_size: int = 512
    constraints: dict[str, ParameterConstraints] | None = None
    storage_reservation_percentage: float = 0.15
    timeout_s: float | None = None
    repeats: int = 1

    def run(self, proposer, enumerated: Enumerated, topology: Topology, name: str = ""):
        """`run_planner` with these settings."""
        return run_planner(
            proposer,
            enumerated,
            topology,
            self.batch_size,
            name=name,
            constraints=self.constraints,
            storage_reservation_percentage=self.storage_reservation_percentage,
            timeout_s=self.timeout_s,
        )


def default_proposers(bins_per_device: int = 100) -> dict[str, ProposerFactory]:
    """This DP and torchrec's proposers, each alone, and torchrec's default set."""
    check_int("bins_per_device", bins_per_device, low=1)
    return {
        "embnb DP": lambda: DynamicProgrammingProposer(bins_per_device=bins_per_device),
        "torchrec DP": lambda: torchrec_proposers.DynamicProgrammingProposer(
            hbm_bins_per_device=bins_per_device
        ),
        "Greedy": torchrec_proposers.GreedyProposer,
        "Uniform": torchrec_proposers.UniformProposer,
        "GridSearch": torchrec_proposers.GridSearchProposer,
        "torchrec default": lambda: [  # EmbeddingShardingPlanner's proposers when given none
            torchrec_proposers.GridSearchProposer(),
            torchrec_proposers.GreedyProposer(),
            torchrec_proposers.GreedyProposer(use_depth=False),
            torchrec_proposers.UniformProposer(),
        ],
    }


def compare_proposers(
    source: Sequence[EmbeddingBagConfig] | Enumerated,
    topology: Topology,
    planning: Planning = Planning(),
    proposers: dict[str, ProposerFactory] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """One row per proposer (default: all of `default_proposers`), from its median run of
    `planning.repeats` (the lower middle one for an even count): the best plan's perf rating
    (slowest rank), its largest HBM and DDR per device, its tables in UVM, the plans the proposer
    considered (embnb's DP also places plans itself) and the proposals torchrec's partitioner placed,
    planning seconds (that run's, of them in the proposer and the partitioner; min, max and every
    run's beside them), end to end with the enumeration, whether every run rated its plan alike,
    whether the time limit cut a run short, and a note. `source`: the options enumerated for this
    topology, or the tables to enumerate now; `.attrs`: enumerate_s, combinations."""
    check_int("repeats", planning.repeats, low=1)
    enumerated = source
    if not isinstance(source, Enumerated):
        enumerated = enumerate_options(source, topology, planning.batch_size, planning.constraints)
    proposers = default_proposers() if proposers is None else proposers
    if not proposers:
        raise ValueError("proposers is empty: pass at least one name -> proposer factory")
    # plans of one option per table: torchrec's GridSearchProposer skips past MAX_PROPOSALS
    combinations = math.prod(collections.Counter(o.fqn for o in enumerated.options).values())
    rows = []
    for name in tqdm(list(proposers), desc="proposers", disable=not progress):
        made = [proposers[name]() for _ in range(planning.repeats)]
        runs = [planning.run(p, enumerated, topology, name) for p in made]
        seconds = [r.seconds for r in runs]
        median = sorted(range(len(runs)), key=seconds.__getitem__)[(len(runs) - 1) // 2]
        run, used = runs[median], made[median]
        ours = [p for p in (used if isinstance(used, list) else [used]) if hasattr(p, "num_refinements")]
        considered = sum(p.num_knapsack_proposals + p.num_refinements for p in ours)
        nothing = {"hbm_gb": math.nan, "ddr_gb": math.nan}  # no plan
        peak = rank_loads(run.plan, topology.world_size).max() if run.plan else nothing
        skipped = name == "GridSearch" and combinations > MAX_PROPOSALS  # torchrec skips it then
        note = f"skipped: {combinations:.3g} combinations > {MAX_PROPOSALS}" if skipped else run.note
        rows.append(
            {
                "proposer": name,
                "perf_rating": run.perf_rating,
                "max_hbm_gb": peak["hbm_gb"],
                "max_ddr_gb": peak["ddr_gb"],
                "feasible": run.plan is not None,
                "uvm_tables": sum(o.compute_kernel in UVM_KERNELS for o in run.plan or []),
                "plans_considered": considered or run.proposals,
                "proposals": run.proposals,
                "plan_s": run.seconds,
                "plan_s_min": min(seconds),
                "plan_s_max": max(seconds),
                "plan_s_runs": seconds,
                "end_to_end_s": enumerated.seconds + run.seconds,
                "proposer_s": run.proposer_s,
                "partitioner_s": run.partitioner_s,
                "timed_out": any(r.timed_out for r in runs),
                "same_rating_every_run": len({str(r.perf_rating) for r in runs}) == 1,  # str: nan == nan
                "note": note,
            }
        )
    table = pd.DataFrame(rows).set_index("proposer")
    table.attrs.update(enumerate_s=enumerated.seconds, combinations=combinations)
    return table


def timing_breakdown(comparison: pd.DataFrame) -> pd.DataFrame:
    """Where each proposer's planning time went (a `compare_proposers` table): the shared
    enumeration, the proposer, torchrec's partitioner, the rest of torchrec's planner (rating,
    copying the best plan), end to end, and the plans considered and proposed."""
    parts = ["enumerate_s", "proposer_s", "partitioner_s", "planner_rest_s", "plan_s", "end_to_end_s"]
    enumerate_s = comparison.attrs.get("enumerate_s", math.nan)
    rest_s = comparison.plan_s - comparison.proposer_s - comparison.partitioner_s
    table = comparison.assign(enumerate_s=enumerate_s, planner_rest_s=rest_s)
    return table[[*parts, "plans_considered", "proposals"]]


def budget_sweep(
    enumerated: Enumerated,
    hbm_caps_gb: Sequence[float],
    world_size: int,
    planning: Planning = Planning(),
    proposers: dict[str, ProposerFactory] | None = None,
    ddr_cap_gb: float | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """`compare_proposers` at each HBM budget per device of a GPU topology (the options do not
    depend on it: one enumeration serves all), with `memory_ratio` at that budget (below 1 memory
    binds in total)."""
    if not hbm_caps_gb:
        raise ValueError("hbm_caps_gb is empty: give at least one HBM budget per device")
    frames = []
    for cap in tqdm(list(hbm_caps_gb), desc="budgets", disable=not progress):
        topology = make_topology(world_size, "cuda", hbm_cap_gb=cap, ddr_cap_gb=ddr_cap_gb)
        ratio = memory_ratio(
            enumerated, topology, planning.batch_size, planning.storage_reservation_percentage
        )
        table = compare_proposers(enumerated, topology, planning, proposers).reset_index()
        frames.append(table.assign(hbm_cap_gb=cap, memory_ratio=ratio))
    return pd.concat(frames, ignore_index=True)


def random_instance(seed: int, num_tables: int = 3) -> tuple[Model, Topology]:
    """A small model and 2 to 4 GPUs whose HBM binds: per device, 15% to 120% of the fp32 rows of
    all tables spread evenly."""
    rng = np.random.default_rng(seed)
    world_size = int(rng.integers(2, 5))
    model = make_model(num_tables, seed)
    budget = fused_table_gb(model.tables) / world_size * rng.uniform(0.15, 1.2)
    return model, make_topology(world_size, "cuda", hbm_cap_gb=budget)


def quality_study(
    num_instances: int,
    seed: int = 0,
    num_tables: int = 3,
    batch_size: int = 512,
    progress: bool = False,
    storage_reservation_percentage: float = 0.15,
) -> pd.DataFrame:
    """Each of `default_proposers` alone (`compare_proposers`), its rating over the brute-force best
    on random small instances: one row per instance and proposer with the instance's `world_size`
    and `hosts` (ratio inf: no plan where brute force found one; NaN: GridSearch skipped, as
    torchrec skips it past MAX_PROPOSALS combinations; instances without any plan left out), all
    under one storage reservation."""
    check_int("num_instances", num_instances, low=1)
    proposers = {k: v for k, v in default_proposers().items() if k != "torchrec default"}
    frames = []
    for instance in tqdm(range(seed, seed + num_instances), desc="instances", disable=not progress):
        model, topology = random_instance(instance, num_tables)
        enumerated = enumerate_options(model.tables, topology, batch_size, model.constraints)
        best = brute_force_rating(enumerated, topology, batch_size, storage_reservation_percentage)
        if not math.isfinite(best):
            continue
        planning = Planning(batch_size, model.constraints, storage_reservation_percentage)
        table = compare_proposers(enumerated, topology, planning, proposers)
        rating = table.perf_rating.where(table.feasible, math.inf)
        rating = rating.mask(table.note.str.startswith("skipped"))
        hosts = topology.world_size // topology.local_world_size
        frame = pd.DataFrame({"perf_rating": rating, "brute_force": best, "ratio": rating / best})
        frames.append(
            frame.reset_index().assign(instance=instance, world_size=topology.world_size, hosts=hosts)
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def quality_summary(study: pd.DataFrame) -> pd.DataFrame:
    """Per proposer of a `quality_study` (notebook 03's table, the planner bench's record): the
    instances it planned (`instances`), those GridSearch skipped (`skipped`: NaN ratio) and those
    without a plan (`no_plan`: inf); among its plans the worst and median ratio to brute force's best
    (`worst_ratio`, `median_ratio`); and the share of the instances it planned within 2% of the best
    (`within_2pct`; no plan is not within)."""
    ratios = study.groupby("proposer", sort=False).ratio
    found = study.ratio.where(np.isfinite(study.ratio)).groupby(study.proposer, sort=False)  # inf: NaN
    return pd.DataFrame(
        {
            "instances": ratios.count(),
            "skipped": ratios.size() - ratios.count(),
            "no_plan": ratios.count() - found.count(),
            "worst_ratio": found.max(),
            "median_ratio": found.median(),
            "within_2pct": (study.ratio <= 1.02).groupby(study.proposer, sort=False).sum() / ratios.count(),
        }
    )


# What each piece of DynamicProgrammingProposer buys: a ladder of proposers, each rung turning one piece
# back on, from the plain knapsack (every frontier plan, largest memory first: torchrec's DP recipe on
# embnb's bins) to the default proposer (+ the replica of torchrec's partitioner).
_NOTHING = dict(bisect=False, slack=False, prune=False, max_caps=0, max_refinements=0, replay=False)
_ADDED = [  # rung name, the proposer argument it turns back to its default
    ("plain knapsack", None),
    ("+ bisection", "bisect"),
    ("+ memory slack", "slack"),
    ("+ capped runs", "max_caps"),
    ("+ local search", "max_refinements"),
    ("+ lower-bound pruning", "prune"),
    ("+ the replica", "replay"),
]
LADDER: dict[str, dict[str, Any]] = {  # rung -> DynamicProgrammingProposer arguments
    name: {k: v for k, v in _NOTHING.items() if k not in [a for _, a in _ADDED[: i + 1]]}
    for i, (name, _) in enumerate(_ADDED)
}
_COLUMNS = ("perf_rating", "same_rating_every_run", "plans_considered", "proposals", "plan_s")
_COLUMNS += ("plan_s_min", "plan_s_max", "timed_out")  # of compare_proposers' table


def ablation_table(
    enumerated: Enumerated,
    topology: Topology,
    planning: Planning = Planning(repeats=3),
    bins_per_device: int = 100,
) -> pd.DataFrame:
    """One row per rung (`compare_proposers`' columns, by rung): the plan's perf rating (the search
    is deterministic: `same_rating_every_run`), the plans the proposer considered, the proposals
    torchrec's partitioner placed, and planning seconds (the median run's, min, max over
    `planning.repeats`; no enumeration)."""
    proposers = {
        name: functools.partial(DynamicProgrammingProposer, bins_per_device=bins_per_device, **arguments)
        for name, arguments in LADDER.items()
    }
    table = compare_proposers(enumerated, topology, planning, proposers).rename_axis("rung")
    return table[list(_COLUMNS)]

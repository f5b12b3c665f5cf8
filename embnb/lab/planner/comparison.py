"""Proposers side by side in torchrec's planner: each over the same
enumerated options with a fresh `EmbeddingShardingPlanner` (`run_planner`),
under the same storage reservation, and again as the HBM budget shrinks.

    table = compare_proposers(tables, topology, batch_size=512)   # one row per proposer
    timing_breakdown(table)                                        # where the time went
    sweep = budget_sweep(enumerated, [2.0, 1.0, 0.5], world_size=8, batch_size=512)
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
from torchrec.distributed.planner.proposers import (
    MAX_PROPOSALS,
    GreedyProposer,
    GridSearchProposer,
    UniformProposer,
)
from torchrec.distributed.planner.proposers import (
    DynamicProgrammingProposer as TorchrecDynamicProgrammingProposer,
)
from torchrec.distributed.planner.types import ParameterConstraints, Proposer, Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from embnb._checks import check_int
from embnb.lab.planner.explain import memory_ratio
from embnb.lab.planner.hosts import hosts_of
from embnb.lab.planner.models import Enumerated, enumerate_options
from embnb.lab.planner.planning import PlanRun, rank_loads, run_planner
from embnb.planner.proposer import DynamicProgrammingProposer
from embnb.planner.topology import make_topology

__all__ = ["ProposerFactory", "default_proposers", "compare_proposers", "timing_breakdown", "budget_sweep"]


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
    enumeration's seconds are in `.attrs["enumerate_s"]`, the topology's
    hosts in `.attrs["hosts"]`.
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
        enumerate_s=enumerated.seconds,
        num_options=len(enumerated.options),
        combinations=combinations,
        hosts=hosts_of(topology),
    )
    return table


UVM_KERNELS = ("fused_uvm", "fused_uvm_caching")


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
        # tables whose rows live in DDR (UVM): FBGEMM runs those kernels only on a GPU
        "uvm_tables": sum(o.compute_kernel in UVM_KERNELS for o in run.plan) if run.plan else 0,
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
    `embnb.lab.planner.explain.memory_ratio` at that budget (below 1 memory binds),
    `hosts`: the topology's hosts (`hosts_of`)."""
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
        frames.append(
            table.reset_index().assign(hbm_cap_gb=cap, memory_ratio=ratio, hosts=hosts_of(topology))
        )
    return pd.concat(frames, ignore_index=True)

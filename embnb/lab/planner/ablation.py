"""What each piece of `DynamicProgrammingProposer` buys: the same options
planned by a ladder of proposers, each adding one piece to the one before,
every rung in torchrec's planner with its rating, its work and its time.

    table = ablation_table(enumerated, topology, batch_size=512, repeats=3)

Rungs (`LADDER`): the plain knapsack (every frontier plan, largest memory
first: torchrec's DP recipe on embnb's bins), + bisection past plans that
cannot be placed, + memory slack, + capped runs, + local search, +
lower-bound pruning, + the replica of torchrec's partitioner (the default
proposer). Ratings do not depend on the repeat; times are median and range.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd
from torchrec.distributed.planner.types import ParameterConstraints, Topology

from embnb._checks import check_int
from embnb.lab.planner.models import Enumerated
from embnb.lab.planner.planning import run_planner
from embnb.planner.proposer import DynamicProgrammingProposer

__all__ = ["LADDER", "ablation_table", "ablation_records"]

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


def _ladder() -> dict[str, dict[str, Any]]:
    rungs, off = {}, dict(_NOTHING)
    for name, argument in _ADDED:
        off.pop(argument, None)
        rungs[name] = dict(off)
    return rungs


LADDER: dict[str, dict[str, Any]] = _ladder()  # rung -> DynamicProgrammingProposer arguments


def ablation_table(
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    *,
    constraints: dict[str, ParameterConstraints] | None = None,
    bins_per_device: int = 100,
    repeats: int = 3,
    timeout_s: float | None = None,
    storage_reservation_percentage: float = 0.15,
) -> pd.DataFrame:
    """One row per rung of `LADDER`: the plan's perf rating, the plans the
    proposer considered (knapsack plans and refinements), the proposals
    torchrec's partitioner placed, and planning seconds (median, min, max
    over `repeats` runs; the enumeration is not included)."""
    check_int("repeats", repeats, low=1)
    rows = []
    for name, arguments in LADDER.items():
        runs = []
        for _ in range(repeats):
            proposer = DynamicProgrammingProposer(bins_per_device=bins_per_device, **arguments)
            run = run_planner(
                proposer,
                enumerated,
                topology,
                batch_size,
                constraints=constraints,
                timeout_s=timeout_s,
                storage_reservation_percentage=storage_reservation_percentage,
            )
            runs.append((run, proposer))
        run, proposer = runs[0]
        if len({r.perf_rating for r, _ in runs}) > 1:  # the search is deterministic: a change is a bug
            raise RuntimeError(f"{name}: ratings differ between repeats: {[r.perf_rating for r, _ in runs]}")
        seconds = [r.seconds for r, _ in runs]
        rows.append(
            {
                "rung": name,
                "perf_rating": run.perf_rating,
                "plans_considered": proposer.num_knapsack_proposals + proposer.num_refinements,
                "proposals": run.proposals,
                "plan_s": statistics.median(seconds),
                "plan_s_min": min(seconds),
                "plan_s_max": max(seconds),
                "timed_out": any(r.timed_out for r, _ in runs),
            }
        )
    return pd.DataFrame(rows).set_index("rung")


def ablation_records(table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """`ablation_table`'s rows as plain numbers, by rung (a rating of None: no plan)."""
    return {
        rung: {
            "perf_rating": None if math.isnan(row.perf_rating) else float(row.perf_rating),
            "plans_considered": int(row.plans_considered),
            "proposals": int(row.proposals),
            "plan_s": float(row.plan_s),
            "plan_s_min": float(row.plan_s_min),
            "plan_s_max": float(row.plan_s_max),
            "timed_out": bool(row.timed_out),
        }
        for rung, row in table.iterrows()
    }

"""What each piece of `DynamicProgrammingProposer` buys: the same options planned by a ladder of
proposers, each rung turning one piece back on (`LADDER`): the plain knapsack (every frontier plan,
largest memory first: torchrec's DP recipe on embnb's bins), + bisection past plans that cannot be
placed, + memory slack, + capped runs, + local search, + lower-bound pruning, + the replica of
torchrec's partitioner (the default proposer).
"""

from __future__ import annotations

import statistics
from typing import Any

import pandas as pd
from torchrec.distributed.planner.types import Topology

from embnb._checks import check_int
from embnb.lab.planner.comparison import Planning
from embnb.lab.planner.models import Enumerated
from embnb.planner.proposer import DynamicProgrammingProposer

__all__ = ["LADDER", "ablation_table"]

_NOTHING = dict(bisect=False, slack=False, prune=False, max_caps=0, max_refinements=0, replay=False)
_ADDED = [  # rung name, the proposer argument it turns back to its default
    ("plain knapsack", None), ("+ bisection", "bisect"), ("+ memory slack", "slack"),
    ("+ capped runs", "max_caps"), ("+ local search", "max_refinements"), ("+ lower-bound pruning", "prune"),
    ("+ the replica", "replay"),
]  # fmt: skip
LADDER: dict[str, dict[str, Any]] = {  # rung -> DynamicProgrammingProposer arguments
    name: {k: v for k, v in _NOTHING.items() if k not in [a for _, a in _ADDED[: i + 1]]}
    for i, (name, _) in enumerate(_ADDED)
}


def ablation_table(
    enumerated: Enumerated,
    topology: Topology,
    planning: Planning = Planning(repeats=3),
    bins_per_device: int = 100,
) -> pd.DataFrame:
    """One row per rung: the plan's perf rating (the same every repeat: the search is
    deterministic), the plans the proposer considered, the proposals torchrec's partitioner
    placed, and planning seconds (median, min, max over `planning.repeats`; no enumeration)."""
    runs_of, rows = range(check_int("repeats", planning.repeats, low=1)), []
    for name, arguments in LADDER.items():
        made = [DynamicProgrammingProposer(bins_per_device=bins_per_device, **arguments) for _ in runs_of]
        runs = [planning.run(proposer, enumerated, topology) for proposer in made]
        if len({r.perf_rating for r in runs}) > 1:  # a change is a bug
            raise RuntimeError(f"{name}: ratings differ between repeats: {[r.perf_rating for r in runs]}")
        seconds = [r.seconds for r in runs]
        rows.append(
            {"rung": name, "perf_rating": runs[0].perf_rating, "proposals": runs[0].proposals,
             "plans_considered": made[0].num_knapsack_proposals + made[0].num_refinements,
             "plan_s": statistics.median(seconds), "plan_s_min": min(seconds), "plan_s_max": max(seconds),
             "timed_out": any(r.timed_out for r in runs)}
        )  # fmt: skip
    return pd.DataFrame(rows).set_index("rung")

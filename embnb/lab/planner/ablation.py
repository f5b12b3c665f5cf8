"""What each piece of `DynamicProgrammingProposer` buys: the same options planned by a ladder of
proposers, each rung turning one piece back on (`LADDER`): the plain knapsack (every frontier plan,
largest memory first: torchrec's DP recipe on embnb's bins), + bisection past plans that cannot be
placed, + memory slack, + capped runs, + local search, + lower-bound pruning, + the replica of
torchrec's partitioner (the default proposer).
"""

from __future__ import annotations

import functools
from typing import Any

import pandas as pd
from torchrec.distributed.planner.types import Topology

from embnb.lab.planner.comparison import Planning, compare_proposers
from embnb.lab.planner.models import Enumerated
from embnb.planner.proposer import DynamicProgrammingProposer

__all__ = ["LADDER", "ablation_table"]

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

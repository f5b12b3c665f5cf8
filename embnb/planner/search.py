"""The DP proposer's two searches on the options as arrays (`SearchSpace`): the knapsack runs
(`KnapsackRuns`, each a `FrontierSearch`) and the hill climbs around the best plans so far
(`HillClimb`). `embnb.planner.proposer` feeds them the planner's (or the replica's) answers.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torchrec.distributed.planner.types import ShardingOption

from embnb.planner.knapsack import FrontierSearch, Knapsack, knapsack_axes, without_dominated
from embnb.planner.replica import Placement
from embnb.planner.space import UNIFORM, SearchSpace, gathered, gib_text

__all__ = ["KnapsackRuns", "Start", "HillClimb", "unplaced_tables", "slowest_rank_tables"]

_PAIR_TABLES = 8  # tables on the slowest rank whose options are changed in pairs
_REFINE_STARTS = 4  # best rated plans that each start a hill climb


class KnapsackRuns:
    """Least-perf plans per memory bin, largest memory first: uncapped, then
    with the largest partitioned shard capped, on perf (just below the largest
    in the run before's best rated plan: balance), then on memory (just below
    the largest in the run before's first plan: packing). Given `groups`
    (each option's TBE group id, [tables, options]), `fewer_groups` makes
    runs with fewer groups afterwards. A run is made when the one before is
    done. When no plan fits at all, iterating yields nothing
    and `no_fit_reason` says why."""

    def __init__(
        self,
        space: SearchSpace,
        bins_per_device: int,
        ddr_bins_per_device: int,
        max_caps: int,
        bisect: bool = True,
        slack: bool = True,
        groups: np.ndarray | None = None,
    ) -> None:
        self.space, self.max_caps, self.bisect, self.slack = space, max_caps, bisect, slack
        self.groups = groups
        self._uncapped: FrontierSearch | None = None
        self.axes, self.capacity, self.bins, self.weights = knapsack_axes(
            space, bins_per_device, ddr_bins_per_device
        )
        self.main = self.axes[0] if self.axes else 0
        self.main_mem = np.ascontiguousarray(space.mem[..., self.main])  # [tables, options]: a small gather
        self.valid = np.isfinite(space.perf)
        self.rows = np.arange(len(space.options))
        self.no_fit_reason: str | None = None
        # Plans of earlier runs, as 16-byte digests of their rows: the rows
        # themselves (a byte per table, per plan) grow with tables x plans.
        self._seen: set[bytes] = set()
        self._workspace = torch.empty(0, dtype=torch.int32)  # the native runs' trace, reused run to run
        self.key_type = np.min_scalar_type(max(space.perf.shape[1] - 1, 0))  # holds any option index

    def run(self, allowed: np.ndarray) -> FrontierSearch:
        """One knapsack over the `allowed` options; its frontier without the
        plans earlier runs had."""
        space = self.space
        knapsack = Knapsack(self.capacity, self.bins, workspace=self._workspace)
        perf = without_dominated(np.where(allowed, space.perf, np.inf), self.weights)
        knapsack.add_tables(self.weights, perf)
        # The plans in the least type that holds an option index (a byte per
        # table, not eight: the frontier is states x tables).
        frontier = np.asarray(knapsack.frontier(len(self.rows)), dtype=self.key_type, order="C")
        keys = [hashlib.blake2b(row, digest_size=16).digest() for row in _row_bytes(frontier)]
        new = np.array([key not in self._seen for key in keys], dtype=bool)
        self._seen.update(itertools.compress(keys, new))
        plans = frontier[new]
        memory = gathered(self.main_mem, plans, np.sum)
        return FrontierSearch(plans, memory, space, self.bisect, self.slack)

    def __iter__(self) -> Iterator[FrontierSearch]:
        space, rows, valid = self.space, self.rows, self.valid
        uncapped = self.run(valid)
        if not len(uncapped.plans):
            smallest = np.where(valid[..., None], space.mem, np.inf).min(1).sum(0)
            self.no_fit_reason = (
                f"the tables do not fit together: no choice of options fits the {space.world_size} "
                f"devices' {gib_text(space.capacity[0])} HBM and {gib_text(space.capacity[1])} DDR in total "
                f"after the storage reservation (each table's least HBM adds up to {gib_text(smallest[0])}, "
                f"least DDR to {gib_text(smallest[1])}); give each device more memory, or shrink the "
                "tables or the batch (torchrec sizes each shard's input and output buffers by the world "
                "size, so more devices need not help)"
            )
            return
        yield uncapped
        for sizes, balance in ((space.shard_perf, True), (space.shard_mem[..., self.main], False)):
            search = uncapped
            for _ in range(self.max_caps):
                reference = search.plans[search.best_index() if balance else 0]
                largest = sizes[rows, reference].max()
                smaller = sizes[valid & (sizes < largest)]
                if not len(smaller):
                    break
                search = self.run(valid & (sizes <= smaller.max()))
                if not len(search.plans):
                    break
                yield search
        self._uncapped = uncapped

    def fewer_groups(self) -> Iterator[FrontierSearch]:
        """Given `groups`, after the runs of `iter(self)`: runs that leave TBE groups out (nothing without
        `groups` or before the uncapped run). The knapsack sums perf; a rating that prices each TBE group
        on a rank (and each sharding type's collectives) sees what it cannot. So: a run of each group alone
        that covers every table; then greedily, from the uncapped run's best plan, a run without each group
        of the current plan (its tables join the other groups), and the run that did best (its best rating,
        or its least lower bound where the proposer skipped its plans as unable to win: one more group left
        out may still win) becomes the current plan with its group left out from then on, until the plan
        has one group. A run's ratings are known when the next is made: the proposer rates a run's plans
        before asking for the next."""
        uncapped = self._uncapped
        if self.groups is None or uncapped is None:
            return
        for group in sorted(set(self.groups[self.valid].tolist())):
            search = self._run_if_covered(self.valid & (self.groups == group))
            if search is not None:
                yield search
        removed: list[int] = []
        plan = uncapped.plans[uncapped.best_index()]
        while True:
            groups = sorted(set(self.groups[self.rows, plan].tolist()) - set(removed))
            if len(groups) < 2:
                return
            runs = []
            for group in groups:
                search = self._run_if_covered(self.valid & ~np.isin(self.groups, [*removed, group]))
                if search is not None:
                    yield search
                    runs.append((*_best(search), group))
            if not runs:
                return
            _, plan, group = min(runs, key=lambda run: run[0])
            removed.append(group)

    def _run_if_covered(self, allowed: np.ndarray) -> FrontierSearch | None:
        """`run(allowed)` where every table has an allowed option and the run has new plans."""
        if not allowed.any(axis=1).all():
            return None
        search = self.run(allowed)
        return search if len(search.plans) else None


def _best(search: FrontierSearch) -> tuple[float, np.ndarray]:
    """A run's best rating and plan, or, where none of its plans was rated, its least lower bound
    and that plan."""
    if search.ratings:
        index = search.best_index()
        return search.ratings[index], search.plans[index]
    index = int(np.argmin(search.bound))
    return float(search.bound[index]), search.plans[index]


def _row_bytes(rows: np.ndarray) -> list[bytes]:
    """Each row's bytes (as `row.tobytes()`), made in one pass."""
    width = rows.shape[1] * rows.itemsize
    if not width:
        return [b""] * len(rows)
    return np.ascontiguousarray(rows).view(np.dtype((np.void, width))).ravel().tolist()


@dataclass
class Start:
    """A plan a hill climb may start from."""

    key: float  # its rating, or its lower bound if it was not placed
    plan: np.ndarray  # an option index per table
    tables: Callable[[], list[int]]  # the tables to change first (worked out when asked)
    placed: bool


class HillClimb:
    """Hill climbs from the best starts in turn: neighbours changing one of
    the first tables to change, then two of them or any one table, each group
    by lower bound while it can beat the best rating; the first improvement
    becomes the centre."""

    def __init__(self, space: SearchSpace, refinements: int, best_rating: Callable[[], float], prune: bool):
        self.space, self.refinements_left = space, refinements
        self.best_rating, self.prune = best_rating, prune
        self.starts: list[Start] = []
        self._started: set[float] = set()  # keys of the starts used
        self._center: Start | None = None  # the start climbed from now
        self._neighbors: Iterator[np.ndarray] | None = None

    def add(self, start: Start) -> None:
        self.starts.append(start)
        center = self._center
        if center is not None and start.placed and (not center.placed or start.key < center.key):
            self._center, self._neighbors = start, None  # climb on from the better plan

    def next(self, known: Callable[[np.ndarray], bool]) -> np.ndarray | None:
        """The next neighbour not `known` yet, or None when the climbs are done."""
        while self.refinements_left > 0:
            if self._neighbors is None:
                if self._center is None and not self._next_center():
                    return None
                self._neighbors = self._neighbors_of(self._center.plan, self._center.tables())
            for choice in self._neighbors:
                if not known(choice):
                    self.refinements_left -= 1
                    return choice
            self._center = self._neighbors = None  # a local optimum
        return None

    def _next_center(self) -> bool:
        """The best start not refined yet, among the few best keys (plans
        rated alike are usually the same placement)."""
        keys = sorted({start.key for start in self.starts})[:_REFINE_STARTS]
        for start in sorted(self.starts, key=lambda start: start.key):  # stable: first seen first
            if start.key in keys and start.key not in self._started:
                self._started.add(start.key)
                self._center = start
                return True
        return False

    def _neighbors_of(self, choice: np.ndarray, first: list[int]) -> Iterator[np.ndarray]:
        space = self.space
        valid = np.isfinite(space.perf)

        def singles(tables) -> list:
            return [[(t, o)] for t in tables for o in np.flatnonzero(valid[t]) if o != choice[t]]

        heavy = first[:_PAIR_TABLES]
        pairs = [
            [(t1, o1), (t2, o2)]
            for t1, t2 in itertools.combinations(heavy, 2)
            for o1 in np.flatnonzero(valid[t1])
            if o1 != choice[t1]
            for o2 in np.flatnonzero(valid[t2])
            if o2 != choice[t2]
        ]
        for moves in (singles(heavy), pairs + singles(range(len(choice)))):
            bounds, kept = [], []
            for size in (1, 2):
                batch = np.array([m for m in moves if len(m) == size]).reshape(-1, size, 2)
                if len(batch):
                    bound, fits = space.neighbor_bounds(choice, batch)
                    bounds.append(bound[fits])
                    kept.extend(batch[fits])
            if not kept:
                continue
            bounds = np.concatenate(bounds)
            for i in np.argsort(bounds, kind="stable"):
                if self.prune and bounds[i] >= self.best_rating():
                    break
                neighbor = choice.copy()
                neighbor[kept[i][:, 0]] = kept[i][:, 1]
                yield neighbor


def unplaced_tables(
    space: SearchSpace,
    choice: np.ndarray,
    ranks: list[list[int | None]] | None,
    placement: Placement | None,
) -> list[int]:
    """The table the partitioner could not place (uniform options go first,
    then the largest storage first), then the biggest shards. `ranks`: each
    shard's rank as the planner set it, or None to read `placement`'s."""
    ranks = placement.ranks if ranks is None else ranks
    unplaced = [t for t, shard_ranks in enumerate(ranks) if None in shard_ranks]
    failed = []
    if unplaced and len(unplaced) < len(ranks):  # else no trace (e.g. a cached answer)
        option = [space.options[t][choice[t]] for t in unplaced]
        uniform = [t for t, o in zip(unplaced, option) if o.partition_by == UNIFORM]
        storage = [space.storage[t][choice[t]] for t in unplaced]
        failed = [uniform[0] if uniform else unplaced[storage.index(max(storage))]]
    biggest = space.shard_mem[np.arange(len(choice)), choice].max(1)
    order = np.argsort(-biggest, kind="stable")
    return failed + [int(t) for t in order if biggest[t] > 0 and t not in failed]


def slowest_rank_tables(
    space: SearchSpace,
    choice: np.ndarray,
    ranks: list[list[int | None]] | None,
    placement: Placement | None,
) -> list[int]:
    """Tables with a shard on the slowest rank, heaviest there first (ties:
    the rank, then the table, seen first in plan order)."""
    ranks = placement.ranks if ranks is None else ranks
    options: list[ShardingOption] = [opts[o] for opts, o in zip(space.options, choice)]
    if placement is None:  # the planner's answer, as its shards say
        by_rank: dict[int | None, float] = collections.defaultdict(float)
        for option, shard_ranks in zip(options, ranks):
            for shard, r in zip(option.shards, shard_ranks):
                by_rank[r] += shard.perf.total
        if not by_rank:
            return []
        slowest = max(by_rank, key=by_rank.get)
    else:  # the replica's loads; the first rank seen wins a tie, as above
        loads = placement.loads.tolist()
        seen: dict[int, None] = {}
        for shard_ranks in ranks:
            seen.update(dict.fromkeys(shard_ranks))
            if len(seen) == len(loads):
                break
        slowest = max(seen, key=loads.__getitem__)
    on_slowest = {}
    for t, (option, shard_ranks) in enumerate(zip(options, ranks)):
        if slowest in shard_ranks:
            on_slowest[t] = sum(s.perf.total for s, r in zip(option.shards, shard_ranks) if r == slowest)
    return sorted(on_slowest, key=on_slowest.get, reverse=True)

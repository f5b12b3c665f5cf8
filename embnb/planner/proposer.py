"""A dynamic-programming sharding Proposer for torchrec's planner.

torchrec's `EmbeddingShardingPlanner` asks its proposers for plans (one
`ShardingOption` per table), places each on ranks with `GreedyPerfPartitioner`,
rates it with `NoopPerfModel` (the slowest rank's summed perf) and keeps the
best. `DynamicProgrammingProposer` proposes, in this order:

1. a knapsack over discretized memory bins (`embnb.planner.knapsack`): for
   each memory total, the options with the least summed perf, from the largest
   total down. Unlike torchrec's own DP proposer it plans on DDR where HBM is
   zero (CPU), drops options whose largest shard fits on no device, and bins
   HBM x DDR where both can bind;
2. the same knapsack with the largest partitioned shard capped on perf (the
   slowest rank carries at least its largest shard: balance) or on memory
   (packing), each cap just below the last run's largest;
3. changes of one or two tables around the best plans so far, guided by the
   ratings the planner feeds back.

Within a run, plans the partitioner cannot place are bisected past, and below
the first placed one plans with 1%, 2%, 4% ... less memory are tried: slack
lets the partitioner balance ranks. A proposal is skipped when a lower bound on
its slowest rank cannot beat the best rating so far, or when its memory cannot
fit the devices.

Every plan considered is placed and rated here by a replica of torchrec's
GreedyPerfPartitioner and NoopPerfModel (`embnb.planner.replica`, equal to the
bit), so the planner's partitioner sees two proposals: the first (each table's
smallest option: it brings the devices' memory) and the best plan found, which
checks the replica. If the planner rates that plan otherwise (another
partitioner or perf model), the search starts again without the replica,
proposing every plan as before.

    planner = create_planner(topology, batch_size=512)    # this proposer first
    plan = planner.plan(module, sharders)
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import itertools
import logging
import math
from collections.abc import Callable, Iterator

import numpy as np
from torchrec.distributed.planner.types import (
    Enumerator,
    PlannerError,
    Proposer,
    ShardingOption,
    Topology,
)

from embnb._checks import check_bool, check_int
from embnb.planner.knapsack import FrontierSearch, Knapsack, knapsack_axes, without_dominated
from embnb.planner.replica import GreedyPerfReplica, Placement
from embnb.planner.space import UNIFORM, SearchSpace, ShardValues, by_table, gib_text

__all__ = ["DynamicProgrammingProposer"]

logger = logging.getLogger(__name__)

_PAIR_TABLES = 8  # tables on the slowest rank whose options are changed in pairs
_REFINE_STARTS = 4  # best rated plans that each start a hill climb


class DynamicProgrammingProposer(Proposer):
    """Knapsack proposals, then refinements guided by the planner's feedback.

    Args:
        bins_per_device: memory bins per device on the knapsack's main axis
            (HBM, or DDR on CPU topologies); more bins, finer totals.
        ddr_bins_per_device: bins per device on the DDR axis when HBM and DDR
            can both bind (the 2-D knapsack).
        max_caps: knapsack runs with the largest partitioned shard capped, on
            its perf and on its memory (0: the plain knapsack only).
        max_refinements: proposals spent on changing one or two tables of the
            best plans so far.
        bisect: in each knapsack run, bisect past plans the partitioner
            cannot place and propose only the first placed one and a few
            below it (False: every plan of the run, largest memory first,
            as torchrec's DP proposer does).
        slack: also propose plans with 1%, 2%, 4% ... less memory than the
            first placed one (room for the partitioner to balance ranks).
        prune: skip plans whose lower bound on the slowest rank cannot beat
            the best rating so far.
        replay: place and rate plans with a replica of torchrec's
            GreedyPerfPartitioner and NoopPerfModel
            (`embnb.planner.replica`) and propose only those that beat the
            best rating so far; the same plans are considered either way,
            the planner partitions far fewer. Off by itself when the
            planner's answer differs from the replica's (another
            partitioner or perf model).

    When no plan can fit (a table fits on no device, or the tables do not fit
    the devices together) it proposes nothing more and leaves the verdict to
    the planner (a later proposer, or torchrec's own PlannerError); why is in
    `no_plan_reason` and logged as a warning.
    """

    def __init__(
        self,
        bins_per_device: int = 100,
        ddr_bins_per_device: int = 10,
        max_caps: int = 8,
        max_refinements: int = 100,
        replay: bool = True,
        *,
        bisect: bool = True,
        slack: bool = True,
        prune: bool = True,
    ) -> None:
        self._bins_per_device = check_int("bins_per_device", bins_per_device, low=1)
        self._ddr_bins_per_device = check_int("ddr_bins_per_device", ddr_bins_per_device, low=1)
        self._max_caps = check_int("max_caps", max_caps, low=0)
        self._max_refinements = check_int("max_refinements", max_refinements, low=0)
        self._replay = check_bool("replay", replay)
        self._bisect = check_bool("bisect", bisect)
        self._slack = check_bool("slack", slack)
        self._prune = check_bool("prune", prune)
        self.load([])

    def load(
        self,
        search_space: list[ShardingOption],
        enumerator: Enumerator | None = None,
        *,
        replay: bool | None = None,
    ) -> None:
        if replay is not None:
            self._replay = check_bool("replay", replay)
        with _gc_paused():
            self._load(search_space)

    def _load(self, search_space: list[ShardingOption]) -> None:
        self._search_space = search_space
        self._options = by_table(search_space)
        self._space: SearchSpace | None = None
        self._best_rating = math.inf
        self._placed: dict[bytes, bool] = {}  # what the partitioner said per plan
        self._runs: Iterator[FrontierSearch] | None = None  # knapsack runs
        self._search: FrontierSearch | None = None  # the run being proposed from
        self._pending: Iterator[int] = iter(())  # its plans still to consider
        self._index: int | None = None  # the current proposal's place in it
        # Where refinements may start: (rating, or bound if it was not placed;
        # plan; the tables to change first, when asked; placed). The center is
        # the current one.
        self._starts: list[tuple[float, np.ndarray, Callable[[], list[int]], bool]] = []
        self._started: set[float] = set()  # keys of the starts used
        self._center: tuple[float, np.ndarray, Callable[[], list[int]], bool] | None = None
        self._neighbors: Iterator[np.ndarray] | None = None
        self._refinements_left = self._max_refinements
        self.num_knapsack_proposals = self.num_refinements = 0  # how the plans considered split
        self.num_replayed = 0  # plans the replica placed and rated instead of the planner
        self._replica: GreedyPerfReplica | None = None
        self._predicted: Placement | None = None  # the replica's answer for the current proposal
        self._best_replayed: tuple[np.ndarray, Placement] | None = None  # the best plan not proposed yet
        self.no_plan_reason: str | None = None  # why it stopped proposing, when no plan can fit
        # Before the first feedback the device memory is unknown: propose each
        # table's smallest option, like torchrec's DP proposer.
        self._values = ShardValues(search_space)
        self._current: np.ndarray | None = (
            np.array(
                [
                    min(range(len(opts)), key=lambda i: self._values.memory(opts[i])[:2])
                    for opts in self._options
                ]
            )
            if self._options
            else None
        )

    def propose(self) -> list[ShardingOption] | None:
        if self._current is None:
            return None
        return [options[o] for options, o in zip(self._options, self._current)]

    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None:
        with _gc_paused():
            self._feedback(partitionable, plan, perf_rating, storage_constraint)

    def _feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None,
        perf_rating: float | None,
        storage_constraint: Topology | None,
    ) -> None:
        if self._current is None:
            return
        if self._space is None:
            if storage_constraint is None:
                raise ValueError("feedback needs the storage_constraint (torchrec's planner passes it)")
            first = [opts[o] for opts, o in zip(self._options, self._current)]
            try:
                self._space = SearchSpace(self._options, storage_constraint, self._values)
            except PlannerError as error:  # a table fits on no device
                self._propose_nothing(str(error))
                return
            self._options = self._space.options
            if self._replay:
                self._replica = GreedyPerfReplica(self._options, storage_constraint, self._values)
            self._current = _indices(first, self._options)  # onto the options kept
            self._runs = self._knapsack_runs()
        choice, predicted, self._predicted = self._current, self._predicted, None
        placed = partitionable and perf_rating is not None
        if predicted is not None:  # the replica's best, proposed last: check it
            if (predicted.placed, predicted.rating) == (placed, perf_rating):
                self._current = None
            else:  # the planner's partitioner or perf model is not torchrec's default
                logger.warning(
                    "DynamicProgrammingProposer: the planner rated the plan %s, its replica %s; "
                    "searching again without the replica",
                    perf_rating,
                    predicted.rating,
                )
                self.load(self._search_space, replay=False)
            return
        if choice is not None:
            ranks = [[s.rank for s in o.shards] for o in plan or []]
            self._record(choice, placed, perf_rating, ranks, None)
        self._current = self._next_proposal()

    def _next_proposal(self) -> np.ndarray | None:
        """The next plan for the planner. With the replica, every plan it can
        place is placed and rated here; the planner gets the plans it cannot
        model, then the best one (to check the replica against)."""
        while True:
            choice = self._next()
            if choice is None:
                best, self._best_replayed = self._best_replayed, None
                if best is None or best[1].rating > self._best_rating:
                    return None
                choice, self._predicted = best
                return choice
            placement = self._replica.place(choice) if self._replica is not None else None
            if placement is None:
                return choice
            self.num_replayed += 1
            if placement.placed and placement.rating < self._best_rating:
                self._best_replayed = (choice, placement)
            self._record(choice, placement.placed, placement.rating, None, placement)

    def _record(
        self,
        choice: np.ndarray,
        placed: bool,
        perf_rating: float | None,
        ranks: list[list[int | None]] | None,
        placement: Placement | None,
    ) -> None:
        """What the partitioner said (or would say) about `choice`; where
        refinements may start from it. `ranks`: each shard's rank as the
        planner set it, or None where `placement` (the replica's answer)
        works them out, only for the starts refined."""
        self._placed[choice.tobytes()] = placed
        if self._index is not None:  # a knapsack plan
            self._search.record(self._index, placed, perf_rating)
        # Which tables to change first is worked out only for the starts refined.
        if placed:
            self._best_rating = min(self._best_rating, perf_rating)
            tables = functools.partial(self._slowest_rank_tables, choice, ranks, placement)
            start = (perf_rating, choice, tables, True)
        else:  # refine by its bound, changing first the table that did not fit
            tables = functools.partial(self._unplaced_tables, choice, ranks, placement)
            start = (self._space.lower_bound(choice), choice, tables, False)
        self._starts.append(start)
        center = self._center
        if center is not None and placed and (not center[3] or perf_rating < center[0]):
            self._center, self._neighbors = start, None  # climb on from the better plan

    def _propose_nothing(self, reason: str) -> None:
        """No plan can fit: stop proposing and say why. Raising here would
        stop torchrec's planner before its later proposers and its own no-plan
        report (its Stats, its PlannerError); the reason stays in
        `no_plan_reason` and in a warning."""
        self.no_plan_reason = reason
        self._current, self._refinements_left = None, 0
        logger.warning("DynamicProgrammingProposer proposes nothing: %s", reason)

    def _next(self) -> np.ndarray | None:
        choice = self._next_knapsack()
        if choice is not None:
            self.num_knapsack_proposals += 1
            return choice
        # Hill-climb from the best plans in turn, taking the first improvement.
        while self._refinements_left > 0:
            if self._neighbors is None:
                if self._center is None and not self._next_center():
                    return None
                self._neighbors = self._neighbors_of(self._center[1], self._center[2]())
            for choice in self._neighbors:
                if choice.tobytes() not in self._placed:
                    self._refinements_left -= 1
                    self.num_refinements += 1
                    return choice
            self._center = self._neighbors = None  # a local optimum
        return None

    def _next_knapsack(self) -> np.ndarray | None:
        self._index = None
        while True:
            if self._search is None:
                self._search = next(self._runs, None)
                if self._search is None:
                    return None
                self._pending = self._search.indices()
            for i in self._pending:
                choice = self._search.plans[i]
                known = self._placed.get(choice.tobytes())
                if known is not None or not self._search.fits(i):
                    self._search.record(i, bool(known), None)
                elif self._prune and self._search.cannot_win(i, self._best_rating):
                    self._search.record(i, None, None)
                else:
                    self._index = i
                    return choice
            self._search = None

    def _knapsack_runs(self) -> Iterator[FrontierSearch]:
        """Least-perf plans per memory bin, largest memory first: uncapped,
        then with the largest partitioned shard capped, on perf (just below
        the largest in the run before's best rated plan: balance), then on
        memory (just below the largest in the run before's first plan:
        packing). Runs are made when the one before is done."""
        space = self._space
        axes, capacity, bins, weights = knapsack_axes(space, self._bins_per_device, self._ddr_bins_per_device)
        rows = np.arange(len(space.options))
        seen: set[bytes] = set()

        def run(allowed: np.ndarray) -> FrontierSearch:
            knapsack = Knapsack(capacity, bins)
            knapsack.add_tables(weights, without_dominated(np.where(allowed, space.perf, np.inf), weights))
            frontier = knapsack.frontier(len(rows))
            keys = [plan.tobytes() for plan in frontier]
            new = np.array([key not in seen for key in keys], dtype=bool)
            seen.update(itertools.compress(keys, new))
            plans = frontier[new]
            return FrontierSearch(
                plans, space.mem[rows, plans, main].sum(-1), space, self._bisect, self._slack
            )

        valid = np.isfinite(space.perf)
        main = axes[0] if axes else 0
        uncapped = run(valid)
        if not len(uncapped.plans):
            smallest = np.where(valid[..., None], space.mem, np.inf).min(1).sum(0)
            self._propose_nothing(
                f"the tables do not fit together: no choice of options fits the {space.world_size} "
                f"devices' {gib_text(space.capacity[0])} HBM and {gib_text(space.capacity[1])} DDR in total "
                f"after the storage reservation (each table's least HBM adds up to {gib_text(smallest[0])}, "
                f"least DDR to {gib_text(smallest[1])}); add devices or memory, or shrink the tables"
            )
            return
        yield uncapped
        for sizes, balance in ((space.shard_perf, True), (space.shard_mem[..., main], False)):
            search = uncapped
            for _ in range(self._max_caps):
                reference = search.plans[search.best_index() if balance else 0]
                largest = sizes[rows, reference].max()
                smaller = sizes[valid & (sizes < largest)]
                if not len(smaller):
                    break
                search = run(valid & (sizes <= smaller.max()))
                if not len(search.plans):
                    break
                yield search

    def _unplaced_tables(
        self, choice: np.ndarray, ranks: list[list[int | None]] | None, placement: Placement | None
    ) -> list[int]:
        """The table the partitioner could not place (uniform options go
        first, then the largest storage first), then the biggest shards."""
        ranks = placement.ranks if ranks is None else ranks
        unplaced = [t for t, shard_ranks in enumerate(ranks) if None in shard_ranks]
        failed = []
        if unplaced and len(unplaced) < len(ranks):  # else no trace (e.g. a cached answer)
            option = [self._options[t][choice[t]] for t in unplaced]
            uniform = [t for t, o in zip(unplaced, option) if o.partition_by == UNIFORM]
            storage = [self._space.storage[t][choice[t]] for t in unplaced]
            failed = [uniform[0] if uniform else unplaced[storage.index(max(storage))]]
        biggest = self._space.shard_mem[np.arange(len(choice)), choice].max(1)
        return failed + [
            int(t) for t in np.argsort(-biggest, kind="stable") if biggest[t] > 0 and t not in failed
        ]

    def _slowest_rank_tables(
        self, choice: np.ndarray, ranks: list[list[int | None]] | None, placement: Placement | None
    ) -> list[int]:
        """Tables with a shard on the slowest rank, heaviest there first
        (ties: the rank, then the table, seen first in plan order)."""
        ranks = placement.ranks if ranks is None else ranks
        options = [opts[o] for opts, o in zip(self._options, choice)]
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

    def _next_center(self) -> bool:
        """The best start not refined yet, among the few best keys (plans
        rated alike are usually the same placement)."""
        keys = sorted({start[0] for start in self._starts})[:_REFINE_STARTS]
        for start in sorted(self._starts, key=lambda start: start[0]):  # stable: first seen first
            if start[0] in keys and start[0] not in self._started:
                self._started.add(start[0])
                self._center = start
                return True
        return False

    def _neighbors_of(self, choice: np.ndarray, first: list[int]) -> Iterator[np.ndarray]:
        """Plans that change one of the first tables of `first`, then two of
        them or any one table; each group by lower bound, while it can beat
        the best rating."""
        space = self._space
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
        groups = [singles(heavy), pairs + singles(range(len(choice)))]
        for moves in groups:
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
                if self._prune and bounds[i] >= self._best_rating:
                    break
                neighbor = choice.copy()
                neighbor[kept[i][:, 0]] = kept[i][:, 1]
                yield neighbor


def _indices(proposal: list[ShardingOption], options: list[list[ShardingOption]]) -> np.ndarray | None:
    """`proposal` as option indices, or None if an option was dropped."""
    try:
        return np.array([[id(o) for o in opts].index(id(p)) for p, opts in zip(proposal, options)])
    except ValueError:
        return None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a while. The search makes
    many small lists and tuples (freed by reference counting), and each
    collection they trigger walks every live object, e.g. the hundreds of
    thousands of enumerated shards: at 800 tables that was most of the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

"""A dynamic-programming sharding Proposer for torchrec's planner.

torchrec's `EmbeddingShardingPlanner` asks its proposers for plans (one
`ShardingOption` per table), places each on ranks with `GreedyPerfPartitioner`,
rates it with `NoopPerfModel` (the slowest rank's summed perf) and keeps the
best. `DynamicProgrammingProposer` proposes, in this order:

1. a knapsack over discretized memory bins: for each memory total, the options
   with the least summed perf, from the largest total down. Unlike torchrec's
   own DP proposer it plans on DDR where HBM is zero (CPU), drops options whose
   largest shard fits on no device, and bins HBM x DDR where both can bind;
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

    planner = create_planner(topology, batch_size=512)    # this proposer first
    plan = planner.plan(module, sharders)
    table = compare_proposers(tables, topology, batch_size=512)   # side by side
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
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
    HardwareConfig,
    KernelConfig,
    ParameterConstraints,
    PartitionByType,
    PlannerError,
    PlannerErrorType,
    Proposer,
    ShardingOption,
    Stats,
    Storage,
    Topology,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.distributed.planner.utils import reset_shard_rank
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

__all__ = [
    "DynamicProgrammingProposer",
    "create_planner",
    "make_topology",
    "topology_for_device",
    "Model",
    "make_model",
    "fused_table_gb",
    "Enumerated",
    "enumerate_options",
    "PlanRun",
    "run_planner",
    "rank_loads",
    "default_proposers",
    "compare_proposers",
    "budget_sweep",
    "reserved_topology",
    "option_label",
    "options_table",
    "knapsack_table",
    "knapsack_frontier",
    "rate_every_plan",
    "brute_force_rating",
    "random_instance",
    "quality_study",
]

logger = logging.getLogger(__name__)

GB = 1024**3
AXES = ("hbm", "ddr")
_UNIFORM = PartitionByType.UNIFORM.value
# Each table added to the knapsack scans the bin grid once; past this many bins
# the grid is coarsened.
_MAX_BINS = 2**18
_PAIR_TABLES = 8  # tables on the slowest rank whose options are changed in pairs
_REFINE_STARTS = 4  # best rated plans that each start a hill climb
_PATIENCE = 8  # unplaced plans in a row before a run is bisected; plans proposed below
_SLACKS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32)  # memory left free by plans proposed below


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _storage(storage: Storage | None) -> np.ndarray:
    return np.array([storage.hbm, storage.ddr], dtype=float) if storage else np.zeros(2)


def _gb(num_bytes: float) -> str:
    return f"{num_bytes / GB:.3g} GiB"


class _SearchSpace:
    """The options of each table as arrays, for bounds and the knapsack.

    Rows are tables, columns options (padded with inf perf). Uniform options
    (row-wise, data-parallel) put shard i on device i, so their per-rank perf
    and memory are known before partitioning; other options are placed by the
    partitioner, so only their largest shard is known.
    """

    def __init__(self, options: list[list[ShardingOption]], storage_constraint: Topology):
        devices = storage_constraint.devices
        self.world_size = len(devices)
        self.device_mem = np.array([_storage(d.storage) for d in devices])  # [W, 2]
        self.capacity = self.device_mem.sum(0)
        one_host = storage_constraint.intra_group_size >= self.world_size
        self.options = [
            self._fitting(_distinct(table_options, one_host), devices) for table_options in options
        ]
        num_tables, width = len(options), max(len(o) for o in self.options)
        shape = (num_tables, width)
        self.perf = np.full(shape, np.inf)
        self.mem = np.zeros(shape + (2,))
        self.rank_perf = np.zeros(shape + (self.world_size,))  # uniform options only
        self.rank_mem = np.zeros(shape + (self.world_size, 2))
        self.shard_perf = np.zeros(shape)  # largest shard placed by the partitioner
        self.shard_mem = np.zeros(shape + (2,))
        for t, table_options in enumerate(self.options):
            for o, option in enumerate(table_options):
                perfs = np.array([shard.perf.total for shard in option.shards])
                mems = np.array([_storage(shard.storage) for shard in option.shards])
                self.perf[t, o], self.mem[t, o] = perfs.sum(), mems.sum(0)
                if _placement(option, one_host) == _UNIFORM:
                    self.rank_perf[t, o, : len(perfs)] = perfs
                    self.rank_mem[t, o, : len(perfs)] = mems
                else:
                    self.shard_perf[t, o], self.shard_mem[t, o] = perfs.max(), mems.max(0)

    @staticmethod
    def _fitting(table_options: list[ShardingOption], devices: list) -> list[ShardingOption]:
        # An option whose largest shard fits on no device can never be placed.
        fitting = [
            o
            for o in table_options
            if all(any(s.storage.fits_in(d.storage) for d in devices) for s in o.shards)
        ]
        if fitting:
            return fitting
        smallest = min(table_options, key=lambda o: max((s.storage.hbm, s.storage.ddr) for s in o.shards))
        shard = max(smallest.shards, key=lambda s: (s.storage.hbm, s.storage.ddr))
        biggest = max(devices, key=lambda d: (d.storage.hbm, d.storage.ddr)).storage
        raise PlannerError(
            f"table {smallest.name!r} fits on no device: its smallest option "
            f"({smallest.sharding_type}, {smallest.compute_kernel}) needs "
            f"{_gb(shard.storage.hbm)} HBM and {_gb(shard.storage.ddr)} DDR for one shard, "
            f"the largest device offers {_gb(biggest.hbm)} HBM and {_gb(biggest.ddr)} DDR "
            "after the storage reservation; add devices or memory, or shrink the table",
            error_type=PlannerErrorType.INSUFFICIENT_STORAGE,
        )

    def lower_bound(self, choice: np.ndarray) -> float:
        """A rating no partition of `choice` can beat (see `neighbor_bounds`)."""
        rows = np.arange(len(choice))
        rank_perf = self.rank_perf[rows, choice].sum(0)
        return float(
            max(
                self.perf[rows, choice].sum() / self.world_size,
                rank_perf.max(),
                rank_perf.min() + self.shard_perf[rows, choice].max(),
            )
        )

    def fits(self, choice: np.ndarray) -> bool:
        """Necessary memory conditions: the totals, and uniform shards per device."""
        rows = np.arange(len(choice))
        return bool(
            (self.mem[rows, choice].sum(0) <= self.capacity).all()
            and (self.rank_mem[rows, choice].sum(0) <= self.device_mem).all()
        )

    def neighbor_bounds(self, choice: np.ndarray, moves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Lower bounds and memory checks of `choice` changed by `moves`.

        `moves` is [N, k, 2] of (table, option). The slowest rank carries at
        least the mean load, every uniform shard of its rank, and the largest
        partitioned shard on top of the lightest uniform load.
        """
        tables, new = moves[..., 0], moves[..., 1]
        old = choice[tables]
        rows = np.arange(len(choice))

        def changed(values: np.ndarray) -> np.ndarray:
            return values[rows, choice].sum(0) + (values[tables, new] - values[tables, old]).sum(1)

        total_perf, rank_perf = changed(self.perf), changed(self.rank_perf)
        # Largest partitioned shard: the biggest among unchanged tables, or a new one.
        shard = self.shard_perf[rows, choice]
        top = np.argsort(-shard)[: moves.shape[1] + 1]
        untouched = (tables[:, :, None] != top[None, None, :]).all(1)
        rest = np.where(untouched, shard[top][None, :], 0.0).max(1)
        largest = np.maximum(rest, self.shard_perf[tables, new].max(1))
        bound = np.maximum.reduce(
            [total_perf / self.world_size, rank_perf.max(1), rank_perf.min(1) + largest]
        )
        fits = (changed(self.mem) <= self.capacity).all(1) & (changed(self.rank_mem) <= self.device_mem).all(
            (1, 2)
        )
        return bound, fits


class _Knapsack:
    """Least summed perf per memory bin, over the tables added so far.

    Each reachable bin keeps one state: its exact memory (so bins do not
    accumulate rounding) and its summed perf. Adding a table moves every state
    by each option's memory into bin `floor(memory / bin_size)` per axis; a
    bin keeps the least perf that lands in it. States that another state beats
    on every axis and on perf are dropped: no table added later can save them.
    """

    def __init__(self, capacity: np.ndarray, bins: tuple[int, ...]):
        self.capacity, self.shape = capacity, bins
        self.bin_size = capacity / np.array(bins)
        self.cells = np.zeros(1, dtype=np.int64)  # flat bin of each state
        self.perf = np.zeros(1)
        self.mem = np.zeros((1, len(bins)))
        self.least = np.full(math.prod(bins), np.inf)
        self.least[0] = 0.0
        self.trace: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []

    def add_table(self, table: int, weights: np.ndarray, perfs: np.ndarray) -> None:
        options = np.flatnonzero(np.isfinite(perfs))
        moved = self.mem[None] + weights[options][:, None]  # [options, states, axes]
        cell = np.floor(moved / self.bin_size).astype(np.int64)
        ok = (moved <= self.capacity).all(-1) & (cell < np.array(self.shape)).all(-1)
        o, s = np.nonzero(ok)
        cells = np.ravel_multi_index(tuple(np.moveaxis(cell[o, s], -1, 0)), self.shape)
        perf = self.perf[s] + perfs[options[o]]
        least = np.full(math.prod(self.shape), np.inf)
        np.minimum.at(least, cells, perf)
        win = perf == least[cells]
        cells, first = np.unique(cells[win], return_index=True)
        o, s = o[win][first], s[win][first]
        keep = self._undominated(cells, least)
        cells, o, s = cells[keep], o[keep], s[keep]
        self.trace.append((table, cells, options[o], s))
        self.cells, self.perf, self.mem = cells, least[cells], moved[o, s]
        self.least = least  # per bin, dominated or not (for the notebook's heatmap)

    def _undominated(self, cells: np.ndarray, least: np.ndarray) -> np.ndarray:
        """Which of `cells` no other bin with less or equal memory on every
        axis beats on perf (a prefix minimum per axis over the bin grid)."""
        grid = least.reshape(self.shape)
        below = np.full(self.shape, np.inf)  # least perf at strictly less memory
        for axis in range(grid.ndim):
            shifted = np.full(self.shape, np.inf)
            into = [slice(None)] * grid.ndim
            into[axis] = slice(1, None)
            outof = list(into)
            outof[axis] = slice(None, -1)
            shifted[tuple(into)] = np.minimum.accumulate(grid, axis=axis)[tuple(outof)]
            for other in range(grid.ndim):
                if other != axis:
                    shifted = np.minimum.accumulate(shifted, axis=other)
            below = np.minimum(below, shifted)
        return least[cells] < below.ravel()[cells]

    def frontier(self, num_tables: int) -> np.ndarray:
        """The option of each table for every kept state [states, tables],
        from the largest memory down (first axis first)."""
        states = np.lexsort(self.mem.T[::-1])[::-1]
        choices = np.full((len(states), num_tables), -1)
        for table, _cells, options, previous in reversed(self.trace):
            choices[:, table] = options[states]
            states = previous[states]
        return choices


class _FrontierSearch:
    """Which plans of one knapsack run to propose, and in what order.

    The frontier runs from the largest memory down. The top plans use the
    most memory and may not fit per device: scan from the top and, after
    `_PATIENCE` unplaced in a row, bisect for the first placed plan. Plans
    below it are slower in sum but leave memory the partitioner needs to
    balance ranks: propose the next few, then those with 1%, 2%, 4% ... less
    memory, then the neighbors of the best rated one.
    """

    def __init__(self, plans: np.ndarray, memory: np.ndarray):
        self.plans, self.memory = plans, memory
        self.placed: dict[int, bool | None] = {}  # None: skipped, could not win
        self.ratings: dict[int, float] = {}

    def record(self, index: int, placed: bool | None, rating: float | None) -> None:
        self.placed[index] = placed
        if placed and rating is not None:
            self.ratings[index] = rating

    def best_index(self) -> int:
        return min(self.ratings, key=self.ratings.get) if self.ratings else 0

    def indices(self) -> Iterator[int]:
        count, failed, first = len(self.plans), 0, None
        for i in range(count):  # from the top, until one is placed
            yield i
            if self.placed.get(i):
                first = i
                break
            failed += self.placed.get(i) is False
            if failed >= _PATIENCE:
                lo, hi = i, count
                while hi - lo > 1:  # bisect: [0, lo] unplaced, [hi, ...] placed or skipped
                    mid = (lo + hi) // 2
                    yield mid
                    lo, hi = (mid, hi) if self.placed.get(mid) is False else (lo, mid)
                first = hi
                break
        if first is None or first >= count:
            return
        below = [first + k for k in range(1, _PATIENCE)]
        below += [
            int(np.argmax(self.memory <= self.memory[first] * (1 - slack)))
            for slack in _SLACKS
            if self.memory[-1] <= self.memory[first] * (1 - slack)
        ]
        for i in sorted(set(below)):
            if first < i < count and i not in self.placed:
                yield i
        best = self.best_index()
        for i in (best - 2, best - 1, best + 1, best + 2):
            if 0 <= i < count and i not in self.placed:
                yield i


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
    """

    def __init__(
        self,
        bins_per_device: int = 100,
        ddr_bins_per_device: int = 10,
        max_caps: int = 8,
        max_refinements: int = 100,
    ) -> None:
        self._bins_per_device = _check_int("bins_per_device", bins_per_device, 1)
        self._ddr_bins_per_device = _check_int("ddr_bins_per_device", ddr_bins_per_device, 1)
        self._max_caps = _check_int("max_caps", max_caps, 0)
        self._max_refinements = _check_int("max_refinements", max_refinements, 0)
        self.load([])

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None) -> None:
        self._options = _by_table(search_space)
        self._space: _SearchSpace | None = None
        self._best_rating = math.inf
        self._placed: dict[bytes, bool] = {}  # what the partitioner said per plan
        self._runs: Iterator[_FrontierSearch] | None = None  # knapsack runs
        self._search: _FrontierSearch | None = None  # the run being proposed from
        self._pending: Iterator[int] = iter(())  # its plans still to consider
        self._index: int | None = None  # the current proposal's place in it
        # Where refinements may start: (rating, or bound if it was not placed;
        # plan; tables to change first; placed). The center is the current one.
        self._starts: list[tuple[float, np.ndarray, list[int], bool]] = []
        self._started: set[float] = set()  # keys of the starts used
        self._center: tuple[float, np.ndarray, list[int], bool] | None = None
        self._neighbors: Iterator[np.ndarray] | None = None
        self._refinements_left = self._max_refinements
        self.num_knapsack_proposals = self.num_refinements = 0  # how the proposals split
        # Before the first feedback the device memory is unknown: propose each
        # table's smallest option, like torchrec's DP proposer.
        self._current: np.ndarray | None = (
            np.array([min(range(len(opts)), key=lambda i: _memory_key(opts[i])) for opts in self._options])
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
        if self._current is None:
            return
        if self._space is None:
            if storage_constraint is None:
                raise ValueError("feedback needs the storage_constraint (torchrec's planner passes it)")
            first = [opts[o] for opts, o in zip(self._options, self._current)]
            self._space = _SearchSpace(self._options, storage_constraint)
            self._options = self._space.options
            self._current = _indices(first, self._options)  # onto the options kept
            self._runs = self._knapsack_runs()
        choice = self._current
        if choice is not None:
            placed = partitionable and perf_rating is not None
            self._placed[choice.tobytes()] = placed
            if self._index is not None:  # a knapsack plan
                self._search.record(self._index, placed, perf_rating)
            if placed:
                self._best_rating = min(self._best_rating, perf_rating)
                start = (perf_rating, choice, _slowest_rank_tables(plan or [], self._options), True)
            else:  # refine by its bound, changing first the table that did not fit
                start = (
                    self._space.lower_bound(choice),
                    choice,
                    self._unplaced_tables(plan or [], choice),
                    False,
                )
            self._starts.append(start)
            center = self._center
            if center is not None and placed and (not center[3] or perf_rating < center[0]):
                self._center, self._neighbors = start, None  # climb on from the better plan
        self._current = self._next()

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
                self._neighbors = self._neighbors_of(*self._center[1:3])
            for choice in self._neighbors:
                if choice.tobytes() not in self._placed:
                    self._refinements_left -= 1
                    self.num_refinements += 1
                    return choice
            self._center = self._neighbors = None  # a local optimum
        return None

    def _next_knapsack(self) -> np.ndarray | None:
        space = self._space
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
                if known is not None or not space.fits(choice):
                    self._search.record(i, bool(known), None)
                elif space.lower_bound(choice) >= self._best_rating:
                    self._search.record(i, None, None)
                else:
                    self._index = i
                    return choice
            self._search = None

    def _knapsack_runs(self) -> Iterator[_FrontierSearch]:
        """Least-perf plans per memory bin, largest memory first: uncapped,
        then with the largest partitioned shard capped, on perf (just below
        the largest in the run before's best rated plan: balance), then on
        memory (just below the largest in the run before's first plan:
        packing). Runs are made when the one before is done."""
        space = self._space
        axes, capacity, bins, weights = _knapsack_axes(
            space, self._bins_per_device, self._ddr_bins_per_device
        )
        rows = np.arange(len(space.options))
        seen: set[bytes] = set()

        def run(allowed: np.ndarray) -> _FrontierSearch:
            knapsack = _Knapsack(capacity, bins)
            for t in rows:
                knapsack.add_table(int(t), weights[t], np.where(allowed[t], space.perf[t], np.inf))
            plans = [p for p in knapsack.frontier(len(rows)) if p.tobytes() not in seen]
            seen.update(p.tobytes() for p in plans)
            plans = np.array(plans, dtype=np.int64).reshape(-1, len(rows))
            return _FrontierSearch(plans, space.mem[rows, plans, main].sum(-1))

        valid = np.isfinite(space.perf)
        main = axes[0] if axes else 0
        uncapped = run(valid)
        if not len(uncapped.plans):
            smallest = np.where(valid[..., None], space.mem, np.inf).min(1).sum(0)
            raise PlannerError(
                f"the tables do not fit together: no choice of options fits the {space.world_size} "
                f"devices' {_gb(space.capacity[0])} HBM and {_gb(space.capacity[1])} DDR in total "
                f"after the storage reservation (each table's least HBM adds up to {_gb(smallest[0])}, "
                f"least DDR to {_gb(smallest[1])}); add devices or memory, or shrink the tables",
                error_type=PlannerErrorType.INSUFFICIENT_STORAGE,
            )
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

    def _unplaced_tables(self, plan: list[ShardingOption], choice: np.ndarray) -> list[int]:
        """The table the partitioner could not place (uniform options go
        first, then the largest storage first), then the biggest shards."""
        table_of = {opts[0].fqn: t for t, opts in enumerate(self._options)}
        unplaced = [o for o in plan if any(s.rank is None for s in o.shards)]
        failed = []
        if unplaced and len(unplaced) < len(plan):  # else no trace (e.g. a cached answer)
            uniform = [o for o in unplaced if o.partition_by == _UNIFORM]
            failed = [table_of[(uniform[0] if uniform else max(unplaced, key=lambda o: o.total_storage)).fqn]]
        biggest = self._space.shard_mem[np.arange(len(choice)), choice].max(1)
        return failed + [
            int(t) for t in np.argsort(-biggest, kind="stable") if biggest[t] > 0 and t not in failed
        ]

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
                if bounds[i] >= self._best_rating:
                    break
                neighbor = choice.copy()
                neighbor[kept[i][:, 0]] = kept[i][:, 1]
                yield neighbor


def _by_table(options: list[ShardingOption]) -> list[list[ShardingOption]]:
    """Options grouped per table, tables in the order first seen."""
    by_fqn: dict[str, list[ShardingOption]] = {}
    for option in options:
        by_fqn.setdefault(option.fqn, []).append(option)
    return list(by_fqn.values())


def _memory_key(option: ShardingOption) -> tuple[int, int]:
    storage = option.total_storage
    return storage.hbm, storage.ddr


def _indices(proposal: list[ShardingOption], options: list[list[ShardingOption]]) -> np.ndarray | None:
    """`proposal` as option indices, or None if an option was dropped."""
    try:
        return np.array([[id(o) for o in opts].index(id(p)) for p, opts in zip(proposal, options)])
    except ValueError:
        return None


def _distinct(options: list[ShardingOption], one_host: bool) -> list[ShardingOption]:
    """Drop options the partitioner and perf model treat alike; the first
    enumerated stays. Table-wise and one-shard column-wise are alike; on one
    host, so are table-column-wise and column-wise (both placed shard by shard
    on the least loaded device), and table-row-wise and row-wise (shard i on
    device i)."""
    seen, kept = set(), []
    for option in options:
        key = (
            _placement(option, one_host),
            option.dependency,
            option.compute_kernel == "key_value",
            tuple((s.storage, s.perf.total) for s in option.shards),
        )
        if key not in seen:
            seen.add(key)
            kept.append(option)
    return kept


def _placement(option: ShardingOption, one_host: bool) -> str:
    """How the partitioner places the option: uniform (shard i on device i),
    device (each shard on the least loaded device that fits) or host."""
    if one_host and option.partition_by == PartitionByType.HOST.value:
        row_wise = option.sharding_type == ShardingType.TABLE_ROW_WISE.value
        return _UNIFORM if row_wise else PartitionByType.DEVICE.value
    return option.partition_by


def _knapsack_axes(
    space: _SearchSpace, bins_per_device: int, ddr_bins_per_device: int
) -> tuple[list[int], np.ndarray, tuple[int, ...], np.ndarray]:
    """The memory axes that can bind (the largest option of every table
    together exceeds them), their capacity, bins, and each option's weight."""
    valid = np.isfinite(space.perf)
    axes = [a for a in range(2) if np.where(valid, space.mem[..., a], 0.0).max(1).sum() > space.capacity[a]]
    if not axes:  # memory cannot bind: one bin, the least perf per table
        return axes, np.array([math.inf]), (1,), np.zeros(space.perf.shape + (1,))
    per_device = [bins_per_device, ddr_bins_per_device][: len(axes)]
    bins = tuple(n * space.world_size for n in per_device)
    while math.prod(bins) > _MAX_BINS:
        bins = tuple(max(1, n // 2) if n == max(bins) else n for n in bins)
        logger.info("DynamicProgrammingProposer: coarsened the bins to %s", bins)
    return axes, space.capacity[axes], bins, space.mem[..., axes]


def _slowest_rank_tables(plan: list[ShardingOption], options: list[list[ShardingOption]]) -> list[int]:
    """Tables with a shard on the slowest rank, heaviest there first."""
    loads: dict[int, float] = collections.defaultdict(float)
    for option in plan:
        for shard in option.shards:
            loads[shard.rank] += shard.perf.total
    if not loads:
        return []
    slowest = max(loads, key=loads.get)
    table_of = {opts[0].fqn: t for t, opts in enumerate(options)}
    on_slowest = {
        table_of[o.fqn]: sum(s.perf.total for s in o.shards if s.rank == slowest)
        for o in plan
        if any(s.rank == slowest for s in o.shards)
    }
    return sorted(on_slowest, key=on_slowest.get, reverse=True)


# --- topology, model and planner ---------------------------------------------


def make_topology(
    world_size: int,
    compute_device: str = "cuda",
    hbm_cap_gb: float | None = None,
    ddr_cap_gb: float | None = None,
    local_world_size: int | None = None,
    intra_host_bw: float | None = None,
    inter_host_bw: float | None = None,
) -> Topology:
    """A torchrec Topology (through TopologyFactory). Caps are per device in
    GiB; bandwidths in torchrec's unit, bytes per ms (None: its defaults)."""
    _check_int("world_size", world_size, 1)
    local_world_size = world_size if local_world_size is None else local_world_size
    _check_int("local_world_size", local_world_size, 1)
    if world_size % local_world_size:
        raise ValueError(f"local_world_size {local_world_size} must divide world_size {world_size}")
    if compute_device not in ("cuda", "cpu"):
        raise ValueError(f"compute_device must be 'cuda' or 'cpu', got {compute_device!r}")
    for name, value in (
        ("hbm_cap_gb", hbm_cap_gb),
        ("ddr_cap_gb", ddr_cap_gb),
        ("intra_host_bw", intra_host_bw),
        ("inter_host_bw", inter_host_bw),
    ):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0 (or None for torchrec's default), got {value!r}")
    bandwidths = intra_host_bw is not None or inter_host_bw is not None
    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(
            world_size=world_size,
            local_world_size=local_world_size,
            hbm_cap_bytes=None if hbm_cap_gb is None else int(hbm_cap_gb * GB),
            ddr_cap_bytes=None if ddr_cap_gb is None else int(ddr_cap_gb * GB),
        ),
        hardware_config=HardwareConfig(intra_host_bw=intra_host_bw, inter_host_bw=inter_host_bw),
        kernel_config=KernelConfig(compute_device=compute_device, use_hardware_based_bandwidth=bandwidths),
    )


def _planning_device(device: str | torch.device) -> torch.device:
    """The kind of device planned for: "auto" is cuda when a GPU is visible,
    else cpu. (Unlike `embnb.dist.resolve_device`, one GPU stands for a
    cluster of them: planning needs none per rank.)"""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from error
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but no GPU is visible")
    return resolved


def topology_for_device(
    device: str | torch.device,
    world_size: int,
    local_world_size: int | None = None,
    intra_host_bw: float | None = None,
    inter_host_bw: float | None = None,
) -> Topology:
    """The Topology of `world_size` ranks like this machine: HBM from the GPU,
    DDR from system memory shared by the local ranks."""
    device = _planning_device(device)
    local_world_size = world_size if local_world_size is None else local_world_size
    _check_int("local_world_size", local_world_size, 1)
    hbm = torch.cuda.get_device_properties(device).total_memory / GB if device.type == "cuda" else None
    return make_topology(
        world_size,
        device.type,
        hbm,
        _system_memory() / local_world_size / GB,
        local_world_size,
        intra_host_bw,
        inter_host_bw,
    )


def _system_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:  # psutil comes with jupyter; plain POSIX otherwise
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def create_planner(
    topology: Topology | str | torch.device,
    batch_size: int,
    *,
    world_size: int | None = None,
    local_world_size: int | None = None,
    storage_reservation_percentage: float = 0.15,
    intra_host_bw: float | None = None,
    inter_host_bw: float | None = None,
    bins_per_device: int = 100,
    constraints: dict[str, ParameterConstraints] | None = None,
    timeout_seconds: int | None = None,
) -> EmbeddingShardingPlanner:
    """torchrec's EmbeddingShardingPlanner with this DP proposer first and
    torchrec's UniformProposer as a fallback.

    `topology` is a Topology, or a device ("auto", "cpu", "cuda") whose
    topology is read from the machine for `world_size` ranks (default: the
    process group's, else 1). `storage_reservation_percentage` of each
    device is kept for everything but the embedding tables.
    """
    _check_int("batch_size", batch_size, 1)
    if not 0 <= storage_reservation_percentage < 1:
        raise ValueError(
            f"storage_reservation_percentage must be in [0, 1), got {storage_reservation_percentage!r}"
        )
    if not isinstance(topology, Topology):
        if world_size is None:
            dist = torch.distributed
            world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        topology = topology_for_device(topology, world_size, local_world_size, intra_host_bw, inter_host_bw)
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        constraints=constraints,
        storage_reservation=FixedPercentageStorageReservation(percentage=storage_reservation_percentage),
        proposer=[DynamicProgrammingProposer(bins_per_device=bins_per_device), UniformProposer()],
        timeout_seconds=timeout_seconds,
        debug=False,
    )


class Model(collections.namedtuple("Model", ["tables", "constraints"])):
    """Embedding tables and their ParameterConstraints (pooling factors)."""


def make_model(num_tables: int, seed: int = 0, max_rows: int = 10_000_000) -> Model:
    """A model like production ones: row counts log-uniform from 1,000 to
    `max_rows` (a few huge tables, many small), dims 16 to 256, pooling
    factors 1 to 50."""
    _check_int("num_tables", num_tables, 1)
    _check_int("max_rows", max_rows, 1000)
    rng = np.random.default_rng(seed)
    tables, constraints = [], {}
    for i in range(num_tables):
        name = f"table_{i}"
        tables.append(
            EmbeddingBagConfig(
                name=name,
                feature_names=[f"feature_{i}"],
                num_embeddings=int(10 ** rng.uniform(3, math.log10(max_rows))),
                embedding_dim=int(rng.choice([16, 32, 64, 128, 256])),
            )
        )
        constraints[name] = ParameterConstraints(pooling_factors=[float(rng.choice([1, 2, 5, 10, 20, 50]))])
    return Model(tables, constraints)


def fused_table_gb(tables: Sequence[EmbeddingBagConfig]) -> float:
    """Memory of every table's rows in fp32, in GiB: a scale for budgets."""
    return sum(t.num_embeddings * t.embedding_dim * 4 for t in tables) / GB


# --- running and comparing proposers -------------------------------------------


class Enumerated(collections.namedtuple("Enumerated", ["module", "sharders", "options", "seconds"])):
    """torchrec's EmbeddingEnumerator output, kept so every proposer plans over
    the same options (enumerating is the slow part: torchrec's estimators)."""


def enumerate_options(
    tables: Sequence[EmbeddingBagConfig],
    topology: Topology,
    batch_size: int,
    constraints: dict[str, ParameterConstraints] | None = None,
) -> Enumerated:
    """Sharding options of an EmbeddingBagCollection of `tables` (on meta)."""
    if not tables:
        raise ValueError("no tables to plan: pass at least one EmbeddingBagConfig")
    _check_int("batch_size", batch_size, 1)
    module = EmbeddingBagCollection(tables=list(tables), device=torch.device("meta"))
    sharders = [EmbeddingBagCollectionSharder()]
    start = time.perf_counter()
    options = EmbeddingEnumerator(
        topology=topology, batch_size=batch_size, constraints=constraints
    ).enumerate(module, sharders)
    return Enumerated(module, sharders, options, time.perf_counter() - start)


class _Replay(Enumerator):
    """An Enumerator that hands out one enumeration again."""

    def __init__(self, options: list[ShardingOption]) -> None:
        self._options = options

    def enumerate(self, module: nn.Module, sharders: list) -> list[ShardingOption]:
        reset_shard_rank(self._options)
        return list(self._options)

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        pass  # estimates were populated when enumerated


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


class PlanRun(
    collections.namedtuple(
        "PlanRun", ["proposer", "plan", "perf_rating", "proposals", "seconds", "timed_out", "note"]
    )
):
    """One EmbeddingShardingPlanner.plan: its best plan (None if none) and how it went."""


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
    keep = _KeepBestPlan()
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        enumerator=_Replay(enumerated.options),
        storage_reservation=FixedPercentageStorageReservation(percentage=storage_reservation_percentage),
        proposer=proposers,
        stats=[keep],
        constraints=constraints,
        debug=False,
        timeout_seconds=None if timeout_s is None else max(1, math.ceil(timeout_s)),
    )
    note = ""
    start = time.perf_counter()
    try:
        planner.plan(enumerated.module, enumerated.sharders)
    except PlannerError as error:
        note = "no plan: " + str(error).strip().splitlines()[0][:200]
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
        planner._num_proposals,
        seconds,
        timed_out,
        note,
    )


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
    _check_int("bins_per_device", bins_per_device, 1)
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
) -> pd.DataFrame:
    """One row per proposer: the best plan's perf rating (slowest rank), its
    largest HBM and DDR per device, feasible or not, proposals evaluated,
    planning seconds, whether `timeout_s` cut it short, and a note.

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
    rows = []
    for name in names:
        run = run_planner(
            proposers[name](),
            enumerated,
            topology,
            batch_size,
            name=name,
            storage_reservation_percentage=storage_reservation_percentage,
            constraints=constraints,
            timeout_s=timeout_s,
        )
        loads = rank_loads(run.plan, topology.world_size) if run.plan else None
        note = run.note
        if name == "GridSearch" and combinations > MAX_PROPOSALS:  # torchrec skips it then
            note = f"skipped: {combinations:.3g} combinations > {MAX_PROPOSALS}"
        rows.append(
            {
                "proposer": name,
                "perf_rating": run.perf_rating,
                "max_hbm_gb": loads["hbm_gb"].max() if loads is not None else math.nan,
                "max_ddr_gb": loads["ddr_gb"].max() if loads is not None else math.nan,
                "feasible": run.plan is not None,
                "proposals": run.proposals,
                "plan_s": run.seconds,
                "timed_out": run.timed_out,
                "note": note,
            }
        )
    table = pd.DataFrame(rows).set_index("proposer")
    table.attrs.update(
        enumerate_s=enumerated.seconds, num_options=len(enumerated.options), combinations=combinations
    )
    return table


# --- looking inside: the knapsack, brute force, small instances -----------------


def reserved_topology(
    topology: Topology, enumerated: Enumerated, batch_size: int, storage_reservation_percentage: float = 0.15
) -> Topology:
    """The storage constraint the planner hands its proposers and partitioner."""
    return FixedPercentageStorageReservation(storage_reservation_percentage).reserve(
        topology, batch_size, enumerated.module, enumerated.sharders
    )


def option_label(option: ShardingOption) -> str:
    return f"{option.sharding_type}/{option.compute_kernel}"


def _space_of(
    enumerated: Enumerated, topology: Topology, batch_size: int, storage_reservation_percentage: float
) -> _SearchSpace:
    constraint = reserved_topology(topology, enumerated, batch_size, storage_reservation_percentage)
    return _SearchSpace(_by_table(enumerated.options), constraint)


def options_table(
    enumerated: Enumerated, topology: Topology, batch_size: int, storage_reservation_percentage: float = 0.15
) -> pd.DataFrame:
    """The options the knapsack chooses from, one row per table and option:
    summed perf, memory (GiB), and the largest shard's perf and memory.
    Options alike for the partitioner are shown once; options whose largest
    shard fits on no device are left out."""
    space = _space_of(enumerated, topology, batch_size, storage_reservation_percentage)
    rows = []
    for t, options in enumerate(space.options):
        for o, option in enumerate(options):
            shards = option.shards
            rows.append(
                {
                    "table": option.name,
                    "option": option_label(option),
                    "shards": len(shards),
                    "perf": space.perf[t, o],
                    "hbm_gb": space.mem[t, o, 0] / GB,
                    "ddr_gb": space.mem[t, o, 1] / GB,
                    "shard_perf": max(s.perf.total for s in shards),
                    "shard_hbm_gb": max(s.storage.hbm for s in shards) / GB,
                }
            )
    return pd.DataFrame(rows)


def knapsack_table(
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    bins_per_device: int = 100,
    storage_reservation_percentage: float = 0.15,
) -> pd.DataFrame:
    """The DP table on the knapsack's main memory axis: row i is the least
    summed perf per memory bin once tables 0..i are chosen (inf: unreachable);
    columns are each bin's upper memory edge in GiB (`.attrs["bin_gb"]`:
    the exact bin width)."""
    _check_int("bins_per_device", bins_per_device, 1)
    space = _space_of(enumerated, topology, batch_size, storage_reservation_percentage)
    axes, capacity, bins, weights = _knapsack_axes(space, bins_per_device, 1)
    capacity, bins, weights = capacity[:1], bins[:1], weights[..., :1]  # the main axis
    knapsack, rows = _Knapsack(capacity, bins), []
    for t in range(len(space.options)):
        knapsack.add_table(t, weights[t], space.perf[t])
        rows.append(knapsack.least)
    edges = (
        (np.arange(1, bins[0] + 1) * capacity[0] / bins[0] / GB) if np.isfinite(capacity[0]) else [math.inf]
    )
    table = pd.DataFrame(rows, index=[opts[0].name for opts in space.options], columns=np.round(edges, 4))
    table.attrs.update(axis=AXES[axes[0]] if axes else "none", bin_gb=float(capacity[0] / bins[0] / GB))
    return table


def knapsack_frontier(
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    bins_per_device: int = 100,
    ddr_bins_per_device: int = 10,
    storage_reservation_percentage: float = 0.15,
) -> pd.DataFrame:
    """The plain knapsack's plans in the order the proposer takes them, from
    the largest memory down: memory (GiB), summed perf and each table's
    option; `.attrs["axes"]`: the memory axes the knapsack bins (those that
    can bind)."""
    space = _space_of(enumerated, topology, batch_size, storage_reservation_percentage)
    axes, capacity, bins, weights = _knapsack_axes(space, bins_per_device, ddr_bins_per_device)
    knapsack = _Knapsack(capacity, bins)
    for t in range(len(space.options)):
        knapsack.add_table(t, weights[t], space.perf[t])
    plans = knapsack.frontier(len(space.options))
    tables = np.arange(len(space.options))
    frame = pd.DataFrame(
        {
            "hbm_gb": space.mem[tables, plans, 0].sum(-1) / GB,
            "ddr_gb": space.mem[tables, plans, 1].sum(-1) / GB,
            "summed_perf": space.perf[tables, plans].sum(-1),
        }
    )
    for t, options in enumerate(space.options):
        frame[options[0].name] = [option_label(options[o]) for o in plans[:, t]]
    frame.attrs["axes"] = [AXES[a] for a in axes]  # those that can bind
    return frame


def rate_every_plan(
    enumerated: Enumerated,
    topology: Topology,
    batch_size: int,
    storage_reservation_percentage: float = 0.15,
    max_plans: int = 100_000,
) -> pd.DataFrame:
    """Brute force: every combination of options, placed by torchrec's
    GreedyPerfPartitioner and rated by its NoopPerfModel (the slowest rank;
    NaN where it cannot be placed). Only for tiny models."""
    groups = _by_table(enumerated.options)
    count = math.prod(len(g) for g in groups)
    if count > max_plans:
        raise ValueError(
            f"{count} combinations is more than max_plans={max_plans}; use fewer tables or options"
        )
    constraint = reserved_topology(topology, enumerated, batch_size, storage_reservation_percentage)
    partitioner, perf_model = GreedyPerfPartitioner(), NoopPerfModel(topology)
    rows = []
    for combination in itertools.product(*groups):
        proposal = list(combination)
        try:
            rating = perf_model.rate(partitioner.partition(proposal, constraint))
        except PlannerError:
            rating = math.nan
        reset_shard_rank(proposal)
        row = {o.name: option_label(o) for o in proposal}
        storage = sum((o.total_storage for o in proposal), Storage(0, 0))
        row.update(
            hbm_gb=storage.hbm / GB,
            ddr_gb=storage.ddr / GB,
            summed_perf=sum(o.total_perf for o in proposal),
            perf_rating=rating,
        )
        rows.append(row)
    return pd.DataFrame(rows)


def brute_force_rating(
    enumerated: Enumerated, topology: Topology, batch_size: int, storage_reservation_percentage: float = 0.15
) -> float:
    """The best rating over every combination of options (inf if none can be
    placed). Combinations are tried by a lower bound (the mean rank load, or
    the largest shard), stopping once no untried one can beat the best."""
    groups = _by_table(enumerated.options)
    perf = [[o.total_perf for o in g] for g in groups]
    shard = [[max(s.perf.total for s in o.shards) for o in g] for g in groups]
    bounds = sorted(
        (
            max(
                sum(perf[t][i] for t, i in enumerate(c)) / topology.world_size,
                max(shard[t][i] for t, i in enumerate(c)),
            ),
            c,
        )
        for c in itertools.product(*(range(len(g)) for g in groups))
    )
    constraint = reserved_topology(topology, enumerated, batch_size, storage_reservation_percentage)
    partitioner, perf_model, best = GreedyPerfPartitioner(), NoopPerfModel(topology), math.inf
    for bound, combination in bounds:
        if bound >= best:
            break
        proposal = [g[i] for g, i in zip(groups, combination)]
        try:
            best = min(best, perf_model.rate(partitioner.partition(proposal, constraint)))
        except PlannerError:
            pass
        reset_shard_rank(proposal)
    return best


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
) -> pd.DataFrame:
    """Each proposer's rating over the brute-force best, on random small
    instances: one row per instance and proposer (ratio inf: no plan where
    brute force found one; NaN: GridSearch skipped, as torchrec skips it past
    MAX_PROPOSALS combinations; instances without any plan are left out)."""
    _check_int("num_instances", num_instances, 1)
    proposers = proposers or {k: v for k, v in default_proposers().items() if k != "torchrec default"}
    seeds = range(seed, seed + num_instances)
    if progress:
        from tqdm.auto import tqdm

        seeds = tqdm(seeds, desc="instances")
    rows = []
    for instance in seeds:
        model, topology = random_instance(instance, num_tables)
        enumerated = enumerate_options(model.tables, topology, batch_size, model.constraints)
        best = brute_force_rating(enumerated, topology, batch_size)
        if not math.isfinite(best):
            continue
        combinations = math.prod(collections.Counter(o.fqn for o in enumerated.options).values())
        for name, make in proposers.items():
            if name == "GridSearch" and combinations > MAX_PROPOSALS:
                rating = math.nan
            else:
                run = run_planner(
                    make(), enumerated, topology, batch_size, name=name, constraints=model.constraints
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
    progress: bool = False,
) -> pd.DataFrame:
    """compare_proposers at each HBM budget per device (GPU topologies; the
    options do not depend on the budget, so one enumeration serves all)."""
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
            enumerated=enumerated,
        )
        frames.append(table.reset_index().assign(hbm_cap_gb=cap))
    return pd.concat(frames, ignore_index=True)

"""The proposer's building blocks: the options as arrays, and the knapsack over memory bins.

`ShardValues` reads every shard's storage and perf once; `SearchSpace` turns
torchrec's enumerated `ShardingOption`s into per-table arrays of perf and
memory (dropping options the partitioner treats alike, and options whose
largest shard fits on no device), with the lower bounds and memory checks the
proposer prunes by (`screen`: for a whole run of plans at once). `Knapsack` is
the DP: the least summed perf per memory bin over the tables added so far (on
one axis natively, embnb/native/knapsack.cpp); `without_dominated` drops the
options that cannot change it; `FrontierSearch` picks which plans of one run
to consider. `embnb.planner.proposer` proposes from them;
`embnb.planner.inspect` shows them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import numpy as np
import torch
from torchrec.distributed.planner.types import (
    PartitionByType,
    PlannerError,
    PlannerErrorType,
    ShardingOption,
    Topology,
)
from torchrec.distributed.types import ShardingType

from embnb.native import loader

logger = logging.getLogger(__name__)

GB = 1024**3
AXES = ("hbm", "ddr")
UNIFORM = PartitionByType.UNIFORM.value
# Each table added to the knapsack scans the bin grid once; past this many bins
# the grid is coarsened.
MAX_BINS = 2**18


def gib_text(num_bytes: float) -> str:
    return f"{num_bytes / GB:.3g} GiB"


class ShardValues:
    """Every shard's storage and perf, read once from torchrec's objects.

    At 800 tables the options hold hundreds of thousands of shards, and
    walking their attributes again for each check (distinct options, fits,
    storage totals, the replica) was seconds of the planning time. Rows are
    the shards of `options` in order; `rows(option)` is one option's.
    """

    def __init__(self, options: list[ShardingOption]):
        read = [
            (
                st.hbm,
                st.ddr,
                st.ssd,
                p.fwd_compute,
                p.bwd_compute,
                p.fwd_comms,
                p.bwd_comms,
                p.prefetch_compute,
                p.total,
            )
            for option in options
            for shard in option.shards
            for st, p in ((shard.storage, shard.perf),)
        ]
        values = np.array(read, dtype=float).reshape(-1, 9)  # storage is in whole bytes: exact below 2**53
        self.storage = values[:, :3].astype(np.int64)  # HBM, DDR, SSD
        self.parts = np.ascontiguousarray(values[:, 3:8])  # in the order Perf.total adds them
        self.totals = np.ascontiguousarray(values[:, 8])  # Perf.total as torchrec computed it
        ends = np.cumsum([len(option.shards) for option in options]).tolist()
        self._rows = {id(o): slice(end - len(o.shards), end) for o, end in zip(options, ends)}

    def rows(self, option: ShardingOption) -> slice:
        return self._rows[id(option)]

    def memory(self, option: ShardingOption) -> tuple[int, int, int]:
        """The option's total storage (HBM, DDR, SSD), as `total_storage` orders it."""
        return tuple(self.storage[self.rows(option)].sum(0).tolist())


class SearchSpace:
    """The options of each table as arrays, for bounds and the knapsack.

    Rows are tables, columns options (padded with inf perf). Uniform options
    (row-wise, data-parallel) put shard i on device i, so their per-rank perf
    and memory are known before partitioning; other options are placed by the
    partitioner, so only their largest shard is known.
    """

    def __init__(
        self,
        options: list[list[ShardingOption]],
        storage_constraint: Topology,
        values: ShardValues | None = None,
    ):
        devices = storage_constraint.devices
        self.world_size = len(devices)
        self.values = values = values or ShardValues([o for table in options for o in table])
        device_storage = np.array([(d.storage.hbm, d.storage.ddr, d.storage.ssd) for d in devices])
        shard_fits = np.zeros(len(values.storage), dtype=bool)  # each shard: on some device
        for device in np.unique(device_storage, axis=0):  # devices are mostly alike
            shard_fits |= (values.storage <= device).all(1)
        self.device_mem = device_storage[:, :2].astype(float)  # [W, 2]
        self.capacity = self.device_mem.sum(0)
        one_host = storage_constraint.intra_group_size >= self.world_size
        self.options = [
            self._fitting(
                distinct_options(table_options, one_host, values), shard_fits, device_storage, values
            )
            for table_options in options
        ]
        self.storage = [[values.memory(o) for o in table] for table in self.options]  # (HBM, DDR, SSD)
        num_tables, width = len(options), max(len(o) for o in self.options)
        shape = (num_tables, width)
        self.perf = np.full(shape, np.inf)
        self.mem = np.zeros(shape + (2,))
        self.uniform = np.zeros(shape, dtype=bool)
        self.rank_perf = np.zeros(shape + (self.world_size,))  # uniform options only
        self.rank_mem = np.zeros(shape + (self.world_size, 2))
        self.shard_perf = np.zeros(shape)  # largest shard placed by the partitioner
        self.shard_mem = np.zeros(shape + (2,))
        for t, table_options in enumerate(self.options):
            for o, option in enumerate(table_options):
                rows = values.rows(option)
                perfs, mems = values.totals[rows], values.storage[rows, :2].astype(float)
                self.perf[t, o], self.mem[t, o] = perfs.sum(), mems.sum(0)
                if placement(option, one_host) == UNIFORM:
                    self.uniform[t, o] = True
                    self.rank_perf[t, o, : len(perfs)] = perfs
                    self.rank_mem[t, o, : len(perfs)] = mems
                else:
                    self.shard_perf[t, o], self.shard_mem[t, o] = perfs.max(), mems.max(0)

    @staticmethod
    def _fitting(
        table_options: list[ShardingOption],
        shard_fits: np.ndarray,
        device_storage: np.ndarray,
        values: ShardValues,
    ) -> list[ShardingOption]:
        # An option whose largest shard fits on no device can never be placed.
        fitting = [o for o in table_options if shard_fits[values.rows(o)].all()]
        if fitting:
            return fitting
        smallest = min(table_options, key=lambda o: max((s.storage.hbm, s.storage.ddr) for s in o.shards))
        shard = max(smallest.shards, key=lambda s: (s.storage.hbm, s.storage.ddr))
        biggest = device_storage[np.lexsort(device_storage[:, 1::-1].T)[-1]]
        raise PlannerError(
            f"table {smallest.name!r} fits on no device: its smallest option "
            f"({smallest.sharding_type}, {smallest.compute_kernel}) needs "
            f"{gib_text(shard.storage.hbm)} HBM and {gib_text(shard.storage.ddr)} DDR for one shard, "
            f"the largest device offers {gib_text(biggest[0])} HBM and {gib_text(biggest[1])} DDR "
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

    def screen(self, plans: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
        """`fits` and `lower_bound` of every plan in `plans` [P, tables] at
        once, up to rounding: the sums run along the plans, adding what
        changed from one plan to the next (plans next to each other on a
        knapsack frontier differ in a few tables), so this costs about as
        much as a few single checks. Returns the memory left (the least of
        what the totals and the uniform shards per device leave free; < 0:
        does not fit), the bound, and the rounding each may be off by."""
        num_plans, num_tables = plans.shape
        rows = np.arange(num_tables)
        if not num_plans:
            return np.zeros(0), np.zeros(0), 0.0, 0.0
        step, table = np.nonzero(plans[1:] != plans[:-1])
        old, new = plans[step, table], plans[step + 1, table]
        # Only changes to or from a uniform option move the per-device sums.
        uniform = self.uniform[table, old] | self.uniform[table, new]

        def running(values: np.ndarray, changes: np.ndarray | slice = slice(None)) -> np.ndarray:
            """Each plan's `values` summed over the tables: the first plan's
            sum plus the changes made before it."""
            at, t = step[changes], table[changes]
            changed = np.zeros((len(at) + 1,) + values.shape[2:])
            changed[0] = values[rows, plans[0]].sum(0)
            np.cumsum(values[t, new[changes]] - values[t, old[changes]], axis=0, out=changed[1:])
            changed[1:] += changed[0]
            return changed[np.searchsorted(at, np.arange(num_plans), side="left")]

        left = np.minimum(
            (self.capacity - running(self.mem)).min(-1),
            (self.device_mem - running(self.rank_mem, uniform)).min((-2, -1)),
        )
        rank_perf = running(self.rank_perf, uniform)
        bound = np.maximum.reduce(
            [
                running(self.perf) / self.world_size,
                rank_perf.max(-1),
                rank_perf.min(-1) + self.shard_perf[rows, plans].max(-1),
            ]
        )
        # Each running sum rounds a few times per change, relative to its largest value.
        steps = 4.0 * (len(step) + num_tables) * np.finfo(float).eps
        finite = np.isfinite(self.perf)
        perf_scale = np.where(finite, self.perf, 0.0).max(1).sum()
        mem_scale = max(self.capacity.max(), self.device_mem.max())
        return left, bound, steps * mem_scale, steps * perf_scale

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


class Knapsack:
    """Least summed perf per memory bin, over the tables added so far.

    Each reachable bin keeps one state: its exact memory (so bins do not
    accumulate rounding) and its summed perf. Adding a table moves every state
    by each option's memory into bin `floor(memory / bin_size)` per axis; a
    bin keeps the least perf that lands in it. States that another state beats
    on every axis and on perf are dropped: no table added later can save them.
    """

    def __init__(self, capacity: np.ndarray, bins: tuple[int, ...], native: bool | None = None):
        """`native`: add tables on one axis with torch.ops.embnb.knapsack_step
        (the same states, several times faster); None: when embnb's native
        extension loads (else numpy, after one warning); False: numpy."""
        self.capacity, self.shape = capacity, bins
        self._native = len(bins) == 1 and loader.use(native)
        self.bin_size = capacity / np.array(bins)
        self.cells = np.zeros(1, dtype=np.int64)  # flat bin of each state
        self.perf = np.zeros(1)
        self.mem = np.zeros((1, len(bins)))
        self.least = np.full(math.prod(bins), np.inf)
        self.least[0] = 0.0
        self.trace: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        self._frontier: np.ndarray | None = None  # traced natively by add_tables

    def add_tables(self, weights: np.ndarray, perfs: np.ndarray) -> None:
        """`add_table(t, weights[t], perfs[t])` for every table t in order,
        from the empty plan. On one axis natively, in one call that also
        traces the frontier back (`trace` then stays empty: no more tables
        can be added)."""
        if not self._native or self.trace or not len(perfs):
            for t in range(len(perfs)):
                self.add_table(t, weights[t], perfs[t])
            return
        run = torch.ops.embnb.knapsack_run(
            torch.from_numpy(np.ascontiguousarray(weights[..., 0])),
            torch.from_numpy(np.ascontiguousarray(perfs)),
            float(self.capacity[0]),
            float(self.bin_size[0]),
            self.shape[0],
        )
        self._frontier, self.cells, self.perf, mem, self.least = (t.numpy() for t in run)
        self.mem = mem[:, None]

    def add_table(self, table: int, weights: np.ndarray, perfs: np.ndarray) -> None:
        if self._frontier is not None:
            raise RuntimeError("this knapsack's tables were added in one native run; start a new Knapsack")
        options = np.flatnonzero(np.isfinite(perfs))
        if len(self.shape) == 1:
            self._add_table_on_one_axis(table, weights[options, 0], perfs, options)
            return
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
        self.cells, self.perf, self.mem, self.least = cells, least[cells], moved[o, s], least

    def _add_table_on_one_axis(
        self, table: int, weights: np.ndarray, perfs: np.ndarray, options: np.ndarray
    ) -> None:
        """`add_table` on one memory axis: natively (embnb/native/knapsack.cpp,
        one pass), else in numpy without sorting (each bin's first winner in
        (option, state) order comes from a second scatter); either way a bin
        is kept if it beats every bin below it."""
        num_bins = self.shape[0]
        if self._native:
            step = torch.ops.embnb.knapsack_step(
                *map(torch.from_numpy, (self.mem[:, 0], self.perf, weights, perfs[options])),
                float(self.capacity[0]),
                float(self.bin_size[0]),
                num_bins,
            )
            cells, o, s, perf, mem, least = (t.numpy() for t in step)
            self.trace.append((table, cells, options[o], s))
            self.cells, self.perf, self.mem, self.least = cells, perf, mem[:, None], least
            return
        moved = self.mem[None, :, 0] + weights[:, None]  # [options, states]
        cell = np.floor(moved / self.bin_size[0]).astype(np.int64)
        o, s = np.nonzero((moved <= self.capacity[0]) & (cell < num_bins))
        cells = cell[o, s]
        perf = self.perf[s] + perfs[options[o]]
        least = np.full(num_bins, np.inf)
        np.minimum.at(least, cells, perf)
        winners = np.flatnonzero(perf == least[cells])
        first = np.full(num_bins, len(perf))
        np.minimum.at(first, cells[winners], winners)
        below = np.concatenate([[np.inf], np.minimum.accumulate(least)[:-1]])
        cells = np.flatnonzero(least < below)  # reached (least < inf) and undominated
        pick = first[cells]
        o, s = o[pick], s[pick]
        self.trace.append((table, cells, options[o], s))
        self.cells, self.perf, self.mem, self.least = cells, least[cells], moved[o, s][:, None], least

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
        if self._frontier is not None:
            return self._frontier
        states = np.lexsort(self.mem.T[::-1])[::-1]
        choices = np.full((len(states), num_tables), -1)
        for table, _cells, options, previous in reversed(self.trace):
            choices[:, table] = options[states]
            states = previous[states]
        return choices


def without_dominated(perfs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """`perfs` [tables, options] with inf for options another option of the
    same table beats: no more weight on any axis and less perf by more than
    rounding can hide. They change no knapsack state (every state they make,
    the better option makes in the same or a lower bin with less perf), and
    dropping them makes each table's step several times smaller."""
    finite = np.isfinite(perfs)
    margin = 4 * np.spacing(np.where(finite, perfs, 0.0).max(1, initial=0.0).sum())
    lighter = (weights[:, None, :, :] <= weights[:, :, None, :]).all(-1)  # [t, a, b]: b weighs <= a
    faster = perfs[:, None, :] + margin < perfs[:, :, None]  # b's perf is less than a's
    dominated = (lighter & faster & finite[:, None, :]).any(-1)
    return np.where(dominated, np.inf, perfs)


_PATIENCE = 8  # unplaced plans in a row before a run is bisected; plans proposed below
_SLACKS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32)  # memory left free by plans proposed below


class FrontierSearch:
    """Which plans of one knapsack run to propose, and in what order.

    The frontier runs from the largest memory down. The top plans use the
    most memory and may not fit per device: scan from the top and, after
    `_PATIENCE` unplaced in a row, bisect for the first placed plan. Plans
    below it are slower in sum but leave memory the partitioner needs to
    balance ranks: propose the next few, then those with 1%, 2%, 4% ... less
    memory, then the neighbors of the best rated one.
    """

    def __init__(self, plans: np.ndarray, memory: np.ndarray, space: SearchSpace):
        self.plans, self.memory, self.space = plans, memory, space
        # Each plan's memory left and lower bound, up to rounding (SearchSpace.screen).
        self.left, self.bound, self.left_error, self.bound_error = space.screen(plans)
        self.placed: dict[int, bool | None] = {}  # None: skipped, could not win
        self.ratings: dict[int, float] = {}

    def record(self, index: int, placed: bool | None, rating: float | None) -> None:
        self.placed[index] = placed
        if placed and rating is not None:
            self.ratings[index] = rating

    def fits(self, index: int) -> bool:
        """`space.fits` of plan `index`, from the screen where rounding cannot matter."""
        if abs(self.left[index]) <= self.left_error:
            return self.space.fits(self.plans[index])
        return bool(self.left[index] > 0)

    def cannot_win(self, index: int, best_rating: float) -> bool:
        """`space.lower_bound(plan) >= best_rating`, from the screen where
        rounding cannot matter."""
        if abs(self.bound[index] - best_rating) <= self.bound_error:
            return self.space.lower_bound(self.plans[index]) >= best_rating
        return bool(self.bound[index] > best_rating)

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


def by_table(options: list[ShardingOption]) -> list[list[ShardingOption]]:
    """Options grouped per table, tables in the order first seen."""
    by_fqn: dict[str, list[ShardingOption]] = {}
    for option in options:
        by_fqn.setdefault(option.fqn, []).append(option)
    return list(by_fqn.values())


def distinct_options(
    options: list[ShardingOption], one_host: bool, values: ShardValues
) -> list[ShardingOption]:
    """Drop options the partitioner and perf model treat alike; the first
    enumerated stays. Table-wise and one-shard column-wise are alike; on one
    host, so are table-column-wise and column-wise (both placed shard by shard
    on the least loaded device), and table-row-wise and row-wise (shard i on
    device i)."""
    seen, kept = set(), []
    for option in options:
        rows = values.rows(option)
        key = (
            placement(option, one_host),
            option.dependency,
            option.compute_kernel == "key_value",
            values.storage[rows].tobytes(),  # each shard's storage and perf total, as equal as ==
            values.totals[rows].tobytes(),
        )
        if key not in seen:
            seen.add(key)
            kept.append(option)
    return kept


def placement(option: ShardingOption, one_host: bool) -> str:
    """How the partitioner places the option: uniform (shard i on device i),
    device (each shard on the least loaded device that fits) or host."""
    if one_host and option.partition_by == PartitionByType.HOST.value:
        row_wise = option.sharding_type == ShardingType.TABLE_ROW_WISE.value
        return UNIFORM if row_wise else PartitionByType.DEVICE.value
    return option.partition_by


def knapsack_axes(
    space: SearchSpace, bins_per_device: int, ddr_bins_per_device: int
) -> tuple[list[int], np.ndarray, tuple[int, ...], np.ndarray]:
    """The memory axes that can bind (the largest option of every table
    together exceeds them), their capacity, bins, and each option's weight."""
    valid = np.isfinite(space.perf)
    axes = [a for a in range(2) if np.where(valid, space.mem[..., a], 0.0).max(1).sum() > space.capacity[a]]
    if not axes:  # memory cannot bind: one bin, the least perf per table
        return axes, np.array([math.inf]), (1,), np.zeros(space.perf.shape + (1,))
    per_device = [bins_per_device, ddr_bins_per_device][: len(axes)]
    bins = tuple(n * space.world_size for n in per_device)
    while math.prod(bins) > MAX_BINS:
        bins = tuple(max(1, n // 2) if n == max(bins) else n for n in bins)
        logger.info("DynamicProgrammingProposer: coarsened the bins to %s", bins)
    return axes, space.capacity[axes], bins, space.mem[..., axes]

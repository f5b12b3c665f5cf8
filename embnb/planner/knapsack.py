"""The DP proposer's knapsack over memory bins (`Knapsack`, natively on one axis:
embnb/cuda/knapsack.cpp), with the helpers that size and prune it, and which plans of one run
to try (`FrontierSearch`), on the arrays of `embnb.planner.space.SearchSpace`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import numpy as np
import torch

from embnb.cuda import loader
from embnb.planner.space import SearchSpace

logger = logging.getLogger(__name__)

# Each table added to the knapsack scans the bin grid once, so a run takes
# time in proportion to tables x bins. Past MAX_BINS bins, or past
# MAX_TABLE_BINS tables x bins, the grid is coarsened (its largest axis
# halved until under both). 5,000 tables on 512 devices at 100 bins each
# (2.56e8) stay as they are, and on 1,024 devices they get 50 bins each.
MAX_BINS = 2**18
MAX_TABLE_BINS = 2**28


class Knapsack:
    """Least summed perf per memory bin, over the tables added so far.

    Each reachable bin keeps one state: its exact memory (so bins do not
    accumulate rounding) and its summed perf. Adding a table moves every state
    by each option's memory into bin `floor(memory / bin_size)` per axis; a
    bin keeps the least perf that lands in it. States that another state beats
    on every axis and on perf are dropped: no table added later can save them.
    """

    def __init__(
        self,
        capacity: np.ndarray,
        bins: tuple[int, ...],
        native: bool | None = None,
        workspace: torch.Tensor | None = None,
    ):
        """`native`: add tables on one axis with torch.ops.embnb.knapsack_step (the same
        states, several times faster), as `embnb.cuda.loader.use` reads it, never compiling
        (None: where the extension is built, else numpy after one warning). `workspace`: an
        int32 tensor the native run keeps its trace in (and grows), passed from run to run so
        its memory is allocated once."""
        self.capacity, self.shape, self.workspace = capacity, bins, workspace
        self._native = len(bins) == 1 and loader.use(native, build=False)
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
            self.workspace,
        )
        self._frontier, self.cells, self.perf, mem, self.least = (t.numpy() for t in run)
        self.mem = mem[:, None]

    def add_table(self, table: int, weights: np.ndarray, perfs: np.ndarray) -> None:
        """Add one table: natively on one axis (embnb/cuda/knapsack.cpp, one pass), else in numpy
        without sorting (each bin's first winner in (option, state) order comes from a second
        scatter); either way a bin is kept if no bin with less or equal memory on every axis beats
        it."""
        if self._frontier is not None:
            raise RuntimeError("this knapsack's tables were added in one native run; start a new Knapsack")
        options = np.flatnonzero(np.isfinite(perfs))
        if self._native:
            step = torch.ops.embnb.knapsack_step(
                *map(torch.from_numpy, (self.mem[:, 0], self.perf, weights[options, 0], perfs[options])),
                float(self.capacity[0]),
                float(self.bin_size[0]),
                self.shape[0],
            )
            cells, o, s, perf, mem, least = (t.numpy() for t in step)
            self.trace.append((table, cells, options[o], s))
            self.cells, self.perf, self.mem, self.least = cells, perf, mem[:, None], least
            return
        moved = self.mem[None] + weights[options][:, None]  # [options, states, axes]
        cell = np.floor(moved / self.bin_size).astype(np.int64)
        o, s = np.nonzero((moved <= self.capacity).all(-1) & (cell < np.array(self.shape)).all(-1))
        cells = np.ravel_multi_index(tuple(np.moveaxis(cell[o, s], -1, 0)), self.shape)
        perf = self.perf[s] + perfs[options[o]]
        least = np.full(math.prod(self.shape), np.inf)
        np.minimum.at(least, cells, perf)
        winners = np.flatnonzero(perf == least[cells])
        first = np.full(len(least), len(perf))
        np.minimum.at(first, cells[winners], winners)
        cells = np.flatnonzero(self._undominated(least))  # reached (least < inf) and undominated
        o, s = o[first[cells]], s[first[cells]]
        self.trace.append((table, cells, options[o], s))
        self.cells, self.perf, self.mem, self.least = cells, least[cells], moved[o, s], least

    def _undominated(self, least: np.ndarray) -> np.ndarray:
        """Per bin, whether no other bin with less or equal memory on every axis
        beats it on perf (a prefix minimum per axis over the bin grid)."""
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
        return least < below.ravel()

    def frontier(self, num_tables: int) -> np.ndarray:
        """The option of each table for every kept state [states, tables],
        from the largest memory down (first axis first); after a native run,
        in the least of uint8 and int32 that holds an option index."""
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

    def __init__(
        self,
        plans: np.ndarray,
        memory: np.ndarray,
        space: SearchSpace,
        bisect: bool = True,
        slack: bool = True,
    ):
        self.plans, self.memory, self.space = plans, memory, space
        self.bisect, self.slack = bisect, slack  # off: every plan in order (torchrec's DP); no slack plans
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
        if not self.bisect:  # the plain knapsack: every plan, largest memory first
            yield from range(len(self.plans))
            return
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
            for slack in (_SLACKS if self.slack else ())
            if self.memory[-1] <= self.memory[first] * (1 - slack)
        ]
        for i in sorted(set(below)):
            if first < i < count and i not in self.placed:
                yield i
        best = self.best_index()
        for i in (best - 2, best - 1, best + 1, best + 2):
            if 0 <= i < count and i not in self.placed:
                yield i


def knapsack_axes(
    space: SearchSpace, bins_per_device: int, ddr_bins_per_device: int
) -> tuple[list[int], np.ndarray, tuple[int, ...], np.ndarray]:
    """The memory axes that can bind (the largest option of every table
    together exceeds them), their capacity, bins (coarsened past
    `MAX_BINS` and `MAX_TABLE_BINS`), and each option's weight."""
    valid = np.isfinite(space.perf)
    axes = [a for a in range(2) if np.where(valid, space.mem[..., a], 0.0).max(1).sum() > space.capacity[a]]
    if not axes:  # memory cannot bind: one bin, the least perf per table
        return axes, np.array([math.inf]), (1,), np.zeros(space.perf.shape + (1,))
    per_device = [bins_per_device, ddr_bins_per_device][: len(axes)]
    bins = tuple(n * space.world_size for n in per_device)
    num_tables = len(space.options)
    while math.prod(bins) > MAX_BINS or num_tables * math.prod(bins) > MAX_TABLE_BINS:
        bins = tuple(max(1, n // 2) if n == max(bins) else n for n in bins)
        logger.info("DynamicProgrammingProposer: coarsened the bins to %s", bins)
    return axes, space.capacity[axes], bins, space.mem[..., axes]

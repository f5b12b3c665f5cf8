"""The options of a model as arrays: what the DP proposer searches over.

`ShardValues` reads every shard's storage and perf once from torchrec's `ShardingOption`s;
`SearchSpace` turns them into per-table arrays of perf and memory, with the lower bounds and
memory checks the proposer prunes by.
"""

from __future__ import annotations

import numpy as np
from torchrec.distributed.planner.types import (
    PartitionByType,
    Perf,
    PlannerError,
    PlannerErrorType,
    ShardingOption,
    Storage,
    Topology,
)
from torchrec.distributed.types import ShardingType

from embnb.planner.layout import deferred

GB = 1024**3
AXES = ("hbm", "ddr")
UNIFORM = PartitionByType.UNIFORM.value


def gib_text(num_bytes: float) -> str:
    return f"{num_bytes / GB:.3g} GiB"


def perf_parts(perf: Perf) -> tuple[float, ...]:
    """A torchrec Perf's parts in the order `Perf.total` adds them."""
    return (perf.fwd_compute, perf.bwd_compute, perf.fwd_comms, perf.bwd_comms, perf.prefetch_compute)


def storage_of(storage: Storage) -> tuple[int, int, int]:
    return (storage.hbm, storage.ddr, storage.ssd)


class ShardValues:
    """Every shard's storage and perf, read once from torchrec's objects.

    With hundreds of tables the options hold hundreds of thousands of
    shards; walking their attributes again for each check (distinct options,
    fits, storage totals, the replica) would repeat that walk per check. Rows are
    the shards of `options` in order; `rows(option)` is one option's.
    """

    def __init__(self, options: list[ShardingOption]):
        # Shards of one size in an option mostly share their Storage and Perf objects
        # (`embnb.planner.estimates`): each pair is read once, each shard keeps only its slot (ids
        # of objects the shards hold, alive while used). A LayoutOption whose shards are not made
        # gives its estimates per size and each shard's slot among them: read without making them.
        lazy_ones = [deferred(o) and o.estimates is not None for o in options]
        counts = np.fromiter(
            (len(o.layout) if lazy else len(o.shards) for o, lazy in zip(options, lazy_ones)),
            dtype=np.int64,
            count=len(options),
        )
        slots = np.empty(int(counts.sum()), dtype=np.int64)
        slot_of: dict[tuple[int, int], int] = {}
        read = []

        def slot(storage: Storage, perf: Perf) -> int:
            pair = (id(storage), id(perf))
            found = slot_of.get(pair)
            if found is None:
                found = slot_of[pair] = len(read)
                read.append((*storage_of(storage), *perf_parts(perf), perf.total))
            return found

        position = 0
        for option, lazy, count in zip(options, lazy_ones, counts.tolist()):
            if lazy:
                ours = np.array([slot(storage, perf) for perf, storage in option.estimates], dtype=np.int64)
                slots[position : position + count] = ours[option.slot_of]
            else:
                slots[position : position + count] = [slot(s.storage, s.perf) for s in option.shards]
            position += count
        distinct = np.array(read, dtype=float).reshape(-1, 9)  # storage: whole bytes, exact below 2**53
        # Per shard only its slot: as values, 5,000 tables' shards on 1,024 devices took 1.4 GB.
        self.slots = slots
        self.storage = PerShard(distinct[:, :3].astype(np.int64), slots)  # HBM, DDR, SSD
        self.parts = PerShard(np.ascontiguousarray(distinct[:, 3:8]), slots)  # as Perf.total adds them
        self.totals = PerShard(distinct[:, 8].copy(), slots)  # Perf.total as torchrec computed it
        ends = np.cumsum(counts)
        starts = ends - counts
        self._index = {id(o): i for i, o in enumerate(options)}
        self._rows = [slice(start, end) for start, end in zip(starts.tolist(), ends.tolist())]
        # per option (whole bytes: exact); every option has a shard, so no segment is empty
        self._memory = self.storage.segment_sums(starts).tolist()

    def rows(self, option: ShardingOption) -> slice:
        return self._rows[self._index[id(option)]]

    def memory(self, option: ShardingOption) -> tuple[int, int, int]:
        """The option's total storage (HBM, DDR, SSD), as `total_storage` orders it."""
        return tuple(self._memory[self._index[id(option)]])


class PerShard:
    """A per-shard array held as its distinct rows and each shard's row among them (`slots`).
    Indexing it (shards first, then columns) gives what indexing the whole array would."""

    _CHUNK = 1 << 20  # shards gathered at once where all are read

    def __init__(self, distinct: np.ndarray, slots: np.ndarray) -> None:
        self.distinct, self.slots = distinct, slots

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, index):
        if isinstance(index, tuple):
            return self.distinct[(self.slots[index[0]], *index[1:])]
        return self.distinct[self.slots[index]]

    def segment_sums(self, starts: np.ndarray) -> np.ndarray:
        """Per segment of shards (starting at each of `starts`, none empty), the sum of its rows,
        gathered a chunk of whole segments at a time."""
        ends = np.append(starts[1:], len(self.slots)).astype(np.int64)
        sums = np.zeros((len(starts),) + self.distinct.shape[1:], dtype=self.distinct.dtype)
        first = 0
        while first < len(starts):
            # whole segments up to about a chunk of shards (at least one)
            last = max(first + 1, int(np.searchsorted(ends, starts[first] + self._CHUNK, side="right")))
            rows = self[int(starts[first]) : int(ends[last - 1])]
            sums[first:last] = np.add.reduceat(rows, starts[first:last] - starts[first], axis=0)
            first = last
        return sums


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
        device_storage = np.array([storage_of(d.storage) for d in devices])
        fits = np.zeros(len(values.storage.distinct), dtype=bool)  # each distinct shard: on some device
        for device in np.unique(device_storage, axis=0):  # devices are mostly alike
            fits |= (values.storage.distinct <= device).all(1)
        shard_fits = fits[values.slots]
        self.device_mem = device_storage[:, :2].astype(float)  # [W, 2]
        self.capacity = self.device_mem.sum(0)
        one_host = storage_constraint.intra_group_size >= self.world_size
        # An option whose largest shard fits on no device can never be placed.
        distinct = [distinct_options(table_options, one_host, values) for table_options in options]
        self.options = [[o for o in table if shard_fits[values.rows(o)].all()] for table in distinct]
        unfit = [table for table, fitting in zip(distinct, self.options) if not fitting]
        if unfit:
            raise PlannerError(
                fits_nowhere(unfit, device_storage), error_type=PlannerErrorType.INSUFFICIENT_STORAGE
            )
        self.storage = [[values.memory(o) for o in table] for table in self.options]  # (HBM, DDR, SSD)
        num_tables, width = len(options), max(len(o) for o in self.options)
        shape = (num_tables, width)
        self.perf = np.full(shape, np.inf)
        self.mem = np.zeros(shape + (2,))
        self.uniform = np.zeros(shape, dtype=bool)
        uniform_rows: list[slice] = []  # each uniform option's shards in `values`, in order
        index = np.zeros(shape, dtype=np.int64)  # per option its row in the arrays below; 0: zeros
        self.shard_perf = np.zeros(shape)  # largest shard placed by the partitioner
        self.shard_mem = np.zeros(shape + (2,))
        for t, table_options in enumerate(self.options):
            for o, option in enumerate(table_options):
                rows = values.rows(option)
                perfs, mems = values.totals[rows], values.storage[rows, :2].astype(float)
                self.perf[t, o], self.mem[t, o] = perfs.sum(), mems.sum(0)
                if placement(option, one_host) == UNIFORM:
                    self.uniform[t, o] = True
                    uniform_rows.append(rows)
                    index[t, o] = len(uniform_rows)
                else:
                    self.shard_perf[t, o], self.shard_mem[t, o] = perfs.max(), mems.max(0)
        # Per-device perf and memory of uniform options only (shard i on device i), as rows
        # indexed per option: a [tables, options, devices] array would grow with devices times
        # the widest table's options, mostly zeros.
        self.rank_perf = PerOption(index, self._device_rows(uniform_rows, values.totals))
        self.rank_mem = PerOption(index, self._device_rows(uniform_rows, values.storage, slice(0, 2)))

    def _device_rows(
        self, uniform_rows: list[slice], per_shard: PerShard, columns: slice | None = None
    ) -> np.ndarray:
        """Row 0 zeros, then per uniform option its shards' `per_shard` values (those `columns`)
        on devices 0, 1, ... (as floats)."""
        distinct = per_shard.distinct if columns is None else per_shard.distinct[:, columns]
        out = np.zeros((len(uniform_rows) + 1, self.world_size) + distinct.shape[1:])
        starts = np.array([rows.start for rows in uniform_rows], dtype=np.int64)
        counts = np.array([rows.stop - rows.start for rows in uniform_rows], dtype=np.int64)
        if len(counts) and (counts == self.world_size).all():  # a shard per device: one gather
            out[1:] = distinct[per_shard.slots[starts[:, None] + np.arange(self.world_size)]]
            return out
        for row, (start, count) in enumerate(zip(starts.tolist(), counts.tolist()), 1):
            out[row, :count] = distinct[per_shard.slots[start : start + count]]
        return out

    def lower_bound(self, choice: np.ndarray) -> float:
        """A rating no partition of `choice` can beat (see `neighbor_bounds`)."""
        rows = np.arange(len(choice))
        rank_perf = self.rank_perf.plan_sum(choice)
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
            and (self.rank_mem.plan_sum(choice) <= self.device_mem).all()
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
        if not num_plans:
            return np.zeros(0), np.zeros(0), 0.0, 0.0
        step, table = np.nonzero(plans[1:] != plans[:-1])
        old, new = plans[step, table], plans[step + 1, table]
        # Only changes to or from a uniform option move the per-device sums.
        uniform = self.uniform[table, old] | self.uniform[table, new]

        def running(values: np.ndarray, changes=slice(None), reduce=lambda sums: sums) -> np.ndarray:
            """`reduce` of each plan's `values` summed over the tables: the
            first plan's sum plus the changes made before it. Reduced per
            change before it is spread over the plans: at 1,024 devices a
            sum per rank and plan would be gigabytes."""
            at, t = step[changes], table[changes]
            changed = np.zeros((len(at) + 1,) + values.shape[2:])
            changed[0] = plan_sum(values, plans[0])
            np.cumsum(values[t, new[changes]] - values[t, old[changes]], axis=0, out=changed[1:])
            changed[1:] += changed[0]
            return reduce(changed)[np.searchsorted(at, np.arange(num_plans), side="left")]

        left = np.minimum(
            running(self.mem, reduce=lambda sums: (self.capacity - sums).min(-1)),
            running(self.rank_mem, uniform, lambda sums: (self.device_mem - sums).min((-2, -1))),
        )
        rank_perf_max, rank_perf_min = running(
            self.rank_perf, uniform, lambda sums: np.stack([sums.max(-1), sums.min(-1)], -1)
        ).T
        bound = np.maximum.reduce(
            [
                running(self.perf) / self.world_size,
                rank_perf_max,
                rank_perf_min + gathered(self.shard_perf, plans, np.max),
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

        def changed(values: np.ndarray | PerOption, moved=slice(None)) -> np.ndarray:
            at, to, was = tables[moved], new[moved], old[moved]
            return plan_sum(values, choice) + (values[at, to] - values[at, was]).sum(1)

        def per_device(values: PerOption, reduce) -> np.ndarray:
            """`reduce(changed(values))` per move, summed per device only for
            the moves to or from an option with a row (the others add zeros,
            and a sum per device and move is megabytes at 1,024 devices)."""
            moved = ((values.index[tables, new] > 0) | (values.index[tables, old] > 0)).any(1)
            out = np.repeat(reduce(plan_sum(values, choice)[None]), len(moves), axis=0)
            out[moved] = reduce(changed(values, moved))
            return out

        total_perf = changed(self.perf)
        rank_perf_max, rank_perf_min = per_device(
            self.rank_perf, lambda sums: np.stack([sums.max(1), sums.min(1)], -1)
        ).T
        # Largest partitioned shard: the biggest among unchanged tables, or a new one.
        shard = self.shard_perf[rows, choice]
        top = np.argsort(-shard)[: moves.shape[1] + 1]
        untouched = (tables[:, :, None] != top[None, None, :]).all(1)
        rest = np.where(untouched, shard[top][None, :], 0.0).max(1)
        largest = np.maximum(rest, self.shard_perf[tables, new].max(1))
        bound = np.maximum.reduce([total_perf / self.world_size, rank_perf_max, rank_perf_min + largest])
        fits = (changed(self.mem) <= self.capacity).all(1) & per_device(
            self.rank_mem, lambda sums: (sums <= self.device_mem).all((1, 2))
        )
        return bound, fits


class PerOption:
    """Per-option rows read as `values[tables, options]` (what an array of shape [tables,
    options, ...] would give), each option's row from `rows` by `index`."""

    def __init__(self, index: np.ndarray, rows: np.ndarray):
        self.index, self.rows = index, rows
        self.shape = index.shape + rows.shape[1:]

    def __getitem__(self, key) -> np.ndarray:
        return self.rows[self.index[key]]

    def plan_sum(self, choice: np.ndarray) -> np.ndarray:
        """`self[arange, choice].sum(0)`, the same floats, from the options
        with a row only: at 1,024 devices every table's row would be tens of
        megabytes. numpy adds rows of several values one after another
        (adding zeros changes no float); a column of single values it sums
        pairwise, where dropping zeros would move the rounding."""
        index = self.index[np.arange(len(choice)), choice]
        return self.rows[index[index > 0] if self.rows[0].size > 1 else index].sum(0)


def plan_sum(values: np.ndarray | PerOption, choice: np.ndarray) -> np.ndarray:
    """`values[arange, choice].sum(0)`: each table's value under the plan, summed."""
    if isinstance(values, PerOption):
        return values.plan_sum(choice)
    return values[np.arange(len(choice)), choice].sum(0)


def gathered(values: np.ndarray, plans: np.ndarray, reduce, rows_at_once: int = 256) -> np.ndarray:
    """`reduce(values[tables, plans], axis=-1)`, a few plans at a time: the
    same numbers (each plan is reduced alone) without a float per table and
    plan at once (half a gigabyte a run at 5,000 tables)."""
    tables = np.arange(plans.shape[1])
    out = np.empty(len(plans), dtype=values.dtype)
    for start in range(0, len(plans), rows_at_once):
        out[start : start + rows_at_once] = reduce(
            values[tables, plans[start : start + rows_at_once]], axis=-1
        )
    return out


def fits_nowhere(tables: list[list[ShardingOption]], device_storage: np.ndarray) -> str:
    """Why `tables` (each one's options) fit on no device: each one's smallest option and what its
    largest shard needs, and what the largest device offers (`device_storage`: [W, (HBM, DDR, SSD)])."""
    clauses = []
    for table_options in tables:
        smallest = min(table_options, key=lambda o: max((s.storage.hbm, s.storage.ddr) for s in o.shards))
        shard = max(smallest.shards, key=lambda s: (s.storage.hbm, s.storage.ddr))
        clauses.append(
            f"table {smallest.name!r} fits on no device: its smallest option "
            f"({smallest.sharding_type}, {smallest.compute_kernel}) needs "
            f"{gib_text(shard.storage.hbm)} HBM and {gib_text(shard.storage.ddr)} DDR for one shard"
        )
    biggest = device_storage[np.lexsort(device_storage[:, 1::-1].T)[-1]]
    return (
        "; ".join(clauses)
        + f", the largest device offers {gib_text(biggest[0])} HBM and {gib_text(biggest[1])} DDR "
        + "after the storage reservation; add devices or memory, or shrink the "
        + ("table" if len(tables) == 1 else "tables")
    )


def by_table(options: list[ShardingOption]) -> list[list[ShardingOption]]:
    """Options grouped per table, tables in the order first seen, each
    table's options by sharding type and compute kernel. torchrec's
    enumerator walks those from sets, so its order changes between processes
    (with the string hash seed); the DP breaks ties by option order, so
    without this one model could get different plans in different runs."""
    by_fqn: dict[str, list[ShardingOption]] = {}
    for option in options:
        by_fqn.setdefault(option.fqn, []).append(option)
    return [sorted(group, key=lambda o: (o.sharding_type, o.compute_kernel)) for group in by_fqn.values()]


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

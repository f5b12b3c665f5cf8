"""torchrec's GreedyPerfPartitioner and NoopPerfModel, replayed on arrays.

`GreedyPerfReplica` places a proposal as torchrec's planner does (uniform
options first, shard i on device i; then the others, largest storage first:
device by device, host by host or over host windows) and rates it as
`NoopPerfModel` (or a `KernelCallPerfModel`) does, on plain floats and arrays
in torchrec's order of additions, so its ratings equal torchrec's to the bit
at a fraction of the cost of torchrec's objects. Key-value column-wise
placement is left to torchrec (`place` returns None). Plans whose dependency
groups hold one table each are placed natively (torch.ops.embnb.greedy_place,
embnb/cuda/greedy_place.cpp), the rest, or all without the native extension,
here. docs/planner.md ("The replica", "Several hosts") says how the proposer
uses it and how it is tested.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torchrec.distributed.planner.types import PartitionByType, ShardingOption, Topology
from torchrec.distributed.types import ShardingType

from embnb.cuda import loader
from embnb.planner.perf_model import KernelCallPerfModel, RatingTerms
from embnb.planner.space import ShardValues, perf_parts, storage_of

UNIFORM = PartitionByType.UNIFORM.value
DEVICE = PartitionByType.DEVICE.value
HOST = PartitionByType.HOST.value
MULTI_HOST = PartitionByType.MULTI_HOST.value


def total_of(parts) -> float:
    return parts[0] + parts[1] + parts[2] + parts[3] + parts[4]


def _fits(need, have) -> bool:
    return need[0] <= have[0] and need[1] <= have[1] and need[2] <= have[2]


def _put(r: int, need, add, parts, storage) -> None:
    """A shard on rank `r`: its storage `need` taken from the rank's, its perf parts `add` added
    to the rank's in `Perf.total`'s order."""
    have, now = storage[r], parts[r]
    storage[r] = [have[0] - need[0], have[1] - need[1], have[2] - need[2]]
    parts[r] = [now[0] + add[0], now[1] + add[1], now[2] + add[2], now[3] + add[3], now[4] + add[4]]


@dataclass(frozen=True)
class Placement:
    """A replayed partition: placed or not, the rating, per rank the load,
    and each shard's rank (`ranks`, worked out when asked)."""

    placed: bool
    rating: float | None
    loads: (
        np.ndarray | None
    )  # [W] per rank: NoopPerfModel's sum (+ its kernel calls' cost); None if not placed
    shard_ranks: np.ndarray  # every shard's rank in plan order; -1 where torchrec set none
    num_shards: list[int]  # per table, how many of shard_ranks are its

    @functools.cached_property
    def ranks(self) -> list[list[int | None]]:
        """Per table, its shards' ranks (None where torchrec set none)."""
        flat = [None if r < 0 else r for r in self.shard_ranks.tolist()]
        ends = list(itertools.accumulate(self.num_shards))
        return [flat[end - n : end] for n, end in zip(self.num_shards, ends)]


class _Option:
    """One option as the replica reads it; its shards' values are read from
    `ShardValues` when first asked (the native op reads the arrays itself)."""

    def __init__(self, option: ShardingOption, values: ShardValues) -> None:
        kind = option.partition_by
        key_value_cw = (
            option.compute_kernel == "key_value" and option.sharding_type == ShardingType.COLUMN_WISE.value
        )
        modelled = kind in (UNIFORM, DEVICE, HOST, MULTI_HOST) and not key_value_cw
        self.kind = kind if modelled else None
        self.unmodelled = None if modelled else f"{option.sharding_type} with {option.compute_kernel}"
        self.name, self.sharding_type = option.name, option.sharding_type
        self.key = option.dependency or option.fqn
        self._values, self._rows = values, values.rows(option)
        self.total_storage = values.memory(option)  # whole bytes: exact

    @functools.cached_property
    def parts(self) -> list[tuple[float, ...]]:
        """Per shard, its perf parts in the order `Perf.total` adds them."""
        return [tuple(p) for p in self._values.parts[self._rows].tolist()]

    @functools.cached_property
    def totals(self) -> list[float]:
        """Per shard, `Perf.total` as torchrec computed it."""
        return self._values.totals[self._rows].tolist()

    @functools.cached_property
    def storages(self) -> list[tuple[int, int, int]]:
        """Per shard, its (HBM, DDR, SSD)."""
        return [tuple(s) for s in self._values.storage[self._rows].tolist()]


class GreedyPerfReplica:
    """GreedyPerfPartitioner (sort by storage, no module balancing) and
    NoopPerfModel (or `performance_model`, a KernelCallPerfModel) over
    `options[table][option]`, for `storage_constraint`."""

    def __init__(
        self,
        options: list[list[ShardingOption]],
        storage_constraint: Topology,
        values: ShardValues | None = None,
        native: bool | None = None,
        performance_model: KernelCallPerfModel | None = None,
    ) -> None:
        """`native`: place what it models with torch.ops.embnb.greedy_place, as
        `embnb.cuda.loader.use` reads it, never compiling (None: where the extension
        is built, else here after one warning). `performance_model`: rate as it rates
        (its kernel calls per rank and collectives; None or all coefficients
        0: NoopPerfModel's ratings, the same to the bit)."""
        devices = storage_constraint.devices
        self.world_size = num = len(devices)
        self.local_world_size = storage_constraint.local_world_size
        # torchrec's hosts: consecutive blocks of intra_group_size devices (local_world_size before 1.7)
        self.host_size = getattr(storage_constraint, "intra_group_size", self.local_world_size)
        self.hosts = [
            list(range(h * self.host_size, (h + 1) * self.host_size))
            for h in range(storage_constraint.world_size // self.host_size)
        ]
        values = values or ShardValues([o for table in options for o in table])
        self.options = [[_Option(o, values) for o in table] for table in options]
        self.start_storage = np.array([storage_of(d.storage) for d in devices], dtype=np.int64)
        self.start_parts = np.array([perf_parts(d.perf) for d in devices], dtype=float)
        # Each uniform option's first row in `values` (-1 elsewhere): its shards are read from
        # there when placed, not copied into [tables, options, devices] arrays that grow with
        # the devices times the widest table's options, mostly zeros (gigabytes at 1,024 devices).
        self.values = values
        self.uniform_start = np.full((len(options), max(len(t) for t in options)), -1, dtype=np.int64)
        for t, table in enumerate(self.options):
            for o, option in enumerate(table):
                rows = option._rows
                if option.kind == UNIFORM and rows.stop - rows.start == num:
                    self.uniform_start[t, o] = rows.start
        self.table_start = np.cumsum([0] + [len(table) for table in options[:-1]]).astype(np.int64)
        zero = performance_model is None or performance_model.is_zero
        self.terms = None if zero else RatingTerms(performance_model, options, values)
        self._native = _NativeOptions(self, options, values) if loader.use(native, build=False) else None

    def place(self, choice: np.ndarray) -> Placement | None:
        """Place the plan choosing option `choice[t]` of each table t as
        torchrec would; None where this replica does not model the options."""
        if self._native is not None:
            placement = self._native.place(choice)
            if placement is not None:
                return placement
        chosen = [self.options[t][o] for t, o in enumerate(choice.tolist())]
        if any(option.kind is None for option in chosen):
            return None
        num = self.world_size
        ranks = [[-1] * len(option.totals) for option in chosen]  # -1: no rank set

        def answer(loads: np.ndarray | None) -> Placement:
            num_shards = [len(option.totals) for option in chosen]
            flat = np.fromiter(itertools.chain.from_iterable(ranks), dtype=np.int64, count=sum(num_shards))
            if loads is None or self.terms is None:
                rating = None if loads is None else float(max(loads.tolist()))
                return Placement(loads is not None, rating, loads, flat, num_shards)
            rows = np.concatenate([np.arange(o._rows.start, o._rows.stop) for o in chosen])
            loads = self.terms.rank_costs(loads, rows, flat)
            rating = float(max(loads.tolist())) + self.terms.collectives_ms(self.table_start + choice)
            return Placement(True, rating, loads, flat, num_shards)

        # 1. Uniform options, in proposal order: shard i on device i.
        tables = np.arange(len(chosen))
        uniform = [t for t, option in enumerate(chosen) if option.kind == UNIFORM]
        if any(len(chosen[t].totals) != num for t in uniform):
            bad = next(t for t in uniform if len(chosen[t].totals) != num)
            for t in uniform[: uniform.index(bad)]:
                ranks[t] = list(range(num))
            return answer(None)
        shard_rows = self.uniform_start[tables[uniform], choice[uniform], None] + np.arange(num)  # [U, W]
        used = self.values.storage[shard_rows]  # [U, W, 3]
        left = self.start_storage[None] - np.cumsum(used, axis=0)
        over = (left < 0).any(axis=(1, 2))
        if over.any():
            k = int(np.argmax(over))
            for t in uniform[:k]:
                ranks[t] = list(range(num))
            before = left[k - 1] if k else self.start_storage
            fits = (used[k] <= before).all(1)
            ranks[uniform[k]][: int(np.argmin(fits))] = list(range(int(np.argmin(fits))))
            return answer(None)
        for t in uniform:
            ranks[t] = list(range(num))
        parts_sum = np.concatenate([self.start_parts[None], self.values.parts[shard_rows]])
        parts = np.add.accumulate(parts_sum, axis=0)[-1].tolist()  # sequential, as Perf adds
        storage = (left[-1] if uniform else self.start_storage).tolist()

        # 2. The rest, grouped by dependency (else table), largest storage first.
        rest = [t for t, option in enumerate(chosen) if option.kind != UNIFORM]
        if len({chosen[t].key for t in rest}) == len(rest):  # one table per group
            order = [[t] for t in sorted(rest, key=lambda t: chosen[t].total_storage, reverse=True)]
        else:
            groups: dict[str, list[int]] = {}
            for t in rest:
                groups.setdefault(chosen[t].key, []).append(t)
            order = sorted(
                groups.values(),
                key=lambda group: tuple(sum(chosen[t].total_storage[i] for t in group) for i in range(3)),
                reverse=True,
            )
        return self._place_groups(chosen, choice, order, ranks, parts, storage, answer)

    def unmodelled(self, choice: np.ndarray) -> str | None:
        """Why `place` leaves `choice` to torchrec (None: it does not)."""
        chosen = [self.options[t][o] for t, o in enumerate(choice.tolist())]
        for option in chosen:
            if option.kind is None:
                return f"table {option.name!r}: {option.unmodelled}"
        keys = [option.key for option in chosen if option.kind == DEVICE]
        if len(set(keys)) < len(keys):
            return "a dependency group of several tables placed device by device"
        return None

    def _place_groups(self, chosen, choice, order, ranks, parts, storage, answer) -> Placement | None:
        """Step 2 of `place`: the groups in order; a device heap over every
        device is kept until a host or multi-host group moves the loads."""
        heap: list | None = None
        for group in order:
            kind = chosen[group[0]].kind
            if kind == DEVICE:
                if len(group) != 1:  # torchrec asserts one table per device group
                    return None
                if heap is None:
                    heap = self._heap(parts, range(self.world_size), self.local_world_size)
                placed = self._device_place(chosen[group[0]], ranks[group[0]], heap, parts, storage)
            elif kind == HOST:
                placed = self._cohost_place(
                    [chosen[t] for t in group], [ranks[t] for t in group], parts, storage
                )
                heap = None
            elif kind == MULTI_HOST:
                placed = len(group) == 1 and self._grid_place(
                    chosen[group[0]], ranks[group[0]], parts, storage
                )
                heap = None
            else:
                return None
            if not placed:
                return answer(None)
        return answer(self._rate(chosen, choice, ranks))

    @staticmethod
    def _heap(parts: list, devices, local_world_size: int) -> list:
        heap = [(total_of(parts[r]), r % local_world_size, r) for r in devices]
        heapq.heapify(heap)
        return heap

    @staticmethod
    def _device_place(option: _Option, ranks: list, heap: list, parts: list, storage: list) -> bool:
        """Each shard on the least loaded device it fits (torchrec's
        _device_partition; the heap holds (total, rank % local, rank))."""
        for j, need in enumerate(option.storages):
            skipped = []
            while heap:
                _total, tie, r = heap[0]
                if _fits(need, storage[r]):
                    ranks[j] = r
                    _put(r, need, option.parts[j], parts, storage)
                    heapq.heapreplace(heap, (total_of(parts[r]), tie, r))
                    break
                skipped.append(heapq.heappop(heap))
            else:
                return False
            for entry in skipped:
                heapq.heappush(heap, entry)
        return True

    @staticmethod
    def _uniform_place(option: _Option, ranks: list, devices: list[int], parts: dict, storage: dict) -> bool:
        """Shard i on `devices[i]` (torchrec's _uniform_partition); `parts`
        and `storage` are the devices' copies, by rank."""
        if len(option.storages) != len(devices):
            return False
        for j, (r, want, add) in enumerate(zip(devices, option.storages, option.parts)):
            if not _fits(want, storage[r]):
                return False
            ranks[j] = r
            _put(r, want, add, parts, storage)
        return True

    def _sorted_hosts(self, parts: list) -> list[list[int]]:
        """The hosts by summed load, stable (torchrec's _sort_devices_by_perf)."""
        return sorted(self.hosts, key=lambda host: sum(total_of(parts[r]) for r in host))

    def _cohost_place(
        self, group: list[_Option], group_ranks: list[list], parts: list, storage: list
    ) -> bool:
        """torchrec's _cohost_partition: the group on the first host (by summed
        load) whose summed storage holds the group's and where its options
        place: table-row-wise shard i on the host's device i, table-column-wise
        device by device on the host's least loaded. A failed host's rank
        assignments stay until overwritten, as torchrec leaves them."""
        need = tuple(sum(o.total_storage[i] for o in group) for i in range(3))
        for host in self._sorted_hosts(parts):
            if not _fits(need, [sum(storage[r][i] for r in host) for i in range(3)]):
                continue
            host_parts = {r: parts[r] for r in host}
            host_storage = {r: storage[r] for r in host}
            heap, placed = None, True
            for option, ranks in zip(group, group_ranks):
                if option.sharding_type == ShardingType.TABLE_ROW_WISE.value:
                    placed = self._uniform_place(option, ranks, host, host_parts, host_storage)
                    heap = None
                elif option.sharding_type == ShardingType.TABLE_COLUMN_WISE.value:
                    if heap is None:
                        heap = self._heap(host_parts, host, len(host))
                    placed = self._device_place(option, ranks, heap, host_parts, host_storage)
                else:
                    placed = False
                if not placed:
                    break
            if placed:
                for r in host:
                    parts[r], storage[r] = host_parts[r], host_storage[r]
                return True
        return False

    def _grid_place(self, option: _Option, ranks: list, parts: list, storage: list) -> bool:
        """torchrec's _multi_hosts_partition (grid sharding): the shards
        uniformly over the devices of `num_shards / host size` hosts, the
        first window of consecutive hosts by summed load that holds them
        (hosts taken round and round when it needs all of them)."""
        needed, remainder = divmod(len(option.storages), self.host_size)
        if remainder:
            return False
        hosts = self._sorted_hosts(parts)
        if needed >= len(hosts):
            windows = [[hosts[i % len(hosts)] for i in range(needed)]]
        else:
            windows = [hosts[start : start + needed] for start in range(len(hosts) - needed + 1)]
        for window in windows:
            devices = [r for host in window for r in host]
            copy_parts = {r: parts[r] for r in devices}
            copy_storage = {r: storage[r] for r in devices}
            if self._uniform_place(option, ranks, devices, copy_parts, copy_storage):
                for r in devices:
                    parts[r], storage[r] = copy_parts[r], copy_storage[r]
                return True
        return False

    def _rate(self, chosen: list[_Option], choice: np.ndarray, ranks: list[list]) -> np.ndarray:
        """NoopPerfModel: per rank, the shards' totals added in plan order."""
        starts = self.uniform_start[np.arange(len(chosen)), choice]
        uniform = np.flatnonzero(starts >= 0)
        rows = np.zeros((len(chosen), self.world_size))  # [T, W]; zeros off uniform
        rows[uniform] = self.values.totals[starts[uniform, None] + np.arange(self.world_size)]
        at_t, at_r, values = [], [], []
        extra: list[tuple[int, np.ndarray]] = []
        for t, option in enumerate(chosen):
            if option.kind == UNIFORM:
                continue
            shard_ranks = ranks[t]
            if len(shard_ranks) == 1 or len(set(shard_ranks)) == len(shard_ranks):
                at_t += [t] * len(shard_ranks)
                at_r += shard_ranks
                values += option.totals
                continue
            layers: list[dict[int, float]] = []  # a second shard on a rank adds after the first
            for r, total in zip(shard_ranks, option.totals):
                layer = next((layer for layer in layers if r not in layer), None)
                if layer is None:
                    layer = {}
                    layers.append(layer)
                layer[r] = total
            rows[t, list(layers[0])] = list(layers[0].values())
            for layer in layers[1:]:
                row = np.zeros(self.world_size)
                row[list(layer)] = list(layer.values())
                extra.append((t + 1, row))
        rows[at_t, at_r] = values
        if extra:
            rows = np.insert(rows, [at for at, _ in extra], np.array([row for _, row in extra]), axis=0)
        return np.add.accumulate(rows, axis=0)[-1]


class _NativeOptions:
    """The replica's options laid out flat for torch.ops.embnb.greedy_place:
    per option its placement kind (`_native_kind`), dependency key, first
    shard and shard count (rows of `ShardValues.slots`) and total storage;
    the shards' slots and the distinct values they point to."""

    def __init__(self, replica: GreedyPerfReplica, options: list[list[ShardingOption]], values: ShardValues):
        rows = [values.rows(o) for table in options for o in table]
        kept = [o for table in replica.options for o in table]  # the replica's _Option of each
        keys: dict[str, int] = {}
        self.table_start = replica.table_start
        terms = replica.terms
        self.args = (
            torch.tensor([_native_kind(o) for o in kept], dtype=torch.long),
            torch.tensor([keys.setdefault(o.key, len(keys)) for o in kept], dtype=torch.long),
            torch.tensor([r.start for r in rows], dtype=torch.long),
            torch.tensor([r.stop - r.start for r in rows], dtype=torch.long),
            torch.tensor([o.total_storage for o in kept], dtype=torch.long).reshape(-1, 3),
            torch.from_numpy(values.slots),
            torch.from_numpy(values.parts.distinct),
            torch.from_numpy(values.totals.distinct),
            torch.from_numpy(np.ascontiguousarray(values.storage.distinct)),
            torch.from_numpy(replica.start_storage),
            torch.from_numpy(np.ascontiguousarray(replica.start_parts)),
            replica.local_world_size,
            replica.host_size,
            torch.from_numpy(terms.shard_group if terms else np.zeros(0, dtype=np.int64)),
            torch.from_numpy(terms.option_pair if terms else np.zeros(0, dtype=np.int64)),
            torch.from_numpy(terms.pair_ms if terms else np.zeros(0)),
            terms.kernel_call_ms if terms else 0.0,
        )
        self.num_shards = self.args[3].numpy()

    def place(self, choice: np.ndarray) -> Placement | None:
        flat = self.table_start + choice
        status, loads, ranks, rating = torch.ops.embnb.greedy_place(torch.from_numpy(flat), *self.args)
        if status < 0:
            return None
        num_shards = self.num_shards[flat].tolist()
        if not status:
            return Placement(False, None, None, ranks.numpy(), num_shards)
        return Placement(True, rating, loads.numpy(), ranks.numpy(), num_shards)


_NATIVE_KINDS = {
    (UNIFORM, None): 0,
    (DEVICE, None): 1,
    (HOST, ShardingType.TABLE_ROW_WISE.value): 2,
    (HOST, ShardingType.TABLE_COLUMN_WISE.value): 3,
    (MULTI_HOST, ShardingType.GRID_SHARD.value): 4,
}


def _native_kind(option: _Option) -> int:
    """greedy_place's code for how `option` is placed; -1: left to Python."""
    by_type = option.kind in (HOST, MULTI_HOST)
    return _NATIVE_KINDS.get((option.kind, option.sharding_type if by_type else None), -1)

"""Options whose shards are made only when read: planning in memory that grows with the options.

5,000 tables on 1,024 devices make about 25 million torchrec `Shard`s (a row-wise or data-parallel
option has one per device), though the partitioner only places the options proposed. A
`LayoutOption` is torchrec's `ShardingOption` (a subclass) holding its shards' sizes and offsets as
one array (`Layout`) and each distinct size's estimates; reading `shards` makes the `Shard`s then.
The DP proposer reads the layout and estimates without making shards (`space.ShardValues`).
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from torchrec.distributed.planner.types import Perf, Shard, ShardingOption, Storage
from torchrec.distributed.types import ShardingType

__all__ = ["Layout", "LayoutOption", "LAZY_FIELDS", "deferred"]

# What a LayoutOption keeps beside torchrec's fields (in its __dict__).
LAZY_FIELDS = frozenset({"layout", "slot_of", "estimates", "_made"})


@dataclass(frozen=True, eq=False)
class Layout:
    """An option's shards as torchrec's `calculate_shard_sizes_and_offsets`
    gives them: `table[i] = [size, offset]` of shard i (int64, read-only);
    `slot_of[i]`, the index of shard i's size among the distinct sizes (in
    the order first seen); `firsts[k]`, the first shard of size k."""

    table: np.ndarray
    slot_of: np.ndarray
    firsts: np.ndarray

    @classmethod
    def of(cls, sizes: list[list[int]], offsets: list[list[int]]) -> Layout:
        # thousands of layouts of up to a shard per device: flat iterators, not np.array of nested
        # lists, and a 1-D np.unique, not one over rows (they were most of the enumeration's time)
        count, dims = len(sizes), len(sizes[0])
        table = np.empty((count, 2, dims), dtype=np.int64)
        for column, values in enumerate((sizes, offsets)):
            flat = itertools.chain.from_iterable(values)
            table[:, column] = np.fromiter(flat, dtype=np.int64, count=count * dims).reshape(count, dims)
        return cls._numbered(table)

    @classmethod
    def spread(cls, sharding_type: str, rows: int, columns: int, world_size: int) -> Layout | None:
        """torchrec's `calculate_shard_sizes_and_offsets` for a data-parallel option, or a row-wise
        one without buckets or uneven device memory, made in numpy (None for other options). At
        1,024 devices torchrec's Python lists of a shard per device, and reading them back, were
        most of the enumeration's layout time."""
        if sharding_type == ShardingType.DATA_PARALLEL.value:
            row_sizes, row_offsets = np.full(world_size, rows, dtype=np.int64), np.zeros(world_size, np.int64)
        elif sharding_type == ShardingType.ROW_WISE.value:
            # torchrec's arithmetic (float division included, and its ZeroDivisionError for 0 rows):
            # full blocks on the first ranks, the rest on the next one, none after it
            block = math.ceil(rows / world_size)
            last_rank = rows // block
            rank = np.arange(world_size)
            row_sizes = np.where(
                rank < last_rank, block, np.where(rank == last_rank, rows - block * last_rank, 0)
            )
            row_offsets = np.concatenate(([0], np.cumsum(row_sizes[:-1])))
        else:
            return None
        table = np.zeros((world_size, 2, 2), dtype=np.int64)
        table[:, 0, 0], table[:, 0, 1], table[:, 1, 0] = row_sizes, columns, row_offsets
        return cls._numbered(table)

    @classmethod
    def _numbered(cls, table: np.ndarray) -> Layout:
        """The layout of `table` ([shards, size or offset, dims]), its sizes numbered as first seen."""
        sized, dims = table[:, 0], table.shape[2]
        if dims == 2 and sized.max() < 2**31:  # [rows, columns]: one number each
            key = (sized[:, 0] << 32) | sized[:, 1]
        else:
            key = np.unique(sized, axis=0, return_inverse=True)[1].reshape(-1)
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # slots numbered as first seen
        slot = np.empty(len(order), dtype=np.int32)
        slot[order] = np.arange(len(order), dtype=np.int32)
        slot_of, firsts = slot[inverse], first[order]
        for array in (table, slot_of):
            array.flags.writeable = False
        return cls(table, slot_of, firsts)

    def __len__(self) -> int:
        return len(self.table)

    def shards(self, estimates: list | None = None, slot_of: np.ndarray | None = None) -> list[Shard]:
        """New shards (rank None); with `estimates` (a (Perf, Storage) pair per slot), shard i gets
        `estimates[slot_of[i]]` (`slot_of`: by default the sizes' slots)."""
        shards = [Shard(size=size, offset=offset) for size, offset in self.table.tolist()]
        if estimates is not None:
            for shard, slot in zip(shards, (self.slot_of if slot_of is None else slot_of).tolist()):
                shard.perf, shard.storage = estimates[slot]
        return shards

    def distinct_shards(self) -> list[Shard]:
        """A new shard of each distinct size (the first of it), in slot order."""
        return [Shard(size=size, offset=offset) for size, offset in self.table[self.firsts].tolist()]


class LayoutOption(ShardingOption):
    """torchrec's ShardingOption whose `shards` are made from its `Layout`
    when first read (then kept, as torchrec keeps its list). Until then it
    holds its `layout`, each shard's slot among its estimates (`slot_of`) and
    the `estimates` (a (Perf, Storage) pair per slot; None before estimation)."""

    layout: Layout
    slot_of: np.ndarray
    estimates: list[tuple[Perf, Storage]] | None

    @classmethod
    def of(cls, layout: Layout, **fields: Any) -> LayoutOption:
        """An option of torchrec's fields (as ShardingOption takes them, `shards` left out)."""
        option = cls(shards=[], **fields)
        option.defer(layout, layout.slot_of, None)
        return option

    def defer(self, layout: Layout, slot_of: np.ndarray, estimates: list | None) -> None:
        """Drop the made shards (if any): the next read makes them again from these."""
        self.layout, self.slot_of, self.estimates = layout, slot_of, estimates
        self.__dict__["_made"] = None

    @property
    def shards(self) -> list[Shard]:
        made = self.__dict__["_made"]
        if made is None:
            made = self.__dict__["_made"] = self.layout.shards(self.estimates, self.slot_of)
        return made

    @shards.setter
    def shards(self, shards: list[Shard]) -> None:
        self.__dict__["_made"] = shards

    @property
    def made(self) -> bool:
        """Whether its shards exist as objects (read, or set)."""
        return self.__dict__["_made"] is not None

    def __deepcopy__(self, memo: dict[int, Any] | None) -> LayoutOption:
        # torchrec's deep copy, sharing the read-only layout and slots
        copied = object.__new__(type(self))
        for name, value in self.__dict__.items():
            shared = name in ("_tensor", "_module", "layout", "slot_of")
            copied.__dict__[name] = value if shared else copy.deepcopy(value, memo)
        return copied


def deferred(option: ShardingOption) -> bool:
    """Whether `option` is a LayoutOption whose shards are not made (yet)."""
    return isinstance(option, LayoutOption) and not option.made

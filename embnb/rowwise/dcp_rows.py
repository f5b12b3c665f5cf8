"""Routed tables in torch.distributed.checkpoint (DCP): `load_resharded` loads a checkpoint saved under any
world size and routing into a routed sharded module, `read_rows` reads one table in id order for serving
(docs/sharders.md, "Checkpoints"). A routed table's keys end with its layout (`TableLayout.key_suffix`),
so DCP itself refuses to load them into a module of another layout: these are the two explicit ways
across. `load_resharded` reads each table in blocks of rows, each rank only the spans holding its own
rows; `read_rows` returns a whole table, for tables that fit in one process's memory.

    dcp.save({"model": model.state_dict(), "optim": model.fused_optimizer.state_dict()}, checkpoint_id=path)
    # later, any W and routings:
    load_resharded(new_model.module.sparse.ebc, path, prefix="model.sparse.ebc.",
                   optimizer_prefix="optim.state.sparse.ebc.")
    rows = read_rows(path, "model.sparse.ebc.embedding_bags.t.weight", num_embeddings=1000)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import DefaultLoadPlanner, LoadPlan
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from embnb._checks import check_int
from embnb.rowwise.layout import TableLayout, convert_rows
from embnb.rowwise.routed import RoutingMismatch, saved_layout
from embnb.rowwise.sharded_rows import weight_key

__all__ = ["read_rows", "load_resharded"]

DEFAULT_MAX_ROWS_PER_READ = 1 << 20
"""`load_resharded`'s block: 2**20 rows, 512 MiB of a 128-wide float32 table."""


def _metadata(checkpoint_id: str | os.PathLike) -> dict[str, Any]:
    return dcp.FileSystemReader(checkpoint_id).read_metadata().state_dict_metadata


def _saved(metadata: dict[str, Any], key: str, num_embeddings: int) -> tuple[str, TableLayout]:
    """The checkpoint's key for torchrec's `key` (itself, or with a layout suffix) and the layout of
    its rows. Raises KeyError where there is none, RoutingMismatch where its row count does not fit."""
    found = [k for k in metadata if k == key or k.startswith(key + "@")]
    if len(found) != 1:
        table = key.rsplit(".", 2)[-2]
        near = sorted(k for k in metadata if f".{table}.weight" in k)
        raise KeyError(
            f"the checkpoint holds {len(found)} keys for {key!r} (with any layout); similar: {near}"
        )
    # no suffix: torchrec's continuous rows, in id order whatever W saved them
    layout = TableLayout(num_embeddings, **(saved_layout(found[0][len(key) :]) or {"world_size": 1}))
    rows = metadata[found[0]].size[0]
    if rows != layout.storage_rows:
        raise RoutingMismatch(
            f"{found[0]!r} holds {rows} rows, but a table of num_embeddings={num_embeddings} under its "
            f"layout holds {layout.storage_rows}"
        )
    return found[0], layout


def _read(checkpoint_id: str | os.PathLike, metadata: dict[str, Any], key: str) -> torch.Tensor:
    """The whole tensor saved at `key`, on the CPU (read by this process alone)."""
    out = torch.empty(metadata[key].size, dtype=metadata[key].properties.dtype)
    dcp.load({key: out}, checkpoint_id=checkpoint_id, no_dist=True)
    return out


def read_rows(checkpoint_id: str | os.PathLike, key: str, num_embeddings: int) -> torch.Tensor:
    """One table's rows in id order, `[num_embeddings, dim]`, from a DCP checkpoint.

    Args:
        checkpoint_id: the checkpoint's directory.
        key: torchrec's key of the table's weight in the checkpoint (e.g. `model.embedding_bags.t.weight`);
            the saved key may carry a layout suffix (a routed table's), which is found and undone.
        num_embeddings: the table's row count (a round-robin table's storage is padded to W blocks).

    Raises:
        KeyError: the checkpoint has no such key. RoutingMismatch: its rows do not fit num_embeddings.
    """
    metadata = _metadata(checkpoint_id)
    found, layout = _saved(metadata, key, num_embeddings)
    return convert_rows(_read(checkpoint_id, metadata, found), layout, TableLayout(num_embeddings, 1))


class _BlockPlanner(DefaultLoadPlanner):
    """DCP's default load planner, asked for rows `[start, start + len(out))` of the one tensor it
    loads (`{key: out}`): DCP's own resharding reads (`create_read_items_for_chunk_list`) for that
    chunk, written into `out` through the planner's `lookup_tensor` extension point."""

    def __init__(self, start: int):
        super().__init__()
        self._start = start

    def create_local_plan(self) -> LoadPlan:
        ((key, out),) = self.state_dict.items()
        offsets = torch.Size([self._start] + [0] * (out.dim() - 1))
        chunk = ChunkStorageMetadata(offsets=offsets, sizes=out.size())
        return LoadPlan(
            create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], [chunk])
        )

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.state_dict[index.fqn]  # `out` holds the chunk alone: offsets are relative to it


def _read_block(
    checkpoint_id: str | os.PathLike, metadata: dict[str, Any], key: str, start: int, stop: int
) -> torch.Tensor:
    """Rows `[start, stop)` of the tensor saved at `key`, `[stop - start, *rest]` in its dtype, on the
    CPU (read by this process alone): DCP reads only the saved chunks these rows fall in."""
    size = metadata[key].size
    out = torch.empty((stop - start, *size[1:]), dtype=metadata[key].properties.dtype)
    dcp.load({key: out}, checkpoint_id=checkpoint_id, planner=_BlockPlanner(start), no_dist=True)
    return out


def _pairs(
    source: TableLayout, target: TableLayout, start: int, stop: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For the ids whose `target` slot is in `[start, stop)`: their `source` slots, ascending, and
    their target slots minus `start` (both int64 `[ids]`). Scans the ids `step` at a time."""
    src, dst = [], []
    for first in range(0, target.num_embeddings, step):
        ids = torch.arange(first, min(first + step, target.num_embeddings))
        slots = target.slots(ids)
        mine = (slots >= start) & (slots < stop)
        src.append(source.slots(ids[mine]))
        dst.append(slots[mine] - start)
    src, dst = torch.cat(src), torch.cat(dst)
    order = src.argsort()
    return src[order], dst[order]


def _fill(
    dest: torch.Tensor,
    pairs: tuple[torch.Tensor, torch.Tensor],
    read: Callable[[int, int], torch.Tensor],
    max_rows: int,
) -> None:
    """Zero `dest` (a shard's rows), then copy into `dest[dst]` the saved rows `src` (`pairs`),
    reading them in blocks of at most `max_rows` rows, each from the first saved row not yet read to
    the last one the block reaches (rows no id of `dest` needs are not read past the block's ends)."""
    src, dst = pairs
    dest.zero_()  # padding slots no id reaches, as convert_rows leaves them
    i = 0
    while i < len(src):
        first = int(src[i])
        j = int(torch.searchsorted(src, first + max_rows))
        block = read(first, int(src[j - 1]) + 1)
        dest[dst[i:j]] = block[src[i:j] - first]
        i = j


def _load_shard(
    shard: Any,
    saved: tuple[str | os.PathLike, dict[str, Any], str],
    source: TableLayout,
    target: TableLayout,
    pairs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]],
    max_rows: int,
) -> None:
    """Fill one local shard of a ShardedTensor (its rows: target slots) in place from the rows saved
    under `source` at `saved` (checkpoint, metadata, key); `pairs` caches `_pairs` per row range."""
    offsets, sizes = shard.metadata.shard_offsets, shard.metadata.shard_sizes
    start, count = int(offsets[0]), int(sizes[0])
    if (start, count) not in pairs:  # the weight's and its states' shards hold the same rows
        pairs[start, count] = _pairs(source, target, start, start + count, max_rows)
    rest = tuple(slice(o, o + n) for o, n in zip(offsets[1:], sizes[1:]))  # row-wise: whole rows

    def read(first: int, stop: int) -> torch.Tensor:
        return _read_block(*saved, first, stop)[(slice(None), *rest)]

    _fill(shard.tensor.detach(), pairs[start, count], read, max_rows)


def load_resharded(
    module: nn.Module,
    checkpoint_id: str | os.PathLike,
    prefix: str = "",
    optimizer_prefix: str | None = None,
    max_rows_per_read: int = DEFAULT_MAX_ROWS_PER_READ,
) -> dict[str, str]:
    """Load every row-wise table of a routed sharded module from a DCP checkpoint of any layout.

    Collective in effect (every rank of the module's sharding calls it; no collective runs). Each
    rank reads, of each table's saved rows, only the spans holding its own ids' rows (under this
    module's layout, `TableLayout.slots`), in blocks of at most `max_rows_per_read` rows through
    DCP, and writes each row to its new slot in the rank's shard; padding slots are zeroed. With
    `optimizer_prefix`, each per-row state of the table's fused optimizer (e.g. row-wise Adagrad's
    `momentum1`, `[storage_rows]`) moves with its rows the same way; a state not stored per row
    (or not sharded) is read whole, as saved.

    Memory per rank beyond the module: one block, `max_rows_per_read * dim * element size` bytes
    (the default 2**20 rows of a 128-wide float32 table: 512 MiB; of its Adagrad state, 4 MiB), plus
    16 bytes per row the rank holds (each of its ids' saved and new slot, int64). DCP's
    FileSystemReader deserializes the whole saved chunk (one saving rank's shard) a block falls in
    before narrowing it, so add one saved chunk; a block smaller than the saved chunks bounds the
    copy but re-reads that chunk once per block.

    Args:
        module: a `RoutedShardedEmbeddingBagCollection` or `RoutedShardedEmbeddingCollection`.
        checkpoint_id: the DCP checkpoint's directory.
        prefix: what precedes the module's own state dict keys in the checkpoint (`"model.ebc."`).
        optimizer_prefix: what precedes the fused optimizer's parameter keys in the checkpoint
            (`"optim.state.ebc."`); None loads no optimizer state.
        max_rows_per_read: the most rows one DCP read returns (an int >= 1).

    Returns:
        table name -> the checkpoint key its rows came from.

    Raises:
        TypeError / ValueError: max_rows_per_read is not an int >= 1.
        KeyError: a table (or one of its optimizer's states) has no key in the checkpoint.
        RoutingMismatch: the saved rows do not fit the table's num_embeddings.
        ValueError: the saved rows' width differs from the table's.
    """
    max_rows = check_int("max_rows_per_read", max_rows_per_read, low=1)
    metadata = _metadata(checkpoint_id)
    loaded = {}
    for name, layout in module.table_layouts.items():
        key = f"{module.weight_prefix}.{name}.weight"
        found, source = _saved(metadata, prefix + key, layout.num_embeddings)
        pairs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

        def fill(shard: Any, saved_key: str, source=source, layout=layout, pairs=pairs) -> None:
            _load_shard(shard, (checkpoint_id, metadata, saved_key), source, layout, pairs, max_rows)

        state = module.state_dict()
        weight = state[weight_key(module, name)]
        saved_size = (layout.storage_rows, *metadata[found].size[1:])
        if saved_size != tuple(weight.size()):
            held = tuple(weight.size())
            raise ValueError(f"table {name!r} holds {held} storage rows, got {saved_size}")
        for shard in weight.local_shards():
            fill(shard, found)
        module.load_state_dict(state)  # as load_rows: the module's routing check runs
        loaded[name] = found
        if optimizer_prefix is None:
            continue
        saved_param = optimizer_prefix + key + found[len(prefix + key) :]
        param = module.fused_optimizer.params[key + layout.key_suffix]
        for state_name, value in module.fused_optimizer.state[param].items():
            state_key = f"{saved_param}.{state_name}"
            if state_key not in metadata:
                raise KeyError(f"table {name!r}: the checkpoint has no optimizer state {state_key!r}")
            size = metadata[state_key].size
            per_row = len(size) > 0 and size[0] == source.storage_rows
            if per_row and hasattr(value, "local_shards"):
                for shard in value.local_shards():  # in place, as torchrec's KeyedOptimizer loads
                    fill(shard, state_key)
                continue
            saved = _read(checkpoint_id, metadata, state_key)
            if per_row:
                saved = convert_rows(saved, source, layout)
            if not hasattr(value, "local_shards"):  # a value for the whole table
                value.detach().copy_(saved)
                continue
            for shard in value.local_shards():
                offsets, sizes = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.detach().copy_(saved[tuple(slice(o, o + n) for o, n in zip(offsets, sizes))])
    return loaded

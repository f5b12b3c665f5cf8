"""Routed tables in torch.distributed.checkpoint (DCP): `load_resharded` loads a checkpoint saved under any
world size and routing into a routed sharded module, `read_rows` reads one table in id order for serving
(docs/sharders.md, "Checkpoints"). A routed table's keys end with its layout (`TableLayout.key_suffix`),
so DCP itself refuses to load them into a module of another layout: these are the two explicit ways
across. Each reads whole tables: for tables that fit in one rank's memory.

    dcp.save({"model": model.state_dict(), "optim": model.fused_optimizer.state_dict()}, checkpoint_id=path)
    # later, any W and routings:
    load_resharded(new_model.module.sparse.ebc, path, prefix="model.sparse.ebc.",
                   optimizer_prefix="optim.state.sparse.ebc.")
    rows = read_rows(path, "model.sparse.ebc.embedding_bags.t.weight", num_embeddings=1000)
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from embnb.rowwise.layout import TableLayout, convert_rows
from embnb.rowwise.routed import RoutingMismatch, saved_layout
from embnb.rowwise.sharded_rows import load_rows

__all__ = ["read_rows", "load_resharded"]


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


def load_resharded(
    module: nn.Module,
    checkpoint_id: str | os.PathLike,
    prefix: str = "",
    optimizer_prefix: str | None = None,
) -> dict[str, str]:
    """Load every row-wise table of a routed sharded module from a DCP checkpoint of any layout.

    Collective in effect (every rank of the module's sharding calls it; no collective runs). Each
    table's saved rows are read whole on every rank, moved from their saved (W, routing) to this
    module's slots (`convert_rows`) and loaded through `load_rows`; with `optimizer_prefix`, each
    state of the table's fused optimizer (e.g. row-wise Adagrad's `momentum1`, one value per row)
    the same way.

    Args:
        module: a `RoutedShardedEmbeddingBagCollection` or `RoutedShardedEmbeddingCollection`.
        checkpoint_id: the DCP checkpoint's directory.
        prefix: what precedes the module's own state dict keys in the checkpoint (`"model.ebc."`).
        optimizer_prefix: what precedes the fused optimizer's parameter keys in the checkpoint
            (`"optim.state.ebc."`); None loads no optimizer state.

    Returns:
        table name -> the checkpoint key its rows came from.

    Raises:
        KeyError: a table (or one of its optimizer's states) has no key in the checkpoint.
        RoutingMismatch: the saved rows do not fit the table's num_embeddings.
    """
    metadata = _metadata(checkpoint_id)
    loaded = {}
    for name, layout in module.table_layouts.items():
        key = f"{module.weight_prefix}.{name}.weight"
        found, source = _saved(metadata, prefix + key, layout.num_embeddings)
        load_rows(module, name, convert_rows(_read(checkpoint_id, metadata, found), source, layout))
        loaded[name] = found
        if optimizer_prefix is None:
            continue
        saved_param = optimizer_prefix + key + found[len(prefix + key) :]
        param = module.fused_optimizer.params[key + layout.key_suffix]
        for state_name, value in module.fused_optimizer.state[param].items():
            state_key = f"{saved_param}.{state_name}"
            if state_key not in metadata:
                raise KeyError(f"table {name!r}: the checkpoint has no optimizer state {state_key!r}")
            saved = _read(checkpoint_id, metadata, state_key)
            if saved.dim() and saved.shape[0] == source.storage_rows:  # one entry per row
                saved = convert_rows(saved, source, layout)
            if not hasattr(value, "local_shards"):  # a value for the whole table
                value.detach().copy_(saved)
                continue
            for shard in value.local_shards():  # torchrec's KeyedOptimizer loads in place the same way
                offsets, sizes = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.detach().copy_(saved[tuple(slice(o, o + n) for o, n in zip(offsets, sizes))])
    return loaded

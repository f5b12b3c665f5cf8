"""A sharded key-value embedding table over a real process group (`ShardedKVTable`), like NVIDIA
dynamicemb's hash tables, taught simply: each rank holds the rows of the keys it owns
(`embnb.rowwise.routing`) as a sorted tensor of unique global keys and a tensor of rows. A key seen for
the first time gets `init_rows`, a pure function of key and seed, so every rank, every world size and
the single-process table (no process group, or `world_size=1`: the all-to-alls skipped) give a key the
same initial row, and storage and checkpoints agree across layouts.

A lookup has the ids-out, rows-back shape of torchrec's row-wise sharding, in three
`all_to_all_single` calls with uneven splits: `bucketize` groups the keys by owner rank, the ranks
exchange the counts, then the ids; each owner finds (or inserts) the rows and sends them back, and
`unbucketize_permute` puts them in input order. `apply_gradients` routes gradient rows the same way.
A batch is a torchrec `KeyedJaggedTensor` or a `JaggedBatch`, the same accessors without torchrec.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import torch
import torch.distributed as dist

from embnb._checks import check_int, check_int_tensor, check_number
from embnb.collectives import exchange
from embnb.dist import rank_device
from embnb.rowwise import checkpoint
from embnb.rowwise.routing import KEY_MODES, DistType, bucketize, hash_key

if TYPE_CHECKING:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

__all__ = [
    "init_rows",
    "JaggedBatch",
    "ShardedKVTable",
    "TABLE_NAME",
    "KVTableSpec",
    "lookup_on_rank",
]

INIT_SCALE = 0.05  # initial rows are uniform in [-INIT_SCALE, INIT_SCALE)
TABLE_NAME = "kv"  # the table name `KVTableSpec.table` uses
# 2**64 / golden ratio, as int64 bits: spreads column indices before hashing.
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def init_rows(keys: torch.Tensor, embedding_dim: int, seed: int = 0) -> torch.Tensor:
    """Initial rows (float32 ``[len(keys), embedding_dim]``) of global keys.

    Entry ``(i, c)`` is ``fmix64(fmix64(key_i) ^ fmix64(seed) + c * golden)``
    with its top 24 bits read as a uniform in ``[0, 1)`` and mapped to
    ``[-INIT_SCALE, INIT_SCALE)``: a pure function of (key, seed, column),
    on the keys' device.
    """
    check_int_tensor("keys", keys)
    embedding_dim = check_int("embedding_dim", embedding_dim, low=1)
    check_int("seed", seed, low=_INT64_MIN, high=_INT64_MAX)
    seed_bits = int(hash_key(torch.tensor([seed]))[0])
    mixed = hash_key(keys.to(torch.int64)) ^ seed_bits
    columns = torch.arange(embedding_dim, device=keys.device) * _GOLDEN
    bits = hash_key((mixed[:, None] + columns).reshape(-1))
    top24 = (bits >> 40) & 0xFFFFFF  # masked: >> on int64 is arithmetic
    uniform = top24.to(torch.float32) / (1 << 24)  # exact: 24-bit mantissa
    return ((uniform * 2 - 1) * INIT_SCALE).reshape(-1, embedding_dim)


class JaggedBatch:
    """A KeyedJaggedTensor's keys, values and lengths, without torchrec (unpickling a KJT imports
    torchrec, which costs each spawned rank seconds: `lookup_on_rank` takes these).

    ``lengths`` is feature-major (``[num_features * batch_size]``), as
    ``KeyedJaggedTensor.lengths()``; the accessors have KJT's names.
    """

    def __init__(self, keys: list[str], values: torch.Tensor, lengths: torch.Tensor):
        self._keys, self._values, self._lengths = list(keys), values, lengths

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def __repr__(self) -> str:
        return f"JaggedBatch(keys={self._keys}, values={self._values}, lengths={self._lengths})"


Batch = Union["KeyedJaggedTensor", JaggedBatch]


class ShardedKVTable:
    """One rank's shard of a row-wise sharded key-value embedding table.

    ``world_size``/``rank`` default to the current process group's, or 1/0
    when none is initialized. ``world_size=1`` is the single-process table
    (no collectives), even inside a process group. ``block_size`` is needed
    for ``continuous`` only. ``device`` defaults to the current GPU under
    nccl, else the CPU.

    ``keys`` (int64, sorted, unique, global) and ``rows`` (float32
    ``[len(keys), embedding_dim]``) are this rank's storage.
    """

    def __init__(
        self,
        name: str,
        embedding_dim: int,
        dist_type: DistType | str,
        world_size: int | None = None,
        rank: int | None = None,
        block_size: int | None = None,
        seed: int = 0,
        device: torch.device | str | None = None,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        self.name = name
        self.embedding_dim = check_int("embedding_dim", embedding_dim, low=1)
        self.dist_type = DistType.parse(dist_type)
        if self.dist_type not in KEY_MODES:
            raise ValueError(
                f"dist_type {self.dist_type.value} routes the ids of a table of known rows; a KV table "
                f"takes any int64 key: use one of {', '.join(m.value for m in KEY_MODES)}"
            )
        grouped = dist.is_available() and dist.is_initialized()
        if world_size is None:
            world_size = dist.get_world_size() if grouped else 1
        self.world_size = check_int("world_size", world_size, low=1)
        if rank is None:
            rank = dist.get_rank() if grouped and world_size > 1 else 0
        check_int("rank", rank, low=0, high=world_size - 1)
        if grouped and world_size > 1 and (world_size, rank) != (dist.get_world_size(), dist.get_rank()):
            raise ValueError(
                f"world_size={world_size}, rank={rank} do not match the "
                f"process group (world_size={dist.get_world_size()}, "
                f"rank={dist.get_rank()})"
            )
        self.rank = rank
        continuous = self.dist_type is DistType.CONTINUOUS  # the round-robin modes read no block_size
        self.block_size = check_int("block_size", block_size, low=1) if continuous else None
        self.seed = check_int("seed", seed, low=_INT64_MIN, high=_INT64_MAX)  # as init_rows takes it
        self.device = torch.device(device or (rank_device() if grouped else "cpu"))
        self.keys = torch.empty(0, dtype=torch.int64, device=self.device)
        self.rows = torch.empty(0, embedding_dim, device=self.device)
        self._counters = {
            "keys_requested": 0,
            "keys_served": 0,
            "unique_keys_served": 0,
            "bytes_served": 0,
        }

    # ------------------------------------------------------------ routing

    def _read(self, batch: object) -> tuple[int, torch.Tensor, torch.Tensor]:
        """(num_features, lengths, values) of a batch, on this device."""
        try:
            names, lengths, values = batch.keys(), batch.lengths(), batch.values()
        except (AttributeError, TypeError):
            raise ValueError(
                f"batch must be a KeyedJaggedTensor or JaggedBatch, got {type(batch).__name__}"
            ) from None
        if getattr(batch, "variable_stride_per_key", lambda: False)():
            raise ValueError(
                f"batch with features {names} has a variable batch size per feature; not supported"
            )
        return len(names), lengths.to(self.device), values.to(self.device)

    def _exchange(self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int]) -> torch.Tensor:
        """all_to_all_single along dim 0 with uneven splits."""
        if self.world_size == 1:
            return send
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                f"table {self.name!r} has world_size={self.world_size} but "
                f"no process group is initialized (use embnb.dist.launch)"
            )
        return exchange(send, send_splits, recv_splits)

    def _route(self, num_features: int, lengths: torch.Tensor, values: torch.Tensor):
        """Bucketize a batch, send each owner its ids; return (bucketized,
        splits sent, splits received, global keys received)."""
        block_sizes = [self.block_size] * num_features if self.block_size is not None else None
        # Validates the input (e.g. negative continuous keys) before any
        # collective, so bad input raises instead of hanging the other ranks.
        buckets = bucketize(
            lengths, values, self.world_size, self.dist_type, block_sizes, num_features=num_features
        )
        send_counts = buckets.lengths.to(torch.int64).view(self.world_size, -1).sum(1)
        recv_counts = self._exchange(send_counts, [1] * self.world_size, [1] * self.world_size)
        send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
        ids = self._exchange(buckets.indices.to(torch.int64), send_splits, recv_splits)
        return buckets, send_splits, recv_splits, self._to_global(ids)

    def _to_global(self, ids: torch.Tensor) -> torch.Tensor:
        """Global keys from the ids an owner receives. `continuous` sends a local row id: an in-block id
        `l < block_size` is key `rank * block_size + l`; past the blocks the id is `key // world_size`
        (always `>= block_size` there) and `key % world_size == rank`, so the key is
        `l * world_size + rank`."""
        if self.dist_type is not DistType.CONTINUOUS:
            return ids  # round-robin modes send the raw key
        in_block = ids < self.block_size
        return torch.where(in_block, self.rank * self.block_size + ids, ids * self.world_size + self.rank)

    # ------------------------------------------------------------ storage

    def _find_or_insert(self, keys: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Row positions of ``keys`` (inserting missing ones) and how many
        distinct keys there were."""
        unique = torch.unique(keys)
        missing = unique[~torch.isin(unique, self.keys)]
        if len(missing):
            merged = torch.cat([self.keys, missing])
            order = torch.argsort(merged)  # keys unique: order is unambiguous
            self.keys = merged[order]
            new_rows = init_rows(missing, self.embedding_dim, self.seed)
            self.rows = torch.cat([self.rows, new_rows])[order]
        return torch.searchsorted(self.keys, keys), len(unique)

    # -------------------------------------------------------------- API

    def lookup(self, batch: Batch) -> torch.Tensor:
        """Rows (``[num_keys, embedding_dim]``, input key order) of this
        rank's batch; a collective: every rank of the group must call it."""
        buckets, send_splits, recv_splits, keys = self._route(*self._read(batch))
        pos, num_unique = self._find_or_insert(keys)
        served = self.rows[pos]
        back = self._exchange(served, recv_splits, send_splits)
        c = self._counters
        c["keys_requested"] += len(buckets.unbucketize_permute)
        c["keys_served"] += len(keys)
        c["unique_keys_served"] += num_unique
        c["bytes_served"] += served.numel() * served.element_size()
        return back[buckets.unbucketize_permute.to(torch.int64)]

    def apply_gradients(self, batch: Batch, grads: torch.Tensor, lr: float) -> None:
        """SGD on the owners: ``row -= lr * grad`` per key of ``batch``, with
        ``grads[i]`` the gradient of input key i; duplicates are summed.
        A collective, like ``lookup``."""
        num_features, lengths, values = self._read(batch)
        shape = (values.numel(), self.embedding_dim)
        if not (isinstance(grads, torch.Tensor) and grads.is_floating_point() and grads.shape == shape):
            raise ValueError(
                f"grads must be a float tensor of {shape} (one row per key), got {checkpoint.got(grads)}"
            )
        check_number("lr", lr)
        buckets, send_splits, recv_splits, keys = self._route(num_features, lengths, values)
        # Input key i sits at bucketized position permute[i].
        send = torch.empty_like(grads, dtype=self.rows.dtype, device=self.device)
        send[buckets.unbucketize_permute.to(torch.int64)] = grads.to(send)
        recv = self._exchange(send, send_splits, recv_splits)
        pos, _ = self._find_or_insert(keys)
        # Sequential on the CPU (source-rank order), so the result equals a
        # single-process table given the ranks' batches in rank order.
        self.rows.index_add_(0, pos, recv, alpha=-lr)

    def stats(self) -> dict[str, int]:
        """This rank's load counters (cumulative over calls).

        keys_requested: keys of this rank's own batches; keys_served: keys
        this rank looked up as owner (repeats included); unique_keys_served:
        distinct keys per lookup, summed over lookups; bytes_served: bytes of
        rows sent back; rows_held: rows stored now.
        """
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            **self._counters,
            "rows_held": len(self.keys),
        }

    def dump(self, directory: str | os.PathLike) -> Path:
        """Save this rank's shard with the table's routing (embnb.rowwise.checkpoint);
        returns the shard's path. Every rank calls it with the same directory.
        """
        return checkpoint.dump(
            directory,
            self.name,
            self.rank,
            self.world_size,
            self.keys,
            self.rows,
            self.dist_type,
            self.block_size,
            init_seed=self.seed,
        )

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike,
        name: str,
        dist_type: DistType | str,
        world_size: int | None = None,
        rank: int | None = None,
        block_size: int | None = None,
        seed: int | None = None,
        device: torch.device | str | None = None,
    ) -> ShardedKVTable:
        """This rank's shard of a saved table, possibly in another layout.

        ``dist_type`` must be the checkpoint's (ValueError otherwise). Another
        world size (or continuous block size, which defaults to the stored
        one) re-routes every stored key, so no row is lost or duplicated.
        ``seed`` defaults to the stored init seed, so keys first seen after
        loading get the rows the saved table would have given them.
        """
        meta = checkpoint.read_metadata(directory, name)
        if seed is None:
            seed = meta.get("init_seed") or 0
        if block_size is None and meta.get("block_size") is not None:
            block_size = meta["block_size"]
        table = cls(name, meta["embedding_dim"], dist_type, world_size, rank, block_size, seed, device)
        keys, rows = checkpoint.load(
            directory, name, table.rank, table.world_size, table.dist_type, table.block_size
        )
        order = torch.argsort(keys)  # resharding concatenates several shards
        table.keys = keys[order].to(table.device)
        table.rows = rows[order].to(table.device, torch.float32)
        return table


# ------------------------------------------------- on spawned ranks


@dataclass(frozen=True)
class KVTableSpec:
    """What every rank's fresh table is: its routing, width, block size
    (``continuous`` only) and the seed of its initial rows."""

    dist_type: DistType | str
    embedding_dim: int
    block_size: int | None = None
    seed: int = 0

    def table(self, rank: int, world_size: int) -> ShardedKVTable:
        """This rank's fresh table, checked against the process group it lives in."""
        return ShardedKVTable(
            TABLE_NAME, self.embedding_dim, self.dist_type, world_size, rank, self.block_size, self.seed
        )


def lookup_on_rank(
    rank: int, world_size: int, spec: KVTableSpec, batches: list[Batch], dump_dir: str | None = None
) -> dict[str, Any]:
    """For ``launch``: a fresh table; this rank looks up ``batches[rank]``
    and, with ``dump_dir``, saves its shard there as :data:`TABLE_NAME`.

    Returns ``{"rows": [num_keys, dim] in batches[rank]'s key order,
    "stats": table.stats()}``.
    """
    if len(batches) != world_size:
        raise ValueError(f"batches has {len(batches)} entries, need one per rank (world_size={world_size})")
    table = spec.table(rank, world_size)
    rows = table.lookup(batches[rank])
    if dump_dir is not None:
        table.dump(dump_dir)
    return {"rows": rows, "stats": table.stats()}

"""Notebook 01's experiment on real ranks: a sharded KV table under every routing mode in one launch
(`dist.launch_each`: the ranks start once), its checkpoint loaded into another world size and by
dynamicemb's loader (as embnb replays it)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from embnb.dist import device_plan, launch_each
from embnb.lab.rowwise import reference
from embnb.metrics import max_over_mean
from embnb.rowwise import checkpoint, kv
from embnb.rowwise.routing import DistType, hash_key, owner_rank

__all__ = [
    "KVLookupRun",
    "run_kv_lookups",
    "ReshardReport",
    "reshard",
    "DYNAMICEMB_LOADER",
    "DYNAMICEMB_COMMIT",
    "dynamicemb_keys_loaded",
    "compare_loaders",
    "mismatch_message",
]


@dataclass(frozen=True)
class KVLookupRun:
    """Per dist_type, what every rank's lookup returned (rank order)."""

    world_size: int
    backend: str  # the process group's backend
    rows: dict[str, list[torch.Tensor]]  # rows of each rank's batch, input order
    stats: dict[str, list[dict[str, int]]]  # ShardedKVTable.stats() per rank
    seconds: float  # the whole launch

    def keys_served(self) -> dict[str, list[int]]:
        return {d: [s["keys_served"] for s in stats] for d, stats in self.stats.items()}

    def rows_held(self) -> dict[str, list[int]]:
        return {d: [s["rows_held"] for s in stats] for d, stats in self.stats.items()}

    def max_over_mean(self) -> dict[str, float]:
        return {d: max_over_mean(served) for d, served in self.keys_served().items()}

    def rows_match(self, batches: Sequence[kv.Batch], embedding_dim: int, seed: int) -> bool:
        """Whether every lookup returned each key's initial row (a pure
        function of key and seed) in input order, under every dist_type."""
        expected = [kv.init_rows(batch.values(), embedding_dim, seed) for batch in batches]
        return all(torch.equal(got, want) for rows in self.rows.values() for got, want in zip(rows, expected))


def run_kv_lookups(
    batches: Sequence[kv.Batch],
    dist_types: Sequence[DistType | str],
    embedding_dim: int,
    *,
    block_sizes: Mapping[str, int | None] | None = None,
    seed: int = 0,
    dump_dir: str | None = None,
    dump_dist_type: DistType | str | None = None,
    device: str = "auto",
) -> KVLookupRun:
    """One rank per batch; per dist_type a fresh `ShardedKVTable` looks up
    each rank's batch. With `dump_dir`, the `dump_dist_type` table saves its
    shards there (table name `kv.TABLE_NAME`)."""
    world_size = len(batches)
    plan = device_plan(device, world_size)
    modes = [DistType.parse(d) for d in dist_types]
    dump_mode = None if dump_dist_type is None else DistType.parse(dump_dist_type)
    block_sizes = dict(block_sizes or {})
    # JaggedBatches: unpickling KJTs would import torchrec on every rank.
    plain = [kv.JaggedBatch.from_kjt(b) if not isinstance(b, kv.JaggedBatch) else b for b in batches]
    calls = [
        (
            kv.lookup_on_rank,
            (
                kv.KVTableSpec(mode, embedding_dim, block_sizes.get(mode.value), seed),
                plain,
                dump_dir if mode is dump_mode else None,
            ),
        )
        for mode in modes
    ]
    start = time.perf_counter()
    per_mode = launch_each(calls, world_size, backend=plan.backend)
    seconds = time.perf_counter() - start
    return KVLookupRun(
        world_size=world_size,
        backend=plan.backend,
        rows={m.value: [r["rows"] for r in results] for m, results in zip(modes, per_mode)},
        stats={m.value: [r["stats"] for r in results] for m, results in zip(modes, per_mode)},
        seconds=seconds,
    )


@dataclass(frozen=True)
class ReshardReport:
    """A checkpoint written by W ranks, loaded into another world size."""

    dist_type: str
    saved_world_size: int
    load_world_size: int
    rows_saved: list[int]
    rows_loaded: list[int]
    distinct_keys_loaded: int
    every_key_on_owner: bool  # each loaded key sits on its owner under the new W
    rows_exact: bool  # loaded rows are bit-identical to the saved ones
    rows_moved_fraction: float  # rows whose owner differs between the two world sizes
    jump_hash_moved_fraction: float  # the same, had the owner been jump_bucket(fmix64(key), W)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def reshard(
    directory: str,
    dist_type: DistType | str,
    rows_saved: Sequence[int],
    load_world_size: int,
    block_size: int | None,
    embedding_dim: int,
    seed: int,
) -> ReshardReport:
    """Load the saved KV table into `load_world_size` ranks and check it.

    The table's rows are initial rows (looked up, never trained), so the
    exact rows are `kv.init_rows(keys, embedding_dim, seed)`.
    """
    mode = DistType.parse(dist_type)
    loaded = [
        checkpoint.load(directory, kv.TABLE_NAME, rank, load_world_size, mode, block_size=block_size)
        for rank in range(load_world_size)
    ]
    keys = torch.cat([k for k, _ in loaded])
    saved_world_size = len(rows_saved)
    old_owner = owner_rank(
        keys, saved_world_size, mode, checkpoint.read_metadata(directory, kv.TABLE_NAME)["block_size"]
    )
    new_owner = owner_rank(keys, load_world_size, mode, block_size)
    hashes = [h & reference.MASK64 for h in hash_key(keys).tolist()]
    jump_moved = sum(
        reference.jump_bucket(h, saved_world_size) != reference.jump_bucket(h, load_world_size)
        for h in hashes
    )
    return ReshardReport(
        dist_type=mode.value,
        saved_world_size=saved_world_size,
        load_world_size=load_world_size,
        rows_saved=list(rows_saved),
        rows_loaded=[len(k) for k, _ in loaded],
        distinct_keys_loaded=keys.unique().numel(),
        every_key_on_owner=all(
            bool((owner_rank(k, load_world_size, mode, block_size) == rank).all())
            for rank, (k, _) in enumerate(loaded)
        ),
        rows_exact=all(torch.equal(rows, kv.init_rows(k, embedding_dim, seed)) for k, rows in loaded),
        rows_moved_fraction=float((old_owner != new_owner).double().mean()),
        jump_hash_moved_fraction=jump_moved / max(len(hashes), 1),
    )


# dynamicemb's loader, read at NVIDIA/recsys-examples e4fc876 (PR #367, the
# commit that adds hash_roundrobin and the dist_type check); the same lines are
# at 43465ae. At 5174c99, before hash_roundrobin, the same two steps sit in
# get_loading_files and KeyValueTable.load.
DYNAMICEMB_COMMIT = "e4fc876f5bf98b9478eae70b317c7d02ce954d3a"
DYNAMICEMB_LOADER = {
    "commit": DYNAMICEMB_COMMIT,
    "files": (
        "corelib/dynamicemb/dynamicemb/batched_dynamicemb_tables.py:169, get_loading_files: "
        "`if world_size == num_key_files:` return only this rank's own files, else every file"
    ),
    "filter": (
        "corelib/dynamicemb/dynamicemb/key_value_table.py:1190-1191, _iter_batches_from_files "
        "(called by DynamicEmbStorage.load): `if world_size > 1: masks = keys % world_size == rank`"
    ),
    "dist_type_check": (
        "corelib/dynamicemb/dynamicemb/key_value_table.py:1247-1255, _validate_load_meta: "
        "a missing dist_type reads as 'roundrobin', a mismatch raises ValueError"
    ),
}


def dynamicemb_keys_loaded(saved_by_rank: Sequence[torch.Tensor], rank: int, world_size: int) -> torch.Tensor:
    """The keys `rank` of `world_size` loads under dynamicemb's two steps
    (`DYNAMICEMB_LOADER`): which files it reads, then the `key % W` mask."""
    same_world_size = world_size == len(saved_by_rank)  # the file count is the saved world size
    files = [rank] if same_world_size else range(len(saved_by_rank))
    keys = torch.cat([saved_by_rank[f] for f in files])
    if world_size > 1:
        keys = keys[torch.remainder(keys, world_size) == rank]
    return keys


def _placement(loaded: Sequence[torch.Tensor], saved: torch.Tensor, owner: torch.Tensor) -> dict[str, int]:
    """Rows loaded, loaded on a rank that is not the key's owner, and dropped
    (saved but loaded nowhere); `owner[i]` is the owner of `saved[i]`."""
    owner_of = dict(zip(saved.tolist(), owner.tolist()))
    keys = [k for part in loaded for k in part.tolist()]
    off_owner = sum(owner_of[k] != rank for rank, part in enumerate(loaded) for k in part.tolist())
    return {"loaded": len(keys), "off_owner": off_owner, "dropped": saved.numel() - len(set(keys))}


def compare_loaders(
    directory: str,
    dist_type: DistType | str,
    world_sizes: Sequence[int],
    block_sizes: Mapping[int, int | None] | None = None,
) -> list[dict[str, Any]]:
    """For each world size, where the checkpoint's rows land under embnb's
    loader (`checkpoint.load`: each row on the rank routing asks) and under
    dynamicemb's (`dynamicemb_keys_loaded`), counted against the owner that
    lookups go to. A dropped row is loaded nowhere; a row off its owner is
    loaded where no lookup asks. Either way the lookup of its key starts
    from a fresh row on the owner."""
    mode = DistType.parse(dist_type)
    block_sizes = dict(block_sizes or {})
    saved_world_size = checkpoint.read_metadata(directory, kv.TABLE_NAME)["world_size"]
    saved_by_rank = [  # the stored layout: each rank's own file
        checkpoint.load(directory, kv.TABLE_NAME, r, saved_world_size, mode)[0]
        for r in range(saved_world_size)
    ]
    saved = torch.cat(saved_by_rank)
    rows = []
    for world_size in world_sizes:
        block_size = block_sizes.get(world_size)
        embnb = [
            checkpoint.load(directory, kv.TABLE_NAME, rank, world_size, mode, block_size=block_size)[0]
            for rank in range(world_size)
        ]
        dynamicemb = [dynamicemb_keys_loaded(saved_by_rank, rank, world_size) for rank in range(world_size)]
        owner = owner_rank(saved, world_size, mode, block_size)
        row: dict[str, Any] = {"world_size": world_size, "rows_saved": saved.numel()}
        for name, loaded in (("embnb", embnb), ("dynamicemb", dynamicemb)):
            counts = _placement(loaded, saved, owner)
            row.update({f"{name}_rows_{what}": n for what, n in counts.items()})
        row["dynamicemb_files_read_per_rank"] = 1 if world_size == saved_world_size else saved_world_size
        rows.append(row)
    return rows


def mismatch_message(directory: str, load_world_size: int, dist_type: DistType | str) -> str | None:
    """The ValueError `checkpoint.load` raises when asked for another
    dist_type than the one saved, or None if it (wrongly) loaded."""
    try:
        checkpoint.load(directory, kv.TABLE_NAME, 0, load_world_size, dist_type)
    except ValueError as error:
        return str(error)
    return None

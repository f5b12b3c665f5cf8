"""Appendix 01a's experiment on real ranks: a sharded KV table under every routing mode in one launch
(`dist.launch_each`: the ranks start once), its checkpoint loaded at the saved and at another world
size by embnb's loader and by dynamicemb's (as embnb replays it)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from embnb.dist import device_plan, launch_each
from embnb.lab.rowwise.core import MASK64, jump_bucket
from embnb.metrics import max_over_mean
from embnb.rowwise import checkpoint, kv
from embnb.rowwise.routing import DistType, hash_key, owner_rank


def make_batches(keys: torch.Tensor, world_size: int, keys_per_sample: int = 1) -> list[kv.JaggedBatch]:
    """Split `keys` into one batch per rank (data-parallel input: rank r looks up `batches[r]`), each
    sample holding `keys_per_sample` keys of the feature "item_id"."""
    keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1)
    if keys_per_sample < 1 or keys.numel() == 0 or keys.numel() % (world_size * keys_per_sample):
        raise ValueError(
            f"{keys.numel()} keys do not split into {world_size} ranks of {keys_per_sample}-key samples"
        )
    lengths = torch.full((keys.numel() // world_size // keys_per_sample,), keys_per_sample)
    return [kv.JaggedBatch(["item_id"], part.clone(), lengths) for part in keys.chunk(world_size)]


def run_kv_lookups(
    batches: Sequence[kv.JaggedBatch],
    dist_types: Sequence[DistType | str],
    embedding_dim: int,
    *,
    block_sizes: Mapping[str, int | None] | None = None,
    seed: int = 0,
    dump_dir: str | None = None,
    dump_dist_type: DistType | str | None = None,
    device: str = "auto",
) -> dict[str, Any]:
    """One rank per batch; per dist_type a fresh `ShardedKVTable` looks up each rank's batch. With
    `dump_dir`, the `dump_dist_type` table saves its shards there (table name `kv.TABLE_NAME`).

    Returns world_size, backend, seconds (the whole launch), and per dist_type: `rows` (per rank, the
    rows of its batch in input order), `keys_served` and `rows_held` per rank (`ShardedKVTable.stats`),
    max_over_mean of keys served; `rows_match`: every lookup returned each key's initial row
    (`kv.init_rows`, a pure function of key and seed) in input order, under every dist_type."""
    world_size, modes = len(batches), [DistType.parse(d) for d in dist_types]
    plan = device_plan(device, world_size)
    dump = None if dump_dist_type is None else DistType.parse(dump_dist_type)
    block_sizes = dict(block_sizes or {})
    specs = [kv.KVTableSpec(m, embedding_dim, block_sizes.get(m.value), seed) for m in modes]
    dumps = [dump_dir if m is dump else None for m in modes]
    calls = [(kv.lookup_on_rank, (spec, list(batches), d)) for spec, d in zip(specs, dumps)]
    start = time.perf_counter()
    per_mode = dict(zip((m.value for m in modes), launch_each(calls, world_size, backend=plan.backend)))
    expected = [kv.init_rows(batch.values(), embedding_dim, seed) for batch in batches]
    served = {d: [r["stats"]["keys_served"] for r in ranks] for d, ranks in per_mode.items()}
    match = all(torch.equal(r["rows"], e) for ranks in per_mode.values() for r, e in zip(ranks, expected))
    return {
        "world_size": world_size,
        "backend": plan.backend,
        "seconds": time.perf_counter() - start,
        "rows": {d: [r["rows"] for r in ranks] for d, ranks in per_mode.items()},
        "keys_served": served,
        "rows_held": {d: [r["stats"]["rows_held"] for r in ranks] for d, ranks in per_mode.items()},
        "max_over_mean": {d: max_over_mean(counts) for d, counts in served.items()},
        "rows_match": match,
    }


# dynamicemb's loader, read at NVIDIA/recsys-examples e4fc876 (PR #367, the commit that adds
# hash_roundrobin and the dist_type check); the same lines are at 43465ae. At 5174c99, before
# hash_roundrobin, the same two steps sit in get_loading_files and KeyValueTable.load.
DYNAMICEMB_LOADER = {
    "commit": "e4fc876f5bf98b9478eae70b317c7d02ce954d3a",
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
    """The keys `rank` of `world_size` loads under dynamicemb's two steps (`DYNAMICEMB_LOADER`): which
    files it reads (the file count is the saved world size), then the `key % W` mask."""
    files = [rank] if world_size == len(saved_by_rank) else range(len(saved_by_rank))
    keys = torch.cat([saved_by_rank[f] for f in files])
    return keys[torch.remainder(keys, world_size) == rank] if world_size > 1 else keys


def reload(
    directory: str,
    dist_type: DistType | str,
    world_sizes: Sequence[int],
    embedding_dim: int,
    seed: int,
) -> list[dict[str, Any]]:
    """The KV checkpoint in `directory` loaded at each of `world_sizes` by embnb's loader
    (`checkpoint.load`: each row on the rank routing asks) and by dynamicemb's as embnb replays it
    (`dynamicemb_keys_loaded`), counted against the owner lookups go to at that W: rows loaded,
    `off_owner` (loaded where no lookup asks) and `dropped` (loaded nowhere); either way the lookup of
    its key starts from a fresh row. For embnb's also `rows_exact` (bit-identical to the saved rows: the
    table's rows are `kv.init_rows`, looked up, never trained), and the share of rows whose owner differs
    from the saved W's (`rows_moved_fraction`), against a jump consistent hash's,
    `jump_bucket(fmix64(key), W)` (`jump_hash_moved_fraction`). One dict per world size."""
    mode = DistType.parse(dist_type)
    meta = checkpoint.read_metadata(directory, kv.TABLE_NAME)
    saved_w, block = meta["world_size"], meta["block_size"]  # continuous: the saved block, as load's
    saved_by_rank = [checkpoint.load(directory, kv.TABLE_NAME, r, saved_w, mode)[0] for r in range(saved_w)]
    saved = torch.cat(saved_by_rank)
    old_owner = owner_rank(saved, saved_w, mode, block)
    hashes = [h & MASK64 for h in hash_key(saved).tolist()]
    rows = []
    for w in world_sizes:
        embnb = [checkpoint.load(directory, kv.TABLE_NAME, r, w, mode) for r in range(w)]
        dynamicemb = [dynamicemb_keys_loaded(saved_by_rank, rank, w) for rank in range(w)]
        new_owner = owner_rank(saved, w, mode, block)
        owner = dict(zip(saved.tolist(), new_owner.tolist()))
        row: dict[str, Any] = {"world_size": w, "rows_saved": saved.numel()}
        for name, loaded in (("embnb", [keys for keys, _ in embnb]), ("dynamicemb", dynamicemb)):
            keys = [(rank, k) for rank, part in enumerate(loaded) for k in part.tolist()]
            row[f"{name}_rows_loaded"] = len(keys)
            row[f"{name}_rows_off_owner"] = sum(owner[k] != rank for rank, k in keys)
            row[f"{name}_rows_dropped"] = saved.numel() - len({k for _, k in keys})
        row["dynamicemb_files_read_per_rank"] = 1 if w == saved_w else saved_w
        row["embnb_rows_exact"] = all(torch.equal(r, kv.init_rows(k, embedding_dim, seed)) for k, r in embnb)
        row["rows_moved_fraction"] = float((old_owner != new_owner).double().mean())
        moved = sum(jump_bucket(h, saved_w) != jump_bucket(h, w) for h in hashes)
        row["jump_hash_moved_fraction"] = moved / max(len(hashes), 1)
        rows.append(row)
    return rows


def mismatch_message(directory: str, load_world_size: int, dist_type: DistType | str) -> str | None:
    """The ValueError `checkpoint.load` raises when asked for another dist_type than the one saved, or
    None if it (wrongly) loaded."""
    try:
        checkpoint.load(directory, kv.TABLE_NAME, 0, load_world_size, dist_type)
    except ValueError as error:
        return str(error)
    return None

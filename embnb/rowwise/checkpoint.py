"""Checkpoints of a sharded key-value embedding table that keep the routing: one safetensors file per rank
and one metadata file, in one directory::

    {table}.rank{r}-of-{W}.safetensors   keys (int64 [n]) and rows ([n, dim])
    {table}.meta.json                    format_version, table_name, dist_type, world_size,
                                         embedding_dim, block_size, init_seed (how new rows are made)

The owner of a key depends on the dist_type, so loading under another one would put rows on ranks that
lookups never ask: `load` raises on a mismatch. Metadata without a `dist_type` loads as `roundrobin`, as
NVIDIA dynamicemb does for its older checkpoints. `load` at another world size reads every stored shard
and keeps the keys whose `owner_rank` under the new layout is this rank, so no row is lost or
duplicated. dynamicemb's loader keeps `key % world_size == rank` whatever the dist_type; under
`hash_roundrobin` most rows then land on a rank that does not own them (or are dropped): the mistake
this module avoids.

safetensors: no pickle, so loading runs no code. Files are written atomically (`_atomic_write`),
shards before the metadata, and every shard read back is checked against the metadata, so a crash
between the two writes is reported, not silently loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from embnb._checks import check_int
from embnb.rowwise.routing import DistType, owner_rank

FORMAT_VERSION = 1
# Older checkpoints have no dist_type field; dynamicemb reads them as this.
DEFAULT_DIST_TYPE = DistType.ROUNDROBIN
_CONTINUOUS = DistType.CONTINUOUS

Shard = tuple[torch.Tensor, torch.Tensor]


def shard_path(directory: str | os.PathLike, table_name: str, rank: int, world_size: int) -> Path:
    """Path of rank ``rank``'s shard file among ``world_size`` shards."""
    name = f"{table_name}.rank{rank}-of-{world_size}.safetensors"
    return Path(directory) / name


def meta_path(directory: str | os.PathLike, table_name: str) -> Path:
    """Path of a table's metadata JSON."""
    return Path(directory) / f"{table_name}.meta.json"


# ---------------------------------------------------------------- validation


def _check_table_name(table_name: str) -> None:
    # The name becomes part of file names: keep it inside the directory.
    if not table_name or "/" in table_name or os.sep in table_name:
        raise ValueError(f"table_name {table_name!r} must be a non-empty file name without path separators")


def _check_layout(rank: int, world_size: int, dist: DistType, block_size: int | None) -> None:
    check_int("world_size", world_size, low=1)
    check_int("rank", rank, low=0, high=world_size - 1)
    if dist == _CONTINUOUS:
        check_int("block_size (dist_type 'continuous')", block_size, low=1)


def got(value: object) -> str:
    """What an error says it got: a tensor's dtype and shape, or another value's type."""
    if isinstance(value, torch.Tensor):
        return f"dtype {value.dtype} and shape {tuple(value.shape)}"
    return type(value).__name__


def _check_shard(keys: torch.Tensor, rows: torch.Tensor, where: str) -> None:
    """Shape, dtype and uniqueness checks shared by dump and load."""
    if not isinstance(keys, torch.Tensor) or keys.dim() != 1 or keys.dtype != torch.int64:
        raise ValueError(f"{where}: keys must be a 1-D int64 tensor, got {got(keys)}")
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or not rows.is_floating_point():
        raise ValueError(f"{where}: rows must be a 2-D float tensor, got {got(rows)}")
    if len(keys) != len(rows):
        raise ValueError(f"{where}: {len(keys)} keys but {len(rows)} rows")
    ordered = keys.sort().values
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if len(repeated):
        raise ValueError(f"{where}: duplicate key {int(repeated[0])}")


def _check_owned(
    keys: torch.Tensor, rank: int, world_size: int, dist: DistType, block_size: int | None, where: str
) -> None:
    # A key stored on a rank that does not own it would be found by no lookup
    # (and could be loaded twice when resharding): refuse it.
    try:
        owners = owner_rank(keys, world_size, dist, block_size)
    except ValueError as e:  # e.g. a negative key under continuous
        raise ValueError(f"{where}: {e}") from e
    wrong = (owners != rank).nonzero().flatten()
    if len(wrong):
        i = int(wrong[0])
        raise ValueError(
            f"{where}: key {int(keys[i])} belongs to rank {int(owners[i])}, "
            f"not rank {rank}, under dist_type '{dist.value}' with "
            f"world_size {world_size}"
        )


# -------------------------------------------------------------------- writing


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform can open a folder.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it: a crash never
    leaves a half-written file under ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def dump(
    directory: str | os.PathLike,
    table_name: str,
    rank: int,
    world_size: int,
    keys: torch.Tensor,
    rows: torch.Tensor,
    dist_type: DistType | str,
    block_size: int | None = None,
    init_seed: int | None = None,
) -> Path:
    """Save rank ``rank``'s shard and the table's metadata; return its path.

    ``keys`` (int64 [n], unique) must all be owned by ``rank`` under
    ``dist_type`` (``block_size`` is required for ``continuous``), so the
    checkpoint's layout is what the metadata says.
    """
    _check_table_name(table_name)
    dist = DistType.parse(dist_type)
    _check_layout(rank, world_size, dist, block_size)
    _check_shard(keys, rows, f"rank {rank}'s shard")
    keys = keys.detach().cpu().contiguous()
    rows = rows.detach().cpu().contiguous()
    _check_owned(keys, rank, world_size, dist, block_size, f"rank {rank}'s shard")
    Path(directory).mkdir(parents=True, exist_ok=True)
    path = shard_path(directory, table_name, rank, world_size)
    header = {"table_name": table_name, "rank": str(rank), "world_size": str(world_size)}
    _atomic_write(path, safetensors_bytes({"keys": keys, "rows": rows}, metadata=header))
    # Every rank writes the same metadata: no rank has to go first.
    meta = {
        "format_version": FORMAT_VERSION,
        "table_name": table_name,
        "dist_type": dist.value,
        "world_size": world_size,
        "embedding_dim": rows.shape[1],
        "block_size": block_size if dist == _CONTINUOUS else None,
        # Rows of keys first seen after loading come from this seed.
        "init_seed": init_seed,
    }
    _atomic_write(meta_path(directory, table_name), (json.dumps(meta, indent=2) + "\n").encode())
    return path


# -------------------------------------------------------------------- reading


def read_metadata(directory: str | os.PathLike, table_name: str) -> dict:
    """Read and check a table's metadata; a missing dist_type reads as
    ``roundrobin``. Returns the dict with ``dist_type`` as a DistType."""
    path = meta_path(directory, table_name)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint of table {table_name!r}: {path} does not exist")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: corrupt checkpoint metadata ({e})") from e
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: checkpoint metadata is not a JSON object")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path}: checkpoint format version {version!r} is not supported (supported: {FORMAT_VERSION})"
        )
    for field, kind in [("table_name", str), ("world_size", int), ("embedding_dim", int)]:
        if not isinstance(meta.get(field), kind):
            raise ValueError(f"{path}: field {field!r} missing or not {kind.__name__}: {meta.get(field)!r}")
    if meta["table_name"] != table_name:
        raise ValueError(f"{path}: holds table {meta['table_name']!r}, not {table_name!r}")
    try:
        meta["dist_type"] = DistType.parse(meta.get("dist_type", DEFAULT_DIST_TYPE.value))
        _check_layout(0, meta["world_size"], meta["dist_type"], meta.get("block_size"))
    except (ValueError, TypeError) as e:  # a bad file is a bad value, whatever field broke
        raise ValueError(f"{path}: {e}") from e
    return meta


def _read_shard(path: Path, rank: int, meta: dict) -> Shard:
    """Read one stored shard and check it against the metadata."""
    try:
        with safe_open(path, framework="pt") as f:
            header = f.metadata() or {}
            keys, rows = f.get_tensor("keys"), f.get_tensor("rows")
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable or corrupt shard file ({e})") from e
    where = str(path)
    _check_shard(keys, rows, where)
    if rows.shape[1] != meta["embedding_dim"]:
        raise ValueError(
            f"{where}: rows have dim {rows.shape[1]} but the metadata says {meta['embedding_dim']}"
        )
    if header.get("rank") != str(rank) or header.get("world_size") != str(meta["world_size"]):
        raise ValueError(
            f"{where}: header says rank {header.get('rank')} of "
            f"{header.get('world_size')}, expected rank {rank} "
            f"of {meta['world_size']}"
        )
    _check_owned(keys, rank, meta["world_size"], meta["dist_type"], meta.get("block_size"), where)
    return keys, rows


def load(
    directory: str | os.PathLike,
    table_name: str,
    rank: int,
    world_size: int,
    dist_type: DistType | str,
    block_size: int | None = None,
) -> Shard:
    """Return the ``(keys, rows)`` that ``rank`` owns among ``world_size``.

    ``dist_type`` must match the checkpoint's (ValueError naming both
    otherwise). With the stored layout only this rank's file is read; with
    another world size (or continuous block size) every stored shard is read
    and re-routed with ``owner_rank(keys, world_size, dist_type,
    block_size)``. For ``continuous``, ``block_size`` defaults to the stored
    one; pass the new layout's block size when resharding.
    """
    _check_table_name(table_name)
    dist = DistType.parse(dist_type)
    meta = read_metadata(directory, table_name)
    if meta["dist_type"] != dist:
        raise ValueError(
            f"checkpoint {table_name!r} was written with dist_type "
            f"'{meta['dist_type'].value}' but loading asks for '{dist.value}'"
        )
    if dist == _CONTINUOUS and block_size is None:
        block_size = meta["block_size"]
    _check_layout(rank, world_size, dist, block_size)

    stored_world = meta["world_size"]
    paths = [shard_path(directory, table_name, r, stored_world) for r in range(stored_world)]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"checkpoint {table_name!r} has {stored_world} shards but "
            f"{len(missing)} shard file(s) are missing: " + ", ".join(str(p) for p in missing)
        )

    same_layout = stored_world == world_size and (dist != _CONTINUOUS or block_size == meta["block_size"])
    # Same layout: this rank's file holds exactly its keys (checked on read).
    read_ranks = [rank] if same_layout else range(stored_world)
    kept_keys, kept_rows = [], []
    for r in read_ranks:
        keys, rows = _read_shard(paths[r], r, meta)
        mine = owner_rank(keys, world_size, dist, block_size) == rank
        kept_keys.append(keys[mine])
        kept_rows.append(rows[mine])
    return torch.cat(kept_keys), torch.cat(kept_rows)

"""How evenly each routing mode spreads patterned keys over ranks.

The numbers behind notebook 01 (modulo aliasing):

    counts = rank_counts(keys, world_size, "roundrobin")   # keys per rank
    table = load_table(["strided", "zipf"], ["roundrobin", "hash_roundrobin"],
                       [4, 8], num_keys=100_000)
    grid = max_over_mean_grid(table, world_size=8)  # {pattern: {dist_type: x}}

`continuous` needs a block size. Here the table is sized to hold the largest
key, as torchrec sizes a table by `num_embeddings`:
`block_size = ceil((max(keys) + 1) / world_size)`. Ids that are not dense in
`[0, num_rows)` (snowflake ids, hashed ids) then fall into few blocks; that
is the layout's assumption, not a bug of the sweep.

`make_batches` cuts keys into one KeyedJaggedTensor per rank, for the same
comparison on a real sharded key-value table over a process group
(`embnb.rowwise.kv_experiment`).

`hot_key_floor` is the lower bound on max/mean that no routing beats: one
key is one row on one rank, so the rank owning the hottest key serves at
least its share of the traffic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from embnb.data import make_keys
from embnb.metrics import max_over_mean, spread_over_mean
from embnb.rowwise.routing import DistType, hash_key, owner_rank

__all__ = [
    "block_size_for",
    "owners",
    "rank_counts",
    "hot_key_floor",
    "worked_example",
    "load_table",
    "max_over_mean_grid",
    "hottest_key_counts",
    "make_batches",
]

LOAD_COLUMNS = [
    "pattern",
    "dist_type",
    "world_size",
    "num_keys",
    "max_over_mean",
    "spread_over_mean",
    "busiest_rank",
    "busiest_share",
    "hot_key_floor",
]


def block_size_for(keys: torch.Tensor, world_size: int) -> int:
    """Continuous block size of a table sized to hold the largest key."""
    if keys.numel() == 0:
        return 1
    largest = int(keys.max())
    if largest < 0:
        raise ValueError(f"continuous routing needs keys >= 0, got max {largest}")
    return max(1, -(-(largest + 1) // world_size))  # ceil division


def owners(
    keys: torch.Tensor,
    world_size: int,
    dist_type: DistType | str,
    block_size: int | None = None,
) -> torch.Tensor:
    """Owner rank of each key; continuous defaults to `block_size_for`."""
    mode = DistType.parse(dist_type)
    if mode is DistType.CONTINUOUS and block_size is None:
        block_size = block_size_for(keys, world_size)
    return owner_rank(keys, world_size, mode, block_size)


def rank_counts(
    keys: torch.Tensor,
    world_size: int,
    dist_type: DistType | str,
    block_size: int | None = None,
) -> torch.Tensor:
    """Keys (repeats included) each rank receives: int64 `[world_size]`."""
    ranks = owners(keys, world_size, dist_type, block_size)
    return torch.bincount(ranks, minlength=world_size)


def hot_key_floor(keys: torch.Tensor, world_size: int) -> float:
    """`world_size * (share of the most frequent key)`, at least 1.0.

    No routing that keeps one key on one rank has max/mean below this.
    """
    if keys.numel() == 0:
        raise ValueError("keys is empty: no traffic to share")
    top = int(torch.unique(keys, return_counts=True)[1].max())
    return max(1.0, world_size * top / keys.numel())


def _low_bits(key: int, bits: int) -> str:
    return format(key & ((1 << bits) - 1), f"0{bits}b")


def worked_example(
    keys: Sequence[int] | torch.Tensor,
    world_size: int,
    dist_types: Iterable[DistType | str] = tuple(DistType),
    block_size: int | None = None,
) -> pd.DataFrame:
    """One row per key: `key % W`, its fmix64 hash and its owner per mode.

    With W a power of two, `low bits` shows the log2(W) bits that alone
    decide `key % W`.
    """
    keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1)
    hashes = hash_key(keys)
    table: dict[str, Any] = {"key": keys.tolist()}
    if world_size > 1 and world_size & (world_size - 1) == 0:
        bits = world_size.bit_length() - 1
        table["low bits"] = [_low_bits(k, bits) for k in keys.tolist()]
    table[f"key % {world_size}"] = torch.remainder(keys, world_size).tolist()
    table["fmix64(key)"] = [f"{h & (2**64 - 1):016x}" for h in hashes.tolist()]
    for mode in map(DistType.parse, dist_types):
        owner = owners(keys, world_size, mode, block_size)
        table[f"owner: {mode.value}"] = owner.tolist()
    return pd.DataFrame(table)


def load_table(
    patterns: Iterable[str],
    dist_types: Iterable[DistType | str],
    world_sizes: Iterable[int],
    num_keys: int,
    seed: int = 0,
    pattern_options: Mapping[str, Mapping[str, Any]] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Per-rank load of every (pattern, dist_type, world_size), one row each.

    Keys are generated once per (pattern, world_size) with `make_keys`
    (`pattern_options[pattern]` goes to the generator, e.g. zipf's alpha)
    and routed under every dist_type. Columns: `LOAD_COLUMNS`.
    `progress` shows a tqdm.auto bar over (pattern, world_size).
    """
    patterns = list(patterns)
    modes = [DistType.parse(d) for d in dist_types]
    world_sizes = list(world_sizes)
    pattern_options = dict(pattern_options or {})
    unknown = sorted(set(pattern_options) - set(patterns))
    if unknown:
        raise ValueError(f"pattern_options for patterns not swept: {unknown}")
    jobs = [(p, w) for p in patterns for w in world_sizes]
    if progress:
        from tqdm.auto import tqdm

        jobs = tqdm(jobs, desc="patterns x world sizes")
    rows = []
    for pattern, world_size in jobs:
        keys = make_keys(pattern, num_keys, world_size, seed, **pattern_options.get(pattern, {}))
        floor = hot_key_floor(keys, world_size)
        for mode in modes:
            counts = rank_counts(keys, world_size, mode)
            busiest = int(counts.argmax())
            rows.append(
                {
                    "pattern": pattern,
                    "dist_type": mode.value,
                    "world_size": world_size,
                    "num_keys": num_keys,
                    "max_over_mean": max_over_mean(counts),
                    "spread_over_mean": spread_over_mean(counts),
                    "busiest_rank": busiest,
                    "busiest_share": int(counts[busiest]) / num_keys,
                    "hot_key_floor": floor,
                }
            )
    return pd.DataFrame(rows, columns=LOAD_COLUMNS)


def max_over_mean_grid(
    table: pd.DataFrame, world_size: int, value: str = "max_over_mean"
) -> dict[str, dict[str, float]]:
    """`{pattern: {dist_type: value}}` at one world size, in table order."""
    rows = table[table["world_size"] == world_size]
    if rows.empty:
        sizes = sorted(table["world_size"].unique().tolist())
        raise ValueError(f"no rows for world_size={world_size}; table has {sizes}")
    grid: dict[str, dict[str, float]] = {}
    for row in rows.itertuples(index=False):
        grid.setdefault(row.pattern, {})[row.dist_type] = float(getattr(row, value))
    return grid


def hottest_key_counts(
    keys: torch.Tensor,
    world_size: int,
    dist_type: DistType | str,
    block_size: int | None = None,
) -> torch.Tensor:
    """Lookups of the most frequent key only, per rank (int64 `[W]`): all
    on the one rank that owns it, whatever the dist_type."""
    if keys.numel() == 0:
        return torch.zeros(world_size, dtype=torch.int64)
    values, counts = torch.unique(keys, return_counts=True)
    hottest = values[counts.argmax()]
    if block_size is None and DistType.parse(dist_type) is DistType.CONTINUOUS:
        block_size = block_size_for(keys, world_size)  # the table's layout
    owner = int(owners(hottest.reshape(1), world_size, dist_type, block_size)[0])
    per_rank = torch.zeros(world_size, dtype=torch.int64)
    per_rank[owner] = int(counts.max())
    return per_rank


def make_batches(
    keys: torch.Tensor,
    world_size: int,
    keys_per_sample: int = 1,
    feature: str = "item_id",
) -> list:
    """Split `keys` into one KeyedJaggedTensor per rank (data-parallel
    input: rank r looks up `batches[r]`), each sample holding
    `keys_per_sample` keys of one feature."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1)
    chunk = world_size * keys_per_sample
    if keys_per_sample < 1 or keys.numel() == 0 or keys.numel() % chunk:
        raise ValueError(
            f"{keys.numel()} keys do not split into {world_size} ranks of "
            f"samples with {keys_per_sample} keys each"
        )
    batches = []
    for rank_keys in keys.chunk(world_size):
        lengths = torch.full((rank_keys.numel() // keys_per_sample,), keys_per_sample, dtype=torch.int64)
        batches.append(
            KeyedJaggedTensor.from_lengths_sync(keys=[feature], values=rank_keys.clone(), lengths=lengths)
        )
    return batches

"""How evenly each routing mode spreads patterned keys over ranks (notebook 01).

`continuous` cuts a table into blocks of `ceil(table_rows / W)` rows, as torchrec does; by default the
table is sized to hold the stream's largest key, and `table_rows={pattern: rows}` gives a stream a
table of its own, its ids mapped `into_table` first (`id % rows`), as a pipeline must (snowflake ids
are timestamps near 2**60: no real table has that many rows). Keys `k * stride + offset` reach only
`W / gcd(stride, W)` residues mod W, so `roundrobin` gives max/mean `gcd(stride, W)`. `hot_key_floor`
is the bound no routing beats: one key is one row on one rank.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from embnb._checks import check_choice, check_int
from embnb.data import make_keys
from embnb.metrics import max_over_mean, spread_over_mean
from embnb.rowwise.routing import KEY_MODES, DistType, hash_key, owner_rank

__all__ = [
    "KeyStreams",
    "into_table",
    "block_size_for",
    "owners",
    "rank_counts",
    "hot_key_floor",
    "worked_example",
    "load_table",
    "hash_noise",
    "balls_into_bins",
    "zipf_over_seeds",
    "sign_test",
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


@dataclass
class KeyStreams:
    """Key streams of `embnb.data.PATTERNS` as the notebook generates them: `pattern_options` go to
    the generator (zipf's alpha); `continuous` maps a stream into a table of `table_rows[pattern]`
    rows first (`into_table`; default: a table sized to the stream's largest key)."""

    patterns: list[str]
    seed: int = 0
    pattern_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    table_rows: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for what in ("pattern_options", "table_rows"):
            unknown = sorted(set(getattr(self, what)) - set(self.patterns))
            if unknown:
                raise ValueError(f"{what} for patterns not swept: {unknown}")

    def keys(self, pattern: str, num_keys: int) -> torch.Tensor:
        return make_keys(pattern, num_keys, self.seed, **self.pattern_options.get(pattern, {}))

    def rows_for(self, pattern: str, dist_type: DistType | str) -> int | None:
        """The table rows `continuous` routes `pattern` into (None for the other modes)."""
        return self.table_rows.get(pattern) if DistType.parse(dist_type) is DistType.CONTINUOUS else None


def block_size_for(keys: torch.Tensor, world_size: int, table_rows: int | None = None) -> int:
    """Continuous block size of a table of `table_rows` rows (default: sized
    to hold the largest key): `ceil(table_rows / world_size)`."""
    if table_rows is None:
        if keys.numel() == 0:
            return 1
        largest = int(keys.max())
        if largest < 0:
            raise ValueError(f"continuous routing needs keys >= 0, got max {largest}")
        table_rows = largest + 1
    if table_rows < 1:
        raise ValueError(f"table_rows must be >= 1, got {table_rows}")
    return max(1, -(-table_rows // world_size))  # ceil division


def into_table(keys: torch.Tensor, table_rows: int, how: str = "modulo") -> torch.Tensor:
    """Raw ids as rows of a table of `table_rows` rows, what a pipeline does
    before torchrec (which needs `0 <= id < num_embeddings`): `"modulo"` is
    `id % table_rows`, `"hash"` is `fmix64(id) % table_rows` (both unsigned)."""
    check_choice("how", how, ("modulo", "hash"))
    table_rows = check_int("table_rows", table_rows, low=1)
    mode = DistType.ROUNDROBIN if how == "modulo" else DistType.HASH_ROUNDROBIN
    return owner_rank(keys, table_rows, mode)  # key % n and fmix64(key) % n, unsigned


def owners(
    keys: torch.Tensor,
    world_size: int,
    dist_type: DistType | str,
    block_size: int | None = None,
    table_rows: int | None = None,
) -> torch.Tensor:
    """Owner rank of each key. Continuous defaults to `block_size_for`; with
    `table_rows` the keys go `into_table` first and the blocks cut that table.
    feistel_roundrobin permutes a table's ids: it needs `table_rows`."""
    mode = DistType.parse(dist_type)
    if mode is DistType.FEISTEL_ROUNDROBIN:
        if table_rows is None:
            raise ValueError("feistel_roundrobin routes a table's ids: give table_rows")
        return owner_rank(into_table(keys, table_rows), world_size, mode, num_embeddings=table_rows)
    if mode is DistType.CONTINUOUS:
        if table_rows is not None:
            if block_size is not None:
                raise ValueError("give block_size or table_rows, not both")
            keys = into_table(keys, table_rows)
            block_size = block_size_for(keys, world_size, table_rows)
        elif block_size is None:
            block_size = block_size_for(keys, world_size)
    return owner_rank(keys, world_size, mode, block_size)


def rank_counts(
    keys: torch.Tensor,
    world_size: int,
    dist_type: DistType | str,
    block_size: int | None = None,
    table_rows: int | None = None,
) -> torch.Tensor:
    """Keys (repeats included) each rank receives: int64 `[world_size]`."""
    ranks = owners(keys, world_size, dist_type, block_size, table_rows)
    return torch.bincount(ranks, minlength=world_size)


def hot_key_floor(keys: torch.Tensor, world_size: int) -> float:
    """`world_size * (share of the most frequent key)`, at least 1.0.

    No routing that keeps one key on one rank has max/mean below this.
    """
    if keys.numel() == 0:
        raise ValueError("keys is empty: no traffic to share")
    top = int(torch.unique(keys, return_counts=True)[1].max())
    return max(1.0, world_size * top / keys.numel())


def _low_bits(value: int, bits: int) -> str:
    return format(value & ((1 << bits) - 1), f"0{bits}b")


def worked_example(
    keys: Sequence[int] | torch.Tensor,
    world_size: int,
    dist_types: Iterable[DistType | str] = KEY_MODES,
    block_size: int | None = None,
    table_rows: int | None = None,
) -> pd.DataFrame:
    """One row per key: the key's and its fmix64 hash's low bits side by
    side, `key % W`, `fmix64(key) % W` and the owner per mode.

    With W a power of two the log2(W) low bits alone decide `% W`; for other
    W the columns show the 8 low bits.
    """
    keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1)
    hashes = [h & (2**64 - 1) for h in hash_key(keys).tolist()]
    power_of_two = world_size > 1 and world_size & (world_size - 1) == 0
    bits = world_size.bit_length() - 1 if power_of_two else 8
    table: dict[str, Any] = {"key": keys.tolist()}
    table[f"key, low {bits} bits"] = [_low_bits(k, bits) for k in keys.tolist()]
    table[f"fmix64, low {bits} bits"] = [_low_bits(h, bits) for h in hashes]
    table[f"key % {world_size}"] = torch.remainder(keys, world_size).tolist()
    table[f"fmix64 % {world_size}"] = [h % world_size for h in hashes]
    for mode in map(DistType.parse, dist_types):
        owner = owners(keys, world_size, mode, block_size, table_rows)
        table[f"owner: {mode.value}"] = owner.tolist()
    return pd.DataFrame(table)


def load_table(
    patterns: Iterable[str],
    dist_types: Iterable[DistType | str],
    world_sizes: Iterable[int],
    num_keys: int,
    seed: int = 0,
    pattern_options: Mapping[str, Mapping[str, Any]] | None = None,
    table_rows: Mapping[str, int] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Per-rank load of every (pattern, dist_type, world_size), one row each (`LOAD_COLUMNS`): keys
    generated once per pattern (`KeyStreams`), routed under every dist_type and world size.
    `progress` shows a tqdm.auto bar over the patterns."""
    streams = KeyStreams(
        list(patterns), seed, {k: dict(v) for k, v in (pattern_options or {}).items()}, dict(table_rows or {})
    )
    modes = [DistType.parse(d) for d in dist_types]
    world_sizes = list(world_sizes)
    jobs = streams.patterns
    if progress:
        from tqdm.auto import tqdm

        jobs = tqdm(jobs, desc="patterns")
    rows = []
    for pattern in jobs:
        keys = streams.keys(pattern, num_keys)
        for world_size, mode in itertools.product(world_sizes, modes):
            counts = rank_counts(keys, world_size, mode, table_rows=streams.rows_for(pattern, mode))
            busiest = int(counts.argmax())
            rows.append(
                [pattern, mode.value, world_size, num_keys, max_over_mean(counts), spread_over_mean(counts)]
                + [busiest, int(counts[busiest]) / num_keys, hot_key_floor(keys, world_size)]
            )
    return pd.DataFrame(rows, columns=LOAD_COLUMNS)


def hash_noise(
    keys_per_rank: Iterable[int],
    world_size: int,
    seeds: Iterable[int],
    pattern: str = "strided",
    pattern_options: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """`hash_roundrobin`'s max/mean on `world_size * n` distinct keys of
    `pattern`, for each n of `keys_per_rank` and each seed: what one step
    sends after deduplication. Columns: keys_per_rank, seed,
    distinct_keys, max_over_mean."""
    rows = []
    for n in keys_per_rank:
        for seed in seeds:
            keys = make_keys(pattern, n * world_size, seed, **dict(pattern_options or {})).unique()
            counts = rank_counts(keys, world_size, DistType.HASH_ROUNDROBIN)
            rows.append((n, seed, keys.numel(), max_over_mean(counts)))
    return pd.DataFrame(rows, columns=["keys_per_rank", "seed", "distinct_keys", "max_over_mean"])


def balls_into_bins(
    keys_per_rank: int,
    world_size: int,
    trials: int = 2000,
    quantiles: Sequence[float] = (0.05, 0.5, 0.95),
    seed: int = 0,
) -> dict[float, float]:
    """Quantiles of max/mean when `world_size * keys_per_rank` keys each pick
    a rank uniformly at random (multinomial counts from NumPy, no hashing):
    the noise a perfect hash still has."""
    import numpy as np

    total = keys_per_rank * world_size
    counts = np.random.default_rng(seed).multinomial(total, [1 / world_size] * world_size, size=trials)
    ratios = counts.max(axis=1) * world_size / total
    return {q: float(np.quantile(ratios, q)) for q in quantiles}


def zipf_over_seeds(
    num_keys: int,
    world_size: int,
    dist_types: Iterable[DistType | str],
    seeds: Iterable[int],
    keys_per_step: int,
    alpha: float,
) -> pd.DataFrame:
    """Zipf(alpha) traffic per seed and dist_type: max/mean of all lookups,
    and of the lookups left when each step of `keys_per_step` keys sends
    every distinct key once (deduplication before the all-to-all).
    Columns: seed, dist_type, traffic, max_over_mean, hot_key_floor."""
    if not 1 <= keys_per_step <= num_keys:
        raise ValueError(f"keys_per_step must be in [1, num_keys={num_keys}], got {keys_per_step}")
    modes = [DistType.parse(d) for d in dist_types]
    rows = []
    for seed in seeds:
        keys = make_keys("zipf", num_keys, seed, alpha=alpha)
        steps = torch.arange(keys.numel()) // keys_per_step
        span = int(keys.max()) + 1
        deduplicated = torch.unique(steps * span + keys) % span  # distinct keys within each step
        floor = hot_key_floor(keys, world_size)
        block_size = block_size_for(keys, world_size)
        for mode, (traffic, sent) in itertools.product(
            modes, (("all lookups", keys), ("deduplicated per step", deduplicated))
        ):
            counts = rank_counts(sent, world_size, mode, block_size if mode is DistType.CONTINUOUS else None)
            rows.append((seed, mode.value, traffic, max_over_mean(counts), floor))
    return pd.DataFrame(rows, columns=["seed", "dist_type", "traffic", "max_over_mean", "hot_key_floor"])


def sign_test(runs: pd.DataFrame, first: str, second: str, traffic: str = "all lookups") -> dict[str, Any]:
    """Is `first` below `second` on more seeds than chance? Pairs the seeds
    of a `zipf_over_seeds` table; ties drop out. Under "neither is better"
    each seed is a fair coin, so the two-sided p-value is the binomial
    probability of a count at least as far from n/2."""
    rows = runs[runs["traffic"] == traffic].pivot(index="seed", columns="dist_type", values="max_over_mean")
    missing = [d for d in (first, second) if d not in rows]
    if missing:
        raise ValueError(f"dist_types {missing} not in the runs; they have {list(rows.columns)}")
    below = int((rows[first] < rows[second]).sum())
    trials = int((rows[first] != rows[second]).sum())
    tail = min(below, trials - below)
    p_value = min(1.0, 2 * sum(math.comb(trials, k) for k in range(tail + 1)) / 2**trials) if trials else 1.0
    return {"first": first, "second": second, "first_below": below, "seeds": trials, "p_value": p_value}


def hottest_key_counts(
    keys: torch.Tensor,
    world_size: int,
    dist_type: DistType | str,
    block_size: int | None = None,
    table_rows: int | None = None,
) -> torch.Tensor:
    """Lookups of the most frequent key only, per rank (int64 `[W]`): all
    on the one rank that owns it, whatever the dist_type."""
    if keys.numel() == 0:
        return torch.zeros(world_size, dtype=torch.int64)
    values, counts = torch.unique(keys, return_counts=True)
    hottest = values[counts.argmax()]
    continuous = DistType.parse(dist_type) is DistType.CONTINUOUS
    if continuous and block_size is None and table_rows is None:
        block_size = block_size_for(keys, world_size)  # the table's layout
    owner = int(owners(hottest.reshape(1), world_size, dist_type, block_size, table_rows)[0])
    per_rank = torch.zeros(world_size, dtype=torch.int64)
    per_rank[owner] = int(counts.max())
    return per_rank


def make_batches(
    keys: torch.Tensor, world_size: int, keys_per_sample: int = 1, feature: str = "item_id"
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

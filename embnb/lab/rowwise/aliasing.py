"""How evenly each routing mode spreads patterned keys over ranks (notebook 01 and appendix 01a).

`continuous` cuts a table into blocks of `ceil(table_rows / W)` rows, as torchrec does; the table holds
the stream's largest key unless `table_rows={pattern: rows}` maps its ids `into_table` first, as a
pipeline must (snowflake ids are near 2**60). Keys `k * stride + offset` reach only `W / gcd(stride, W)`
residues mod W: `roundrobin` gives max/mean `gcd(stride, W)`. `hot_key_floor` is the bound no routing
beats (one key is one row on one rank); `counted_placement` models a placement that knows every key's
count (not a mode of any system here).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from embnb._checks import check_choice, check_int
from embnb._stderr import native_stderr
from embnb.balancing.partition import greedy_lpt
from embnb.data import make_keys
from embnb.metrics import max_over_mean
from embnb.rowwise.routing import DistType, hash_key, owner_rank

COUNTED = "counted placement (LPT)"  # the dist_type column of the count-aware model


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
    """Continuous block size of a table of `table_rows` rows (default: sized to hold the largest key):
    `ceil(table_rows / world_size)`."""
    if table_rows is None:
        largest = int(keys.max()) if keys.numel() else 0
        if largest < 0:
            raise ValueError(f"continuous routing needs keys >= 0, got max {largest}")
        table_rows = largest + 1
    return max(1, -(-check_int("table_rows", table_rows, low=1) // world_size))  # ceil division


def into_table(keys: torch.Tensor, table_rows: int, how: str = "modulo") -> torch.Tensor:
    """Raw ids as rows of a table of `table_rows` rows, what a pipeline does before torchrec (which
    needs `0 <= id < num_embeddings`): `"modulo"` is `id % table_rows`, `"hash"` is
    `fmix64(id) % table_rows` (both unsigned)."""
    modulo = check_choice("how", how, ("modulo", "hash")) == "modulo"
    mode = DistType.ROUNDROBIN if modulo else DistType.HASH_ROUNDROBIN  # key % n, fmix64(key) % n
    return owner_rank(keys, check_int("table_rows", table_rows, low=1), mode)


def owners(
    keys: torch.Tensor,
    world_size: int,
    dist_type: DistType | str,
    block_size: int | None = None,
    table_rows: int | None = None,
) -> torch.Tensor:
    """Owner rank of each key (int64, the keys' shape). Continuous defaults to `block_size_for`; with
    `table_rows` the keys go `into_table` first and the blocks cut that table. feistel_roundrobin
    permutes a table's ids: it needs `table_rows`."""
    mode = DistType.parse(dist_type)
    if mode is DistType.FEISTEL_ROUNDROBIN:
        if table_rows is None:
            raise ValueError("feistel_roundrobin routes a table's ids: give table_rows")
        return owner_rank(into_table(keys, table_rows), world_size, mode, num_embeddings=table_rows)
    if mode is DistType.CONTINUOUS and table_rows is not None:
        if block_size is not None:
            raise ValueError("give block_size or table_rows, not both")
        keys, block_size = into_table(keys, table_rows), block_size_for(keys, world_size, table_rows)
    elif mode is DistType.CONTINUOUS and block_size is None:
        block_size = block_size_for(keys, world_size)
    return owner_rank(keys, world_size, mode, block_size)


def rank_counts(
    keys: torch.Tensor, world_size: int, dist_type: DistType | str, **layout: int | None
) -> torch.Tensor:
    """Keys (repeats included) each rank receives: int64 `[world_size]`; `layout`: `owners`' block_size
    or table_rows."""
    return torch.bincount(owners(keys, world_size, dist_type, **layout), minlength=world_size)


def _key_counts(keys: torch.Tensor) -> torch.Tensor:
    """Lookups of each distinct key, in no particular order."""
    if 0 <= int(keys.min()) and int(keys.max()) < 4 * keys.numel():
        counts = torch.bincount(keys)  # small ids: counting beats sorting
        return counts[counts > 0]
    return torch.unique(keys, return_counts=True)[1]


def hot_key_floor(keys: torch.Tensor, world_size: int) -> float:
    """`world_size * (share of the most frequent key)`, at least 1.0: no routing that keeps one key on
    one rank has max/mean below this."""
    if keys.numel() == 0:
        raise ValueError("keys is empty: no traffic to share")
    return max(1.0, world_size * int(_key_counts(keys).max()) / keys.numel())


def hottest_key_counts(
    keys: torch.Tensor, world_size: int, dist_type: DistType | str, table_rows: int | None = None
) -> torch.Tensor:
    """Lookups of the most frequent key only, per rank (int64 `[W]`): all on the one rank that owns it
    in the table `rank_counts(keys, ...)` routes, whatever the dist_type."""
    if keys.numel() == 0:
        return torch.zeros(world_size, dtype=torch.int64)
    values, counts = torch.unique(keys, return_counts=True)
    owner = owners(keys, world_size, dist_type, table_rows=table_rows)  # the table rank_counts routes
    return torch.bincount(owner[keys == values[counts.argmax()]], minlength=world_size)


def worked_example(
    keys: Sequence[int] | torch.Tensor,
    world_size: int,
    dist_types: Iterable[DistType | str],
    table_rows: int | None = None,
    block_size: int | None = None,
) -> pd.DataFrame:
    """One row per key: the key's and its fmix64 hash's low bits side by side, `key % W`,
    `fmix64(key) % W` and the owner per mode (arguments as `owners`). With W a power of two the log2(W)
    low bits alone decide `% W`; for other W the columns show the 8 low bits."""
    keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1)
    hashes = [h & (2**64 - 1) for h in hash_key(keys).tolist()]
    power_of_two = world_size > 1 and world_size & (world_size - 1) == 0
    bits = world_size.bit_length() - 1 if power_of_two else 8
    table: dict[str, Any] = {"key": keys.tolist()}
    table[f"key, low {bits} bits"] = [format(k % 2**bits, f"0{bits}b") for k in keys.tolist()]
    table[f"fmix64, low {bits} bits"] = [format(h % 2**bits, f"0{bits}b") for h in hashes]
    table[f"key % {world_size}"] = torch.remainder(keys, world_size).tolist()
    table[f"fmix64 % {world_size}"] = [h % world_size for h in hashes]
    for mode in map(DistType.parse, dist_types):
        table[f"owner: {mode.value}"] = owners(keys, world_size, mode, block_size, table_rows).tolist()
    return pd.DataFrame(table)


def load_table(
    streams: KeyStreams,
    dist_types: Iterable[DistType | str],
    world_sizes: Iterable[int],
    num_keys: int,
    progress: bool = False,
) -> pd.DataFrame:
    """max/mean of keys per rank for every (pattern, dist_type, world_size), one row each (columns
    pattern, dist_type, world_size, num_keys, max_over_mean, hot_key_floor): `num_keys` keys of each of
    `streams`' patterns, routed under every dist_type and world size. `progress`: a tqdm bar."""
    rows = []
    for pattern in tqdm(streams.patterns, desc="patterns", disable=not progress):
        keys = streams.keys(pattern, num_keys)
        for world_size, mode in itertools.product(world_sizes, map(DistType.parse, dist_types)):
            counts = rank_counts(keys, world_size, mode, table_rows=streams.rows_for(pattern, mode))
            floor = hot_key_floor(keys, world_size)
            rows.append((pattern, mode.value, world_size, num_keys, max_over_mean(counts), floor))
    columns = ["pattern", "dist_type", "world_size", "num_keys", "max_over_mean", "hot_key_floor"]
    return pd.DataFrame(rows, columns=columns)


def hash_noise(
    keys_per_rank: Iterable[int],
    world_size: int,
    seeds: Iterable[int],
    pattern: str = "strided",
    pattern_options: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """`hash_roundrobin`'s max/mean on `world_size * n` distinct keys of `pattern`, for each n of
    `keys_per_rank` and each seed: what one step sends after deduplication. Columns: keys_per_rank,
    seed, distinct_keys, max_over_mean."""
    rows = []
    for n, seed in itertools.product(keys_per_rank, list(seeds)):
        keys = make_keys(pattern, n * world_size, seed, **dict(pattern_options or {})).unique()
        rows.append((n, seed, keys.numel(), max_over_mean(rank_counts(keys, world_size, "hash_roundrobin"))))
    return pd.DataFrame(rows, columns=["keys_per_rank", "seed", "distinct_keys", "max_over_mean"])


def balls_into_bins(
    keys_per_rank: int,
    world_size: int,
    trials: int = 2000,
    quantiles: Sequence[float] = (0.05, 0.5, 0.95),
    seed: int = 0,
) -> dict[float, float]:
    """Quantiles of max/mean when `world_size * keys_per_rank` keys each pick a rank uniformly at
    random (multinomial counts from NumPy, no hashing): the noise a perfect hash still has."""
    total = keys_per_rank * world_size
    counts = np.random.default_rng(seed).multinomial(total, [1 / world_size] * world_size, size=trials)
    return {q: float(np.quantile(counts.max(axis=1) * world_size / total, q)) for q in quantiles}


def zipf_over_seeds(
    num_keys: int,
    world_size: int,
    dist_types: Iterable[str],
    seeds: Iterable[int],
    alphas: Iterable[float],
    keys_per_step: int | None = None,
) -> pd.DataFrame:
    """Zipf(alpha) traffic per alpha, seed and dist_type (`COUNTED`: the count-aware model,
    `counted_placement`): max/mean of all lookups and, with `keys_per_step`, of the lookups left when
    each step of `keys_per_step` keys sends every distinct key once (deduplication before the
    all-to-all). Columns: alpha, seed, dist_type, traffic, max_over_mean, hottest_share (p1 of all
    lookups, as measured), w_times_p1, hot_key_floor (`max(1, W * p1)`, as `hot_key_floor`)."""
    if keys_per_step is not None and not 1 <= keys_per_step <= num_keys:
        raise ValueError(f"keys_per_step must be in [1, num_keys={num_keys}], got {keys_per_step}")
    rows = []
    for alpha, seed in itertools.product(alphas, list(seeds)):
        keys = make_keys("zipf", num_keys, seed, alpha=alpha)
        traffics = {"all lookups": keys}
        if keys_per_step is not None:  # the distinct keys within each step
            span, steps = int(keys.max()) + 1, torch.arange(keys.numel()) // keys_per_step
            traffics["deduplicated per step"] = torch.unique(steps * span + keys) % span
        p1 = int(_key_counts(keys).max()) / keys.numel()
        hot = (p1, world_size * p1, max(1.0, world_size * p1))  # hottest_share, w_times_p1, hot_key_floor
        block = block_size_for(keys, world_size)  # only continuous reads it
        for dist_type, (traffic, sent) in itertools.product(dist_types, traffics.items()):
            if dist_type == COUNTED:
                counts = counted_placement(sent, world_size)
            else:
                counts = rank_counts(sent, world_size, dist_type, block_size=block)
            rows.append((float(alpha), seed, dist_type, traffic, max_over_mean(counts), *hot))
    columns = "alpha seed dist_type traffic max_over_mean hottest_share w_times_p1 hot_key_floor".split()
    return pd.DataFrame(rows, columns=columns)


def sign_test(runs: pd.DataFrame, first: str, second: str, traffic: str = "all lookups") -> dict[str, Any]:
    """Is `first` below `second` on more seeds than chance? Pairs the seeds of a `zipf_over_seeds`
    table; ties drop out. Under "neither is better" each seed is a fair coin: the two-sided binomial
    p-value (scipy's `binomtest`, p = 1/2: a count at least as far from n/2)."""
    from scipy.stats import binomtest

    rows = runs[runs["traffic"] == traffic].pivot(index="seed", columns="dist_type", values="max_over_mean")
    missing = [d for d in (first, second) if d not in rows]
    if missing:
        raise ValueError(f"dist_types {missing} not in the runs; they have {list(rows.columns)}")
    below, trials = int((rows[first] < rows[second]).sum()), int((rows[first] != rows[second]).sum())
    p_value = binomtest(below, trials).pvalue if trials else 1.0
    return {"first": first, "second": second, "first_below": below, "seeds": trials, "p_value": p_value}


def counted_placement(keys: torch.Tensor, world_size: int) -> list[int]:
    """Lookups per rank when keys go, by decreasing count, each to the rank with the fewest lookups so
    far (`embnb.balancing.partition.greedy_lpt` over the keys' counts, as it places samples)."""
    counts = _key_counts(keys).tolist()
    return [sum(counts[i] for i in part) for part in greedy_lpt(counts, world_size, equal_size=False)]


def pipeline_table(
    keys: torch.Tensor, table_sizes: Iterable[int], world_sizes: Iterable[int]
) -> pd.DataFrame:
    """Map `keys` into tables of each size (`into_table`, modulo and hash) and route the rows under
    `continuous` and `roundrobin` (after the mapping a key is a row: `continuous` cuts the table into
    blocks, `roundrobin` is `row % W`) at each world size. One row per (table_rows, into_table, world_size,
    dist_type): max/mean of rows looked up per rank; distinct ids, distinct rows they use, the share of
    the distinct ids whose row holds another id too, and that share had each id drawn its row at random
    (`1 - (1 - 1/rows) ** (ids - 1)`)."""
    distinct = torch.as_tensor(keys, dtype=torch.int64).unique()
    records = []
    for table_rows, how in itertools.product(table_sizes, ("modulo", "hash")):
        rows = into_table(keys, table_rows, how)
        used, ids_per_row = into_table(distinct, table_rows, how).unique(return_counts=True)
        sharing = int(ids_per_row[ids_per_row > 1].sum()) / max(distinct.numel(), 1)
        random_sharing = 1 - (1 - 1 / table_rows) ** (distinct.numel() - 1)
        for world_size, dist_type in itertools.product(world_sizes, ("continuous", "roundrobin")):
            counts = rank_counts(rows, world_size, dist_type, table_rows=table_rows)
            records.append(
                (table_rows, how, world_size, dist_type, max_over_mean(counts), distinct.numel())
                + (used.numel(), sharing, random_sharing)
            )
    columns = "table_rows into_table world_size dist_type max_over_mean distinct_ids rows_used"
    columns += " ids_sharing_a_row ids_sharing_a_row_random"
    return pd.DataFrame(records, columns=columns.split())


def _outcome(call) -> tuple[str, torch.Tensor | None]:
    try:
        return "returned", call()
    except Exception as error:  # the peer's own refusal is the result
        return f"raised {type(error).__name__}: {str(error).splitlines()[0][:120]}", None


def out_of_range_lookup(num_rows: int, bad_id: int, embedding_dim: int = 4) -> list[dict[str, str]]:
    """Look up the ids `[1, bad_id]` (one per bag) in a table of `num_rows` rows with torchrec's
    EmbeddingBagCollection and with FBGEMM's CPU TBE (under torchrec's fused tables) in both
    bounds-check modes; one `{"peer", "outcome"}` per run. A TBE run that returns says whether the bad
    id's bag equals row 0, and what it logged (C++ log lines without their "[E1125 ...] " prefix)."""
    import fbgemm_gpu
    import torchrec
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    if not 0 < num_rows <= bad_id:
        raise ValueError(f"bad_id must be >= num_rows > 0, got num_rows={num_rows}, bad_id={bad_id}")
    ids, offsets = torch.tensor([1, bad_id]), torch.tensor([0, 1, 2])
    config = torchrec.EmbeddingBagConfig(num_rows, embedding_dim, "t", feature_names=["f"])
    kjt = torchrec.KeyedJaggedTensor.from_offsets_sync(keys=["f"], values=ids, offsets=offsets)
    collection = torchrec.EmbeddingBagCollection(tables=[config])
    peer = f"torchrec {torchrec.__version__} EmbeddingBagCollection"
    runs = [{"peer": peer, "outcome": _outcome(lambda: collection(kjt))[0]}]
    for mode in (BoundsCheckMode.FATAL, BoundsCheckMode.WARNING):
        spec = [(num_rows, embedding_dim, EmbeddingLocation.HOST, ComputeDevice.CPU)]
        tbe = SplitTableBatchedEmbeddingBagsCodegen(spec, bounds_check_mode=mode)
        with native_stderr() as logged:  # WARNING mode logs from C++ straight to stderr
            outcome, pooled = _outcome(lambda tbe=tbe: tbe(ids, offsets))
        if pooled is not None:
            row_zero = tbe.split_embedding_weights()[0][0]
            outcome += f"; the bad id's bag equals row 0: {bool(torch.equal(pooled[1], row_zero))}"
        outcome += "".join(f"; logged: {line.split('] ', 1)[-1].strip()}" for line in logged)
        peer = f"FBGEMM {fbgemm_gpu.__version__} TBE (CPU), bounds_check_mode={mode.name}"
        runs.append({"peer": peer, "outcome": outcome})
    return runs

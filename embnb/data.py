"""Key streams that alias under `key % world_size` (`PATTERNS`, by name through `make_keys`), and Zipf
sequence lengths from the same sampler.

Every generator has the form `fn(num_keys, *, seed=0, ...)` and returns a 1-D torch.int64 tensor, the
same for the same arguments. No stream knows the world size it will be routed to: whatever aliasing
`key % W` shows is found in the stream, not built into it. Hashing spreads distinct keys but cannot
split one hot key, so it does NOT fix Zipf's skew (notebooks 01 and 01a).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from embnb._checks import check_int, check_number

ID_SPACE = 2**40  # large enough that random ids rarely collide
TWITTER_EPOCH_MS = 1_288_834_974_657
SNOWFLAKE_START_MS = 1_700_000_000_000 - TWITTER_EPOCH_MS  # ids minted 1.7e12 ms after the Unix epoch


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def uniform_ids(num_keys: int, *, seed: int = 0) -> torch.Tensor:
    """Ids uniform over [0, ID_SPACE)."""
    check_int("num_keys", num_keys, low=0)
    return torch.randint(0, ID_SPACE, (num_keys,), generator=_generator(seed), dtype=torch.int64)


def sequential_ids(num_keys: int, *, seed: int = 0, start: int = 0) -> torch.Tensor:
    """start, start+1, ...; `seed` is accepted for a uniform signature only."""
    check_int("num_keys", num_keys, low=0)
    return torch.arange(start, start + num_keys, dtype=torch.int64)


def strided_ids(num_keys: int, *, seed: int = 0, stride: int = 12, offset: int = 0) -> torch.Tensor:
    """k*stride + offset for random k: the ids one of `stride` interleaved
    allocators hands out (allocator `offset`), e.g. auto-increment with
    `auto_increment_increment = stride` in a multi-writer database."""
    check_int("num_keys", num_keys, low=0)
    check_int("stride", stride, low=1)
    check_int("offset", offset, low=0, high=stride - 1)
    k = torch.randint(0, ID_SPACE // stride, (num_keys,), generator=_generator(seed), dtype=torch.int64)
    return k * stride + offset


def tagged_ids(
    num_keys: int,
    *,
    seed: int = 0,
    tag_bits: int = 3,
    tags: tuple[int, ...] = (1, 2, 5),
) -> torch.Tensor:
    """(random << tag_bits) | tag, tag drawn uniformly from `tags`.

    With W a power of two <= 2**tag_bits, `key % W` sees only the tag, so at
    most len(tags) ranks get any key.
    """
    check_int("num_keys", num_keys, low=0)
    if not tags:
        raise ValueError("tags must not be empty")
    bad = [t for t in tags if not 0 <= t < 2**tag_bits]
    if bad:
        raise ValueError(f"tag {bad[0]} does not fit in tag_bits={tag_bits}")
    gen = _generator(seed)
    high = torch.randint(0, ID_SPACE >> tag_bits, (num_keys,), generator=gen, dtype=torch.int64)
    which = torch.randint(0, len(tags), (num_keys,), generator=gen)
    return (high << tag_bits) | torch.tensor(tags, dtype=torch.int64)[which]


def snowflake_ids(
    num_keys: int,
    *,
    seed: int = 0,
    ids_per_ms: float = 0.05,
    num_workers: int = 4,
) -> torch.Tensor:
    """Snowflake ids in creation order: ms << 22 | worker << 12 | sequence.

    Ids arrive as a Poisson stream of `ids_per_ms` per ms spread over
    `num_workers` workers; the 12-bit sequence counts ids made by one worker
    within one ms, so at low rates it is almost always 0.
    """
    check_int("num_keys", num_keys, low=0)
    check_number("ids_per_ms", ids_per_ms, low=0, high=1, low_open=True)
    check_int("num_workers", num_workers, low=1, high=1024)
    gen = _generator(seed)
    gaps = torch.empty(num_keys, dtype=torch.float64).exponential_(ids_per_ms, generator=gen)
    ms = SNOWFLAKE_START_MS + torch.cumsum(gaps, 0).floor().to(torch.int64)
    worker = torch.randint(0, num_workers, (num_keys,), generator=gen)
    # Sequence = position among earlier ids of the same (ms, worker): a run of the stably sorted groups.
    sorted_group, order = torch.sort(ms * 1024 + worker, stable=True)
    runs = torch.unique_consecutive(sorted_group, return_counts=True)[1]
    run_start = torch.repeat_interleave(torch.cumsum(runs, 0) - runs, runs)
    sequence = torch.empty(num_keys, dtype=torch.int64)
    sequence[order] = torch.arange(num_keys) - run_start
    # ids_per_ms <= 1 makes > 4096 ids in one ms practically impossible.
    return (ms << 22) | (worker << 12) | sequence


def zipf_probs(vocab_size: int, alpha: float) -> torch.Tensor:
    """P(rank k) proportional to k**-alpha for k = 1..vocab_size (float64)."""
    weights = torch.arange(1, vocab_size + 1, dtype=torch.float64).pow(-alpha)
    return weights / weights.sum()


ZIPF_CACHE_TABLES = 128  # tables whose CDF (and permutation) the process keeps, 8 bytes a row each: the
# steptime bench's 100 tables, drawn batch after batch, stay built


@functools.lru_cache(maxsize=ZIPF_CACHE_TABLES)
def zipf_cdf(support: int, alpha: float) -> torch.Tensor:
    """The CDF of `zipf_probs(support, alpha)` (float64), built once per (support, alpha) and kept
    (about 0.3 s and 80 MB for 10 M rows): every draw from one table reuses it. Read-only."""
    return torch.cumsum(zipf_probs(support, alpha), 0)


@functools.lru_cache(maxsize=ZIPF_CACHE_TABLES)
def _table_names(vocab_size: int, table_seed: int) -> torch.Tensor:
    """A table's fixed permutation of [0, vocab_size), from `table_seed` alone. Read-only."""
    return torch.randperm(vocab_size, generator=_generator(table_seed))


def _zipf_ranks(num: int, alpha: float, support: int, gen: torch.Generator) -> torch.Tensor:
    """THE Zipf sampler: `num` ranks in [0, support), P(k) ∝ (k + 1)**-alpha,
    by inverting the CDF of `zipf_probs` (cached per table: `zipf_cdf`) at
    uniform draws from `gen`."""
    cdf = zipf_cdf(support, float(alpha))
    uniform = torch.rand(num, generator=gen, dtype=torch.float64)
    return torch.searchsorted(cdf, uniform).clamp_(max=support - 1)


def zipf_ids(
    num_keys: int,
    *,
    seed: int = 0,
    alpha: float = 1.2,
    vocab_size: int = 100_000,
    table_seed: int | None = None,
) -> torch.Tensor:
    """Zipf(alpha) over vocab_size ids; a random permutation of [0, vocab_size)
    names the ranks, so the hottest id is not 0 and hot ids are not clustered.

    The hottest id alone carries zipf_probs(...)[0] of the traffic (about 0.2
    by default), so any routing has max/mean >= that share * world_size.

    The permutation is drawn from `seed` after the ranks (each call its own
    hot ids), or, with `table_seed`, from `table_seed` alone and kept per
    (vocab_size, table_seed): then every batch drawn for one table has the
    same hot ids, as a table's traffic has from step to step (what a cache of
    its rows sees). The CDF is kept per (vocab_size, alpha) (`zipf_cdf`).
    """
    check_int("num_keys", num_keys, low=0)
    check_int("vocab_size", vocab_size, low=1)
    check_number("alpha", alpha, low=0, low_open=True)
    gen = _generator(seed)
    popularity_rank = _zipf_ranks(num_keys, alpha, vocab_size, gen)
    if table_seed is None:
        names = torch.randperm(vocab_size, generator=gen)
    else:
        names = _table_names(vocab_size, check_int("table_seed", table_seed, low=0))
    return names[popularity_rank]


def zipf_lengths(num_samples: int, alpha: float = 1.5, max_length: int = 8192, seed: int = 0) -> torch.Tensor:
    """Sequence lengths with P(length = L) proportional to L**-alpha, L in
    [1, max_length] (int64). alpha=1.5: a third of the samples have length 1,
    and a few reach max_length: a heavy tail like user histories."""
    check_int("num_samples", num_samples, low=0)
    check_int("max_length", max_length, low=1)
    alpha = check_number("alpha", alpha, low=0, low_open=True)
    return _zipf_ranks(num_samples, alpha, max_length, _generator(seed)) + 1


PATTERNS: dict[str, Callable[..., torch.Tensor]] = {
    "uniform": uniform_ids,
    "sequential": sequential_ids,
    "strided": strided_ids,
    "tagged": tagged_ids,
    "snowflake": snowflake_ids,
    "zipf": zipf_ids,
}


def make_keys(pattern: str, num_keys: int, seed: int = 0, **options) -> torch.Tensor:
    """Keys of a named pattern; `options` go to the generator."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; valid patterns: {', '.join(PATTERNS)}")
    return PATTERNS[pattern](num_keys, seed=seed, **options)

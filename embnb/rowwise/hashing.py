"""The keyed hashes routing uses, on int64 tensors read as uint64 patterns: MurmurHash3's fmix64
(`hash_key`, dynamicemb's hash) and the Feistel bijection of `[0, N)` (`feistel_permutation`, the
`feistel_roundrobin` layout), as the native kernels compute them (embnb/cuda/bucketize_common.h)."""

from __future__ import annotations

import functools

import torch

from embnb._checks import check_int, check_int_tensor

__all__ = [
    "hash_key",
    "FEISTEL_ROUNDS",
    "feistel_round_keys",
    "feistel_half_bits",
    "feistel_permutation",
    "unsigned_mod",
]


# fmix64 constants 0xff51afd7ed558ccd and 0xc4ceb9fe1a85ec53 are above
# 2**63; int64 tensors hold them as the same bits, i.e. value - 2**64.
_FMIX_C1 = 0xFF51AFD7ED558CCD - (1 << 64)
_FMIX_C2 = 0xC4CEB9FE1A85EC53 - (1 << 64)
_LOW_31_BITS = (1 << 31) - 1


def hash_key(keys: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 fmix64 (no seed) of each key's unsigned 64-bit pattern.

    Returns int64 holding the hash's 64 bits (negative when bit 63 is set).
    int32 keys are sign-extended first: int32 -1 hashes like int64 -1.
    """
    x = check_int_tensor("keys", keys).to(torch.int64)
    # int64 multiply wraps like uint64; >> is arithmetic, so mask the bits
    # the sign extension shifted in to get a logical shift.
    x = x ^ ((x >> 33) & _LOW_31_BITS)
    x = x * _FMIX_C1
    x = x ^ ((x >> 33) & _LOW_31_BITS)
    x = x * _FMIX_C2
    x = x ^ ((x >> 33) & _LOW_31_BITS)
    return x


def unsigned_mod(x: torch.Tensor, m: int) -> torch.Tensor:
    """`x % m` with int64 `x` read as uint64 (x < 0 means x + 2**64)."""
    r = torch.remainder(x, m)  # floor mod: in [0, m) even for x < 0
    # (x + 2**64) % m == (x % m + 2**64 % m) % m
    return torch.where(x < 0, (r + (1 << 64) % m) % m, r)


FEISTEL_ROUNDS = 4


@functools.lru_cache(maxsize=8)
def feistel_round_keys(seed: int) -> torch.Tensor:
    """One 64-bit key per Feistel round, from the seed (int64 `[FEISTEL_ROUNDS]`). Made once per seed (a
    training step routes every batch) and shared by every caller: read it, never write it."""
    return hash_key(torch.arange(FEISTEL_ROUNDS, dtype=torch.int64) + seed * FEISTEL_ROUNDS + 1)


def _feistel(x: torch.Tensor, half_bits: int, keys: torch.Tensor) -> torch.Tensor:
    """A balanced Feistel permutation of [0, 4 ** half_bits)."""
    mask = (1 << half_bits) - 1
    left, right = x >> half_bits, x & mask
    for k in keys.tolist():
        left, right = right, left ^ (hash_key(right + k) & mask)
    return (left << half_bits) | right


def feistel_half_bits(n: int) -> int:
    """The least h >= 1 with 4 ** h >= n: the network's domain (`(n - 1).bit_length()` is
    ceil(log2(n)), exactly)."""
    return max(1, ((n - 1).bit_length() + 1) // 2)


def feistel_permutation(ids: torch.Tensor, num_embeddings: int, seed: int = 0) -> torch.Tensor:
    """A keyed bijection of [0, num_embeddings), applied to `ids` (int64 out).

    A Feistel network permutes [0, 4**h) with 4**h >= N; cycle walking
    (apply again while the result is >= N) restricts it to a bijection of
    [0, N). 4**h < 4 * N, so a walk takes under four steps on average.
    """
    n = check_int("num_embeddings", num_embeddings, low=1)
    half_bits = feistel_half_bits(n)
    keys = feistel_round_keys(check_int("seed", seed, low=0))
    out = _feistel(ids.to(torch.int64), half_bits, keys)
    outside = out >= n
    while bool(outside.any()):
        out[outside] = _feistel(out[outside], half_bits, keys)
        outside = out >= n
    return out

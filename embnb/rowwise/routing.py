"""Which rank owns a key (`owner_rank`), and a KeyedJaggedTensor's keys grouped by owner rank for the
row-wise all-to-all (`bucketize`). Row-wise sharding splits a table's rows over `world_size` (W) ranks;
the routing modes (`DistType`):

- `continuous`: torchrec/FBGEMM's blocks: rank r owns `[r * block_size, (r + 1) * block_size)`, keys
  past the last block go to `key % W`; the owner receives the local row.
- `roundrobin`: `key % W`: patterned ids (all multiples of W, tag bits in the low bits) alias onto one
  rank. Unbounded keys are sent as they are; a dense table's ids (in `[0, N)`: embnb's routed
  sharders) as the local row `key // W`.
- `hash_roundrobin`: `fmix64(key) % W`, the hash NVIDIA dynamicemb uses, so results compare; the key is
  sent.
- `feistel_roundrobin`: `p(key) % W` for a keyed bijection `p` of a table's `[0, N)`
  (`feistel_permutation`); the local row `p(key) // W` is sent (`embnb.rowwise.layout`).

The round-robin modes read a key as its unsigned 64-bit pattern, as dynamicemb does for int64 keys
(-1 is 2**64 - 1). int32 keys are sign-extended to int64 first, while dynamicemb's kernels (and FBGEMM)
read an int32 key as uint32, so NEGATIVE int32 keys route differently: `owner_rank` of int32 -1 at
W=7 is `(2**64 - 1) % 7 == 1` here and `(2**32 - 1) % 7 == 3` in dynamicemb. Use int64 keys (what
torchrec's KJTs carry) to compare with dynamicemb. `continuous` rejects negative keys.

`bucketize` runs the native kernels of embnb/cuda (CPU and CUDA); `bucketize(..., native=False)` is the
pure-torch reference they match bit for bit. For `continuous` both are bit-identical to FBGEMM's
`block_bucketize_sparse_features(..., sequence=True)`.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from embnb._checks import check_int, check_int_tensor
from embnb.cuda import loader
from embnb.rowwise.hashing import (
    feistel_permutation,
    feistel_round_keys,
    hash_key,
    unsigned_mod,
)

__all__ = [
    "DistType",
    "DIST_CODES",
    "KEY_MODES",
    "Bucketized",
    "hash_key",
    "feistel_round_keys",
    "owner_rank",
    "bucketize",
]


def parse_mode(kind: type[enum.Enum], name: str, value: Any) -> Any:
    """The member of the str enum `kind` whose value is `value` (a member passes as it is); a TypeError
    for a non-str, a ValueError naming the valid values (`name`: the argument's)."""
    if isinstance(value, kind):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a {kind.__name__} or str, got {type(value).__name__} {value!r}")
    try:
        return kind(value)
    except ValueError:
        valid = ", ".join(m.value for m in kind)
        raise ValueError(f"{name} {value!r} is not one of {valid}") from None


class DistType(str, enum.Enum):
    """Row-wise routing mode; the value is what a checkpoint stores."""

    CONTINUOUS = "continuous"
    ROUNDROBIN = "roundrobin"
    HASH_ROUNDROBIN = "hash_roundrobin"
    FEISTEL_ROUNDROBIN = "feistel_roundrobin"

    def __str__(self) -> str:  # "roundrobin", not "DistType.ROUNDROBIN"
        return self.value

    @classmethod
    def parse(cls, value: DistType | str) -> DistType:
        """Return the DistType for `value`; raise naming the valid values."""
        return parse_mode(cls, "dist_type", value)


# The modes that route keys of an unbounded space (a KV table's, dynamicemb's):
# feistel_roundrobin permutes the ids of a table of known rows.
KEY_MODES = (DistType.CONTINUOUS, DistType.ROUNDROBIN, DistType.HASH_ROUNDROBIN)


class Bucketized(NamedTuple):
    """Keys grouped by destination rank, KeyedJaggedTensor-style.

    lengths: `[world_size * num_features * batch]`, entry
        `(rank * num_features + f) * batch + b`.
    indices: what each rank receives, rank-major, then feature, then sample,
        input order kept inside a bucket.
    unbucketize_permute: `[len(input indices)]`; input key i sits at
        `indices[unbucketize_permute[i]]`, so `x[unbucketize_permute]`
        puts per-key results back in input order.
    weights: the per-key weights moved like the indices, or None.
    """

    lengths: torch.Tensor
    indices: torch.Tensor
    unbucketize_permute: torch.Tensor
    weights: torch.Tensor | None


def _route(
    keys: torch.Tensor,
    world_size: int,
    dist_type: DistType,
    block_size: torch.Tensor | int | None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(owner rank, id sent to the owner) per int64 key; inputs checked.
    `block_size`: continuous features' block size; for feistel_roundrobin
    the table's num_embeddings (one int: one table); for roundrobin a dense
    table's rows (any value > 0: local rows sent) or 0/None (keys sent)."""
    if dist_type is DistType.FEISTEL_ROUNDROBIN:
        permuted = feistel_permutation(keys, block_size, seed)
        return permuted % world_size, permuted // world_size
    if dist_type is DistType.ROUNDROBIN:
        return unsigned_mod(keys, world_size), keys // world_size if block_size else keys
    if dist_type is DistType.HASH_ROUNDROBIN:
        return unsigned_mod(hash_key(keys), world_size), keys
    # continuous: `key // block_size < W` is `key < block_size * W` without
    # the product overflowing int64 (keys >= 0, block_size > 0).
    block = keys // block_size
    in_blocks = block < world_size
    owner = torch.where(in_blocks, block, keys % world_size)
    local = torch.where(in_blocks, keys - block * block_size, keys // world_size)
    return owner, local


def _check_keys(keys: torch.Tensor, mode: DistType, where: str, num_embeddings: int | None = None) -> None:
    """Raise naming the first key below 0 (continuous), or outside [0, num_embeddings) (a table's)."""
    outside = (keys < 0) if num_embeddings is None else (keys < 0) | (keys >= num_embeddings)
    if keys.numel() and bool(outside.any()):
        allowed = ">= 0" if num_embeddings is None else f"in [0, {num_embeddings})"
        raise ValueError(f"{mode.value} routing needs keys {allowed}, got key {int(keys[outside][0])}{where}")


# The modes that read a table's rows: feistel_roundrobin always, roundrobin for a dense table.
_TABLE_MODES = (DistType.FEISTEL_ROUNDROBIN, DistType.ROUNDROBIN)


def owner_rank(
    keys: torch.Tensor,
    world_size: int,
    dist_type: DistType | str,
    block_size: int | None = None,
    *,
    num_embeddings: int | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """Owner rank (int64) of each key under one routing mode.

    continuous: `key // block_size` for `key < block_size * world_size`,
    else `key % world_size`. roundrobin: `key % world_size` on the uint64
    pattern (given `num_embeddings`, a dense table: keys in [0, N)).
    hash_roundrobin: `hash_key(key) % world_size`, unsigned.
    feistel_roundrobin: `feistel_permutation(key, num_embeddings, seed) %
    world_size`, keys in [0, num_embeddings).
    int32 keys are sign-extended first: a negative int32 key gets another
    owner than in dynamicemb, which reads it as uint32 (module docstring).
    """
    keys = check_int_tensor("keys", keys).to(torch.int64)
    world_size = check_int("world_size", world_size, low=1)
    mode = DistType.parse(dist_type)
    if mode is DistType.CONTINUOUS:
        if block_size is None:
            raise ValueError("continuous routing needs a block_size, got None")
        block_size = check_int("block_size", block_size, low=1)
        _check_keys(keys, mode, "")
    if mode is DistType.FEISTEL_ROUNDROBIN and num_embeddings is None:
        raise ValueError("feistel_roundrobin routing needs num_embeddings, got None")
    if mode in _TABLE_MODES and num_embeddings is not None:
        block_size = check_int("num_embeddings", num_embeddings, low=1)
        _check_keys(keys, mode, "", block_size)
    return _route(keys, world_size, mode, block_size, check_int("seed", seed, low=0))[0]


def _per_feature_modes(
    dist_type: DistType | str | Sequence[DistType | str],
) -> DistType | list[DistType]:
    if isinstance(dist_type, (str, DistType)):
        return DistType.parse(dist_type)
    if isinstance(dist_type, Sequence):
        return [DistType.parse(d) for d in dist_type]
    raise TypeError(
        f"dist_type must be a DistType, str or a list of them, got {type(dist_type).__name__} {dist_type!r}"
    )


def _block_size_list(
    block_sizes: torch.Tensor | Sequence[int] | None, name: str = "block_sizes"
) -> list[int] | None:
    if block_sizes is None:
        return None
    if isinstance(block_sizes, torch.Tensor):
        block_sizes = check_int_tensor(name, block_sizes, dim=None).reshape(-1).tolist()
    return [check_int(f"{name}[{i}]", b) for i, b in enumerate(block_sizes)]


def _resolve_num_features(
    num_features: int | None,
    modes: DistType | list[DistType],
    sizes: list[int] | None,
    tables: list[int] | None = None,
) -> tuple[int, str]:
    """(count, where it came from): explicit, a per-feature list, else 1."""
    if num_features is not None:
        check_int("num_features", num_features, low=1)
    per_feature = {"len(block_sizes)": sizes, "len(num_embeddings)": tables, "len(dist_type)": modes}
    candidates = [("num_features", num_features)] if num_features is not None else []  # (where, count)
    candidates += [(name, len(v)) for name, v in per_feature.items() if isinstance(v, list)]
    if not candidates:
        return 1, "default for one dist_type and no per-feature list"
    name0, count0 = candidates[0]
    for name, count in candidates[1:]:
        if count != count0:
            raise ValueError(f"{name} is {count} but {name0} is {count0}: one entry per feature is required")
    if count0 < 1:
        raise ValueError(f"{name0} must be >= 1, got {count0}")
    return count0, name0


def _route_by_feature(
    keys: torch.Tensor, feature: torch.Tensor, args: _Args
) -> tuple[torch.Tensor, torch.Tensor]:
    """(owner, id sent) per key, each key routed by its feature's mode: one pass when every feature has
    one mode and reads no table's rows, else one pass per feature."""
    modes, world_size = args.modes, args.world_size
    tables = args.tables or [0] * len(modes)
    if len(set(modes)) == 1 and not (modes[0] in _TABLE_MODES and any(tables)):
        block_size = None
        if modes[0] is DistType.CONTINUOUS:
            block_size = torch.tensor(args.sizes, device=feature.device)[feature]
        return _route(keys, world_size, modes[0], block_size)
    owner, local = torch.empty_like(keys), torch.empty_like(keys)
    for f, mode in enumerate(modes):
        mask = feature == f
        entry = args.sizes[f] if mode is DistType.CONTINUOUS else tables[f]  # 0: unbounded keys
        owner[mask], local[mask] = _route(keys[mask], world_size, mode, entry, args.seed)
    return owner, local


class _Args(NamedTuple):
    """bucketize's arguments after the checks that need no data."""

    lengths: torch.Tensor
    indices: torch.Tensor
    world_size: int
    modes: list[DistType]
    sizes: list[int] | None
    batch: int
    weights: torch.Tensor | None
    tables: list[int] | None  # num_embeddings per feature (feistel_roundrobin, dense roundrobin tables)
    seed: int


def bucketize(
    lengths: torch.Tensor,
    indices: torch.Tensor,
    world_size: int,
    dist_type: DistType | str | Sequence[DistType | str],
    block_sizes: torch.Tensor | Sequence[int] | None = None,
    *,
    num_features: int | None = None,
    weights: torch.Tensor | None = None,
    native: bool | None = None,
    num_embeddings: Sequence[int] | None = None,
    seed: int = 0,
) -> Bucketized:
    """Group a KJT's keys by owner rank, as the row-wise all-to-all sends them.

    lengths: `[num_features * batch]`, feature-major (`KJT.lengths()`).
    indices: the keys, concatenated in the same order.
    dist_type: one mode for all features, or one per feature.
    block_sizes: one per feature; read only for continuous features, and
        required when there is one.
    num_features: defaults to len(block_sizes) or len(dist_type) when given
        per feature, else 1 (then batch = len(lengths)).
    weights: optional per-key weights, moved with their keys.
    num_embeddings: one per feature, its table's rows; read for
        feistel_roundrobin features (required when there is one) and for
        roundrobin ones, where a positive entry makes the table dense (the
        owner receives the local row `key // world_size`) and 0 leaves keys
        unbounded (sent as they are). Keys of a table must lie in
        [0, num_embeddings).
    seed: the key of feistel_roundrobin's bijection (`feistel_round_keys`).
    native: None runs the native kernels (`torch.ops.embnb.bucketize`,
        built on first use by embnb.cuda.loader) and falls back to the
        pure-torch reference, with one warning, when they cannot be built
        (or, on a GPU, were built without CUDA); True raises instead; False
        runs the pure-torch reference. All give bit-identical results.

    Output lengths keep the dtype of `lengths`; indices and
    unbucketize_permute keep the dtype of `indices` (as FBGEMM does).
    """
    args = _check_args(
        lengths, indices, world_size, dist_type, block_sizes, num_features, weights, num_embeddings, seed
    )
    if not loader.use(native):
        return _bucketize_reference(args)
    device = args.indices.device
    if device.type != "cpu" and not loader.load().cuda:
        message = (
            f"embnb: the native extension was built without CUDA kernels, so bucketize on {device} "
            f"tensors runs the pure-torch reference (same results)"
        )
        if native:
            raise loader.NativeUnavailable(message)
        global _warned_no_cuda
        if not _warned_no_cuda:
            _warned_no_cuda = True
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return _bucketize_reference(args)
    codes = [DIST_CODES[m] for m in args.modes]
    # the kernel's per-feature entry: a continuous feature's block size, a table's rows (0: unbounded keys)
    entry = {DistType.CONTINUOUS: args.sizes, DistType.FEISTEL_ROUNDROBIN: args.tables}
    if args.tables is not None:
        entry[DistType.ROUNDROBIN] = args.tables
    blocks = [entry[m][f] if m in entry else 0 for f, m in enumerate(args.modes)]
    keys = feistel_round_keys(args.seed) if DistType.FEISTEL_ROUNDROBIN in args.modes else None
    out = torch.ops.embnb.bucketize(
        args.lengths,
        args.indices,
        args.world_size,
        codes,
        blocks,
        args.weights,
        keys,
    )
    return Bucketized(*out)


_warned_no_cuda = False
DIST_CODES = {mode: code for code, mode in enumerate(DistType)}  # torch.ops.embnb.bucketize's codes


def _check_args(
    lengths, indices, world_size, dist_type, block_sizes, num_features, weights, num_embeddings, seed
) -> _Args:
    """Checks that need no data; the kernels check lengths and keys."""
    lengths = check_int_tensor("lengths", lengths)
    indices = check_int_tensor("indices", indices)
    world_size = check_int("world_size", world_size, low=1)
    seed = check_int("seed", seed, low=0)
    modes = _per_feature_modes(dist_type)
    sizes = _block_size_list(block_sizes)
    tables = _block_size_list(num_embeddings, "num_embeddings")
    num_features, source = _resolve_num_features(num_features, modes, sizes, tables)
    if isinstance(modes, DistType):
        modes = [modes] * num_features

    num_segments = lengths.numel()
    if num_segments % num_features:
        raise ValueError(
            f"len(lengths) is {num_segments}, not a multiple of num_features={num_features} ({source})"
        )
    num_keys = indices.numel()
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or weights.shape[:1] != (num_keys,):
            shape = getattr(weights, "shape", type(weights).__name__)
            raise ValueError(f"weights must be a tensor with {num_keys} rows (one per key), got {shape}")
    continuous = [f for f, m in enumerate(modes) if m is DistType.CONTINUOUS]
    if continuous and sizes is None:
        raise ValueError(
            f"block_sizes is None but features {continuous} are continuous: give one block size per feature"
        )
    for f in continuous:
        if sizes[f] < 1:
            raise ValueError(f"block_sizes[{f}] is {sizes[f]}; continuous features need block sizes >= 1")
    feistel = [f for f, m in enumerate(modes) if m is DistType.FEISTEL_ROUNDROBIN]
    if feistel and tables is None:
        raise ValueError(
            f"num_embeddings is None but features {feistel} are feistel_roundrobin: give each feature's "
            f"table rows"
        )
    for f, mode in enumerate(modes):
        if mode is DistType.ROUNDROBIN and tables is not None and tables[f] < 0:
            raise ValueError(
                f"num_embeddings[{f}] is {tables[f]}; a roundrobin feature's entry is its dense table's "
                f"rows, or 0 for unbounded keys"
            )
    for f in feistel:
        if not 1 <= tables[f] <= 1 << 62:
            raise ValueError(
                f"num_embeddings[{f}] is {tables[f]}; feistel_roundrobin features need num_embeddings "
                f"in [1, 2**62]"
            )
        if indices.dtype == torch.int32 and tables[f] > 1 << 31:
            raise ValueError(
                f"num_embeddings[{f}] is {tables[f]}: int32 indices take feistel_roundrobin tables of at "
                f"most 2**31 rows (the local rows sent have the indices' dtype)"
            )
    batch = num_segments // num_features
    return _Args(lengths, indices, world_size, modes, sizes, batch, weights, tables, seed)


def _bucketize_reference(args: _Args) -> Bucketized:
    """The pure-torch reference, on the device of `indices` (plain torch ops,
    so on a GPU it is the torch-native peer the benchmark times)."""
    lengths, indices, world_size, modes, sizes, batch, weights, tables, _ = args
    device = indices.device
    lengths = lengths.to(device)
    weights = None if weights is None else weights.to(device)
    num_segments = lengths.numel()
    if num_segments and bool((lengths < 0).any()):
        pos = int(torch.nonzero(lengths < 0)[0])
        raise ValueError(f"lengths must be >= 0, got {int(lengths[pos])} at position {pos}")
    num_keys = indices.numel()
    total = int(lengths.sum()) if num_segments else 0
    if total != num_keys:
        raise ValueError(f"lengths sum to {total} but indices has {num_keys} keys")
    continuous = [f for f, m in enumerate(modes) if m is DistType.CONTINUOUS]

    # Per key: its segment (f * batch + b) and feature; route in int64.
    segment = torch.repeat_interleave(
        torch.arange(num_segments, device=device),
        lengths.to(torch.int64),
        output_size=num_keys,
    )
    feature = segment // batch if batch else segment
    keys = indices.to(torch.int64)
    if continuous:
        is_continuous = torch.tensor([m is DistType.CONTINUOUS for m in modes], device=device)
        where = f" (features {continuous} are continuous)"
        _check_keys(keys[is_continuous[feature]], DistType.CONTINUOUS, where)
    for f, mode in enumerate(modes):
        if mode in _TABLE_MODES and tables and tables[f]:
            where = f" (feature {f} is {mode.value} with num_embeddings {tables[f]})"
            _check_keys(keys[feature == f], mode, where, tables[f])
    owner, local = _route_by_feature(keys, feature, args)

    # Bucket (rank, f, b) sits at rank * num_segments + segment. A stable
    # sort keeps input order inside each bucket, as FBGEMM's sequence mode.
    bucket = owner * num_segments + segment
    order = torch.sort(bucket, stable=True).indices
    new_lengths = torch.bincount(bucket, minlength=world_size * num_segments)
    permute = torch.empty_like(order)
    permute[order] = torch.arange(num_keys, device=device)
    return Bucketized(
        lengths=new_lengths.to(lengths.dtype),
        indices=local[order].to(indices.dtype),
        unbucketize_permute=permute.to(indices.dtype),
        weights=None if weights is None else weights[order],
    )

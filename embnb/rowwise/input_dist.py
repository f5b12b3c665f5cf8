"""The routed sharders' input distribution (`RoutedFeaturesDist`): torchrec's row-wise one
(`RwSparseFeaturesDist`) with FBGEMM's `block_bucketize_sparse_features` (continuous blocks only)
replaced by `embnb.rowwise.bucketize`, which routes each feature by its table's layout in one pass and
sends the local row each rank looks up; then torchrec's one `KJTAllToAll`. Its splits carry the first id
outside its table a rank found (`IdCheckedAllToAll`), so every rank raises before any id is sent, where
torchrec's own row-wise sharding looks such an id up in another id's row, silently (docs/sharders.md,
"Edge batches").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist
from torchrec.distributed.dist_data import KJTAllToAll, KJTAllToAllSplitsAwaitable
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb import _torchrec_private as private
from embnb.cuda import loader
from embnb.rowwise.layout import Routing, TableLayout
from embnb.rowwise.routing import Bucketized, DistType, bucketize

__all__ = ["RoutedFeaturesDist", "IdCheckedAllToAll", "OutsideId"]


class OutsideId(NamedTuple):
    """An id outside its table: the feature's position in the sharding, and the id."""

    feature: int
    key: int


_CHUNK_BITS, _CHUNKS = 22, 3  # an id's 64 bits as three non-negative chunks below 2**22


def _rows_of(outside: OutsideId | None, world_size: int) -> list[list[int]]:
    """The rows `outside` adds to the splits all-to-all, one entry per destination rank: the feature
    + 1 (0: every id in range), then the id's 64 bits in chunks (torchrec reads a split row as sizes:
    no entry is negative or past int32)."""
    if outside is None:
        return [[0] * world_size for _ in range(1 + _CHUNKS)]
    bits = outside.key & ((1 << 64) - 1)
    chunks = [(bits >> (_CHUNK_BITS * i)) & ((1 << _CHUNK_BITS) - 1) for i in range(_CHUNKS)]
    return [[value] * world_size for value in (outside.feature + 1, *chunks)]


def _outside_of(column: Sequence[int]) -> OutsideId | None:
    """The `OutsideId` one source rank sent (its entries of the added rows), or None."""
    if not column[0]:
        return None
    bits = sum(int(c) << (_CHUNK_BITS * i) for i, c in enumerate(column[1:]))
    return OutsideId(int(column[0]) - 1, bits - (1 << 64) if bits >= 1 << 63 else bits)


class _IdCheckedSplits(KJTAllToAllSplitsAwaitable):
    """torchrec's splits all-to-all with `_rows_of(outside)` after its rows (torchrec's tensor
    all-to-all zips its rows with the tensors it sends, so the rows added are never read as sizes);
    its wait raises `error([(rank, OutsideId), ...])` on every rank when a rank sent one, before
    torchrec sends any id."""

    def __init__(self, outside: OutsideId | None, error, **kwargs) -> None:
        self._added_at = len(kwargs["tensor_splits"])
        self._own = outside
        self._error = error
        self._world = kwargs["pg"].size()
        kwargs["tensor_splits"] = [*kwargs["tensor_splits"], *_rows_of(outside, self._world)]
        super().__init__(**kwargs)

    def _wait_impl(self):
        if self._world > 1:
            rows = private.received_splits(self)[self._added_at : self._added_at + 1 + _CHUNKS]
            sent = [_outside_of(column) for column in zip(*rows)]
        else:
            sent = [self._own]
        bad = [(rank, outside) for rank, outside in enumerate(sent) if outside is not None]
        if bad:
            raise self._error(bad)
        return super()._wait_impl()


class IdCheckedAllToAll(KJTAllToAll):
    """torchrec's KJTAllToAll whose first collective (the splits) also carries the id outside its
    table that the sending rank found, if any: then every rank raises the same error before the
    ids are sent.

    Args:
        pg: the process group.
        splits: how many features go to each rank (torchrec's `splits`).
        error: `error(bad)` builds the exception from `[(rank, OutsideId), ...]`, every rank that
            sent one, in rank order.
    """

    def __init__(self, pg: dist.ProcessGroup, splits: list[int], error) -> None:
        super().__init__(pg, splits)
        self._group = pg
        self._features_per_rank = list(splits)
        self._error = error

    def forward(self, input: KeyedJaggedTensor, outside: OutsideId | None = None) -> _IdCheckedSplits:
        """As torchrec's forward; `outside` rides in the splits all-to-all."""
        with torch.no_grad():
            rank = dist.get_rank(self._group)
            first = sum(self._features_per_rank[:rank])
            return _IdCheckedSplits(
                outside,
                self._error,
                pg=self._group,
                input=input,
                splits=self._features_per_rank,
                labels=input.dist_labels(),
                tensor_splits=input.dist_splits(self._features_per_rank),
                input_tensors=input.dist_tensors(),
                keys=input.keys()[first : first + self._features_per_rank[rank]],
                device=input.device(),
                stagger=1,
            )


class RoutedFeaturesDist(RwSparseFeaturesDist):
    """torchrec's row-wise input distribution, bucketing by each feature's table layout.

    Args:
        pg: the sharding's process group (its size is the layouts' world size).
        features: the sharding's feature names, in the order its KJTs hold them.
        layouts: the table layout of each feature (same order).
        device: where torchrec keeps its buffers.
        is_sequence: an EmbeddingCollection's sharding: keep the unbucketize permute.
        tables: the table each feature is looked up in (same order; a feature read by two tables
            appears twice), for error messages.

    An id outside its table's `[0, num_embeddings)` raises a ValueError on every rank, naming the
    feature, table, id and the rank that holds it, before any id is sent (`IdCheckedAllToAll`; its
    cost: docs/sharders.md).
    """

    def __init__(
        self,
        pg: dist.ProcessGroup,
        features: Sequence[str],
        layouts: Sequence[TableLayout],
        device: torch.device | None = None,
        is_sequence: bool = False,
        tables: Sequence[str] | None = None,
    ) -> None:
        super().__init__(
            pg=pg,
            num_features=len(layouts),
            feature_hash_sizes=[layout.storage_rows for layout in layouts],
            device=device,
            is_sequence=is_sequence,
        )
        self._world = pg.size()
        self._all_to_all = IdCheckedAllToAll(pg, [len(layouts)] * self._world, self._outside_error)
        self._sequence = is_sequence
        seeds = {layout.seed for layout in layouts if layout.routing is Routing.FEISTEL_ROUNDROBIN}
        if len(seeds) > 1 or any(layout.world_size != self._world for layout in layouts):
            raise ValueError(
                f"one process group of {self._world} ranks and one seed route all features; got "
                f"world sizes {sorted({la.world_size for la in layouts})} and seeds {sorted(seeds)}"
            )
        self._features = list(features)
        self._tables = list(tables) if tables is not None else None
        self.layouts = tuple(layouts)
        # each routing's bucketize mode of one name: given num_embeddings, it sends the local rows
        self._modes = [DistType(layout.routing.value) for layout in layouts]
        self._block_sizes = [layout.block_size for layout in layouts]
        self._num_embeddings = [layout.num_embeddings for layout in layouts]
        self._seed = seeds.pop() if seeds else 0
        # the native kernels where they are built (`make setup`, `python -m embnb.cuda build`): nothing
        # compiles inside a training step; else the pure-torch reference, with one warning
        self._native = None if loader.use(None, build=False) else False

    def outside_id(self, sparse_features: KeyedJaggedTensor) -> OutsideId | None:
        """The first id (by feature, then position) outside its table's rows, or None: each
        feature's smallest and largest id, read in one device-to-host copy."""
        values = sparse_features.values()
        counts = sparse_features.length_per_key()
        parts = [(f, part) for f, part in enumerate(values.split(counts)) if part.numel()]
        if not parts:
            return None
        ends = torch.stack([end for _, part in parts for end in (part.min(), part.max())]).tolist()
        for (f, part), low, high in zip(parts, ends[::2], ends[1::2]):
            rows = self._num_embeddings[f]
            if low < 0 or high >= rows:
                return OutsideId(f, int(part[(part < 0) | (part >= rows)][0]))
        return None

    def _outside_error(self, bad: list[tuple[int, OutsideId]]) -> ValueError:
        rank, (f, key) = bad[0]
        table = f" of table {self._tables[f]!r}" if self._tables else ""
        routing = self.layouts[f].routing.value
        also = f"; ranks {[r for r, _ in bad]} hold ids outside their tables" if len(bad) > 1 else ""
        return ValueError(
            f"feature {self._features[f]!r}{table}: {routing} routing needs keys in "
            f"[0, {self._num_embeddings[f]}), got key {key} on rank {rank}{also} (every rank raises "
            f"this, before any id is sent)"
        )

    def bucketize_features(self, sparse_features: KeyedJaggedTensor) -> Bucketized:
        """Each feature's ids bucketed by owner rank, as the local rows the owner looks up. A variable
        batch per feature (torchrec's VBE) is padded to the largest with empty bags, which move no id,
        and they are dropped from the lengths after."""
        lengths, kept = sparse_features.lengths(), None
        if sparse_features.variable_stride_per_key():
            strides = sparse_features.stride_per_key()
            kept = (
                torch.arange(max(strides), device=lengths.device)
                < torch.tensor(strides, device=lengths.device)[:, None]
            )  # [F, max B]
            padded = lengths.new_zeros(kept.shape)
            padded[kept] = lengths
            lengths = padded.view(-1)
        out = bucketize(  # every id is in its table: forward replaced the others first
            lengths,
            sparse_features.values(),
            self._world,
            self._modes,
            self._block_sizes,
            weights=sparse_features.weights_or_none(),
            num_embeddings=self._num_embeddings,
            seed=self._seed,
            native=self._native,
        )
        if kept is None:
            return out
        return out._replace(lengths=out.lengths.view(self._world, *kept.shape)[:, kept].reshape(-1))

    def forward(self, sparse_features: KeyedJaggedTensor):
        """Bucketize, then torchrec's KJT all-to-all (an awaitable of an awaitable, as torchrec's),
        its splits carrying the first id outside its table, if any (then the ids bucketed are in
        range, and every rank raises when it waits for the splits)."""
        outside = self.outside_id(sparse_features)
        if outside is not None:  # each id outside its table bucketed as 0: none is sent
            values, counts = sparse_features.values(), sparse_features.length_per_key()
            rows = torch.tensor(self._num_embeddings, device=values.device)
            bound = torch.repeat_interleave(rows, torch.tensor(counts, device=rows.device))
            inside = torch.where((values < 0) | (values >= bound), 0, values)
            sparse_features = _like(sparse_features, inside, sparse_features.weights_or_none())
        out = self.bucketize_features(sparse_features)
        self.unbucketize_permute_tensor = out.unbucketize_permute if self._sequence else None
        bucketized = _like(sparse_features, out.indices, out.weights, out.lengths, self._world)
        return self._all_to_all(bucketized, outside)


def _like(
    features: KeyedJaggedTensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
    lengths: torch.Tensor | None = None,
    copies: int = 1,
) -> KeyedJaggedTensor:
    """A KJT of `features`' keys and batch sizes, `copies` times over (one per rank, as torchrec's
    bucketize_kjt_before_all2all builds it), holding `values`, `weights` and `lengths` (default:
    `features`' lengths)."""
    variable = features.variable_stride_per_key()
    return KeyedJaggedTensor(
        keys=features.keys() * copies,
        values=values,
        weights=weights,
        lengths=features.lengths() if lengths is None else lengths,
        stride=None if variable else features.stride(),
        stride_per_key_per_rank=features.stride_per_key_per_rank() * copies if variable else None,
    )

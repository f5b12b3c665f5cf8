"""The routed sharders' input distribution: embnb's bucketize, then torchrec's one KJT all-to-all.

torchrec's row-wise input distribution (`RwSparseFeaturesDist`) buckets ids with FBGEMM's
`block_bucketize_sparse_features` (continuous blocks only) and sends them in one `KJTAllToAll`.
`RoutedFeaturesDist` is that class with the bucketing replaced: `embnb.rowwise.bucketize` (the
native kernel, CPU or CUDA) routes each feature by its table's layout in one pass and sends the
local row each rank looks up: `continuous` as torchrec, `roundrobin` a dense table's `id // W`,
`feistel_roundrobin` `p(id) // W`. The all-to-all, and for sequence tables the unbucketize
permute torchrec's output distribution reads, are torchrec's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embnb import _torchrec_private as private
from embnb.cuda import loader
from embnb.rowwise.layout import Routing, TableLayout
from embnb.rowwise.routing import Bucketized, DistType, bucketize

__all__ = ["RoutedFeaturesDist"]

_DIST_TYPE = {  # the bucketize mode that sends each routing's local rows (num_embeddings given)
    Routing.CONTINUOUS: DistType.CONTINUOUS,
    Routing.ROUNDROBIN: DistType.ROUNDROBIN,
    Routing.FEISTEL_ROUNDROBIN: DistType.FEISTEL_ROUNDROBIN,
}


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
        self._all_to_all = private.row_wise_dist_parts(self)[0]  # torchrec's KJTAllToAll, as built
        self._world = pg.size()
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
        self._modes = [_DIST_TYPE[layout.routing] for layout in layouts]
        self._block_sizes = [layout.block_size for layout in layouts]
        self._num_embeddings = [layout.num_embeddings for layout in layouts]
        self._seed = seeds.pop() if seeds else 0
        # the native kernels where they are built (`make setup`, `python -m embnb.cuda build`): nothing
        # compiles inside a training step; else the pure-torch reference, with one warning
        self._native = None if loader.use(None, build=False) else False

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
        try:
            out = bucketize(
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
        except ValueError as error:  # the kernel names a feature by its position: add its name
            where = re.search(r"\(feature (\d+) ", str(error))
            if where is None:
                name = f"features {self._features}"
            else:
                i = int(where[1])
                table = f" of table {self._tables[i]!r}" if self._tables else ""
                name = f"feature {self._features[i]!r}{table}"
            raise ValueError(f"{name}: {error}") from None
        if kept is None:
            return out
        return out._replace(lengths=out.lengths.view(self._world, *kept.shape)[:, kept].reshape(-1))

    def forward(self, sparse_features: KeyedJaggedTensor):
        """Bucketize, then torchrec's KJT all-to-all (an awaitable of an awaitable, as torchrec's)."""
        out = self.bucketize_features(sparse_features)
        self.unbucketize_permute_tensor = out.unbucketize_permute if self._sequence else None
        variable = sparse_features.variable_stride_per_key()
        bucketized = KeyedJaggedTensor(  # as torchrec's bucketize_kjt_before_all2all builds it
            keys=sparse_features.keys() * self._world,
            values=out.indices,
            weights=out.weights,
            lengths=out.lengths,
            stride=None if variable else sparse_features.stride(),
            stride_per_key_per_rank=sparse_features.stride_per_key_per_rank() * self._world
            if variable
            else None,
        )
        return self._all_to_all(bucketized)

"""Batches a real loader produces that torchrec's row-wise modules stop on, and what the routed modules
do with them instead (docs/sharders.md, "Edge batches"; torchrec 1.8.0 and 1.6.1, gloo on CPU):

- **A rank with no samples** (a KeyedJaggedTensor of stride 0): torchrec fails on it on that rank alone
  (`KeyedJaggedTensor.to_dict`: "IndexError: tuple index out of range"; an EBC with a mean-pooled table
  before its input all-to-all, so the other ranks wait there). The routed modules send it as one sample
  with no ids (`one_empty_sample`) and cut the output back to 0 samples (`no_samples`).
- **Ranks of different batch sizes, an EmbeddingBagCollection's backward on gloo**: the backward of
  torchrec's row-wise reduce-scatter all-gathers blocks of each rank's batch size, which gloo refuses
  ("ProcessGroupGloo::allgather: invalid tensor size"). `EvenRwPooledEmbeddingDist` pads each block to
  the largest batch first (the padding rows are copied and sent); other backends keep torchrec's path.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchrec.distributed.embedding_sharding import EmbeddingShardingContext
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingDist
from torchrec.distributed.types import Awaitable
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__all__ = ["EvenRwPooledEmbeddingDist", "has_no_samples", "one_empty_sample", "no_samples"]


def has_no_samples(features: object) -> bool:
    """Whether `features` is a KeyedJaggedTensor of no samples (stride 0, one batch for all keys)."""
    return (
        isinstance(features, KeyedJaggedTensor)
        and not features.variable_stride_per_key()
        and features.stride() == 0
    )


def one_empty_sample(features: KeyedJaggedTensor) -> KeyedJaggedTensor:
    """`features` (no samples) as one sample whose bags are all empty: it looks up no row."""
    lengths = features.lengths()
    return KeyedJaggedTensor(
        keys=features.keys(),
        values=features.values(),
        weights=features.weights_or_none(),
        lengths=torch.zeros(len(features.keys()), dtype=lengths.dtype, device=lengths.device),
        stride=1,
    )


def no_samples(output: KeyedTensor | dict[str, JaggedTensor]) -> KeyedTensor | dict[str, JaggedTensor]:
    """The output of `one_empty_sample`'s batch cut to 0 samples: an EmbeddingBagCollection's
    KeyedTensor of 0 rows, or an EmbeddingCollection's JaggedTensors of 0 samples."""
    if isinstance(output, KeyedTensor):
        return KeyedTensor(
            keys=output.keys(),
            length_per_key=output.length_per_key(),
            values=output.values()[:0],
            key_dim=output.key_dim(),
        )
    return {
        key: JaggedTensor(values=jt.values(), lengths=jt.lengths()[:0], weights=jt.weights_or_none())
        for key, jt in output.items()
    }


class EvenRwPooledEmbeddingDist(RwPooledEmbeddingDist):
    """torchrec's row-wise reduce-scatter of pooled embeddings; on gloo, when the ranks' batch sizes
    differ, each rank's block is padded to the largest batch first, so that the backward gathers
    equal blocks (gloo's all-gather refuses blocks of different sizes).

    Args: as torchrec's `RwPooledEmbeddingDist` (the process group, the embedding dims, the
    quantized-comms codecs).
    """

    def __init__(self, pg: dist.ProcessGroup, embedding_dims: list[int], qcomm_codecs_registry=None):
        super().__init__(pg, embedding_dims=embedding_dims, qcomm_codecs_registry=qcomm_codecs_registry)
        self._pads = dist.get_backend(pg) == "gloo"
        self._rank = pg.rank()

    def forward(
        self, local_embs: torch.Tensor, sharding_ctx: EmbeddingShardingContext | None = None
    ) -> Awaitable[torch.Tensor]:
        sizes = None if sharding_ctx is None else sharding_ctx.batch_size_per_rank
        if not self._pads or not sizes or sharding_ctx.variable_batch_per_feature or len(set(sizes)) == 1:
            return super().forward(local_embs, sharding_ctx)
        largest = max(sizes)
        blocks = local_embs.split(sizes)
        padded = torch.cat([F.pad(block, (0, 0, 0, largest - block.shape[0])) for block in blocks])
        even = copy.copy(sharding_ctx)
        even.batch_size_per_rank = [largest] * len(sizes)
        awaitable = super().forward(padded, even)
        mine = sizes[self._rank]
        awaitable.callbacks.append(lambda rows: rows[:mine])
        return awaitable

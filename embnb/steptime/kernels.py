"""The kernels a rank runs, built as torchrec builds them: FBGEMM's table
batched embedding (TBE) per lookup group, and the dense part.

`lookup_module` mirrors torchrec 1.8.0's kernels
(torchrec/distributed/batched_embedding_kernel.py): the "fused" kernel is
`BatchedFusedEmbeddingBag`, a `SplitTableBatchedEmbeddingBagsCodegen` with
one (rows, cols, location, compute device) spec per shard, the
`feature_table_map` of its features, the table's pooling (sum or mean), fp32 weights initialized
uniformly as torchrec's `init_parameters` does, and the optimizer run inside
its backward; the "dense" kernel (data-parallel
tables) is `BatchedDenseEmbeddingBag`, a `DenseTableBatchedEmbeddingBagsCodegen`
whose weight gradient an optimizer applies after backward (here plain SGD).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import PoolingType, pooling_type_to_pooling_mode

from embnb.steptime.work import LookupGroup

__all__ = [
    "fbgemm_cuda_available",
    "check_tbe_device",
    "lookup_module",
    "DenseLookup",
    "make_mlp",
    "SequenceDense",
    "DEFAULT_OPTIMIZER",
]

# torchrec's fused kernels and where each keeps its table on a GPU (FBGEMM's
# EmbeddingLocation): device memory, unified memory, unified memory with a
# device cache (FBGEMM's default cache: LRU, load factor 0.2).
FUSED_LOCATIONS = {"fused": "DEVICE", "fused_uvm": "MANAGED", "fused_uvm_caching": "MANAGED_CACHING"}
DEFAULT_OPTIMIZER = "exact_row_wise_adagrad"  # FBGEMM's EmbOptimType value; torchrec's default is exact_sgd


def fbgemm_cuda_available() -> bool:
    """FBGEMM's CUDA TBE can run here: a GPU and an fbgemm_gpu CUDA build
    (the fbgemm-gpu-cpu wheel has no CUDA kernels)."""
    if not torch.cuda.is_available():
        return False
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

    try:
        torch.ops.fbgemm.asynchronous_complete_cumsum(torch.ones(2, dtype=torch.int64, device="cuda"))
    except (RuntimeError, NotImplementedError):
        return False
    return True


def check_tbe_device(device: torch.device | str) -> None:
    """Raises ValueError where FBGEMM's TBEs cannot run on `device` (`fbgemm_cuda_available`)."""
    if torch.device(device).type == "cuda" and not fbgemm_cuda_available():
        raise ValueError(
            f"device {device} asked for, but this fbgemm_gpu has no CUDA kernels (the CPU build, "
            "fbgemm-gpu-cpu, or no GPU): install the fbgemm-gpu CUDA wheel, or measure on device='cpu'"
        )


# The sharding type torchrec's lookups pass its kernels (the row-wise shardings' own; grid_shard's is
# table_row_wise); the others pass none.
_KERNEL_SHARDING_TYPE = {
    "row_wise": ShardingType.ROW_WISE,
    "table_row_wise": ShardingType.TABLE_ROW_WISE,
    "grid_shard": ShardingType.TABLE_ROW_WISE,
}


def _pooling_mode(group: LookupGroup):
    """FBGEMM's PoolingMode for `group`'s TBE, as torchrec's kernel picks it
    (`pooling_type_to_pooling_mode`): the table's pooling, but SUM for a mean-pooled table sharded
    row-wise, table-row-wise or grid, whose bags torchrec divides after the reduce-scatter."""
    return pooling_type_to_pooling_mode(
        PoolingType(group.pooling), _KERNEL_SHARDING_TYPE.get(group.sharding_type)
    )


class DenseLookup(nn.Module):
    """torchrec's dense kernel: FBGEMM's DenseTableBatchedEmbeddingBagsCodegen,
    whose weight gradient SGD applies after backward (`step`)."""

    def __init__(self, group: LookupGroup, device: torch.device, learning_rate: float) -> None:
        super().__init__()
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            DenseTableBatchedEmbeddingBagsCodegen,
        )

        self.tbe = DenseTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(s.rows, s.cols) for s in group.shards],
            feature_table_map=list(group.feature_shard),
            pooling_mode=_pooling_mode(group),
            use_cpu=device.type == "cpu",
        ).to(device)
        self.learning_rate = learning_rate

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.tbe(indices, offsets)

    @torch.no_grad()
    def step(self) -> None:
        weights = self.tbe.weights
        weights.add_(weights.grad, alpha=-self.learning_rate)
        weights.grad = None


def lookup_module(
    group: LookupGroup,
    device: torch.device | str = "cpu",
    optimizer: str = DEFAULT_OPTIMIZER,
    learning_rate: float = 0.01,
) -> nn.Module:
    """One TBE for `group`'s shards, as torchrec builds its kernel (module docstring)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    device = torch.device(device)
    check_tbe_device(device)
    if group.compute_kernel == "dense":
        return DenseLookup(group, device, learning_rate)
    # a group of another kernel type (e.g. quant) holds shards of no fused kernel
    unknown = sorted({s.compute_kernel for s in group.shards} - set(FUSED_LOCATIONS))
    if unknown:
        raise ValueError(f"compute kernels {unknown} are not one of {['dense', *FUSED_LOCATIONS]}")
    on_gpu = device.type == "cuda"

    # Each shard at its kernel's location (one TBE may mix fused and UVM shards, as torchrec's
    # group does); on a CPU every fused table is in host memory, as torchrec places it there.
    def location(kernel: str) -> EmbeddingLocation:
        return EmbeddingLocation[FUSED_LOCATIONS[kernel]] if on_gpu else EmbeddingLocation.HOST

    compute = ComputeDevice.CUDA if on_gpu else ComputeDevice.CPU
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(s.rows, s.cols, location(s.compute_kernel), compute) for s in group.shards],
        feature_table_map=list(group.feature_shard),
        pooling_mode=_pooling_mode(group),
        weights_precision=SparseType.FP32,
        cache_precision=SparseType.FP32,
        optimizer=EmbOptimType(optimizer),
        learning_rate=learning_rate,
        device=device,
        table_names=[s.table for s in group.shards],
    )
    # torchrec initializes its kernel's weights (`init_parameters`: uniform within
    # +-sqrt(1 / num_embeddings), the table's; here the shard's rows); FBGEMM alone leaves zeros, pages
    # the OS maps on first write, so a step would time faults no job pays.
    with torch.no_grad():
        for shard, weights in zip(group.shards, tbe.split_embedding_weights()):
            bound = shard.rows**-0.5
            weights.uniform_(-bound, bound)
    return tbe


def make_mlp(width: int, hidden: Sequence[int]) -> nn.Sequential:
    """The dense part over a sample's pooled embeddings: Linear + ReLU per
    hidden width, then one output."""
    layers: list[nn.Module] = []
    for out in hidden:
        layers += [nn.Linear(width, out), nn.ReLU()]
        width = out
    return nn.Sequential(*layers, nn.Linear(width, 1))


class SequenceDense(nn.Module):
    """The dense part over sequence samples: self-attention within each
    sample (cost ~ length^2), then an MLP per token (cost ~ length). Samples
    of one length run together, so nothing is padded."""

    def __init__(self, width: int, hidden: Sequence[int], heads: int = 4) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be a multiple of heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.mlp = make_mlp(width, hidden)

    def forward(self, tokens: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        loss = tokens.new_zeros(())
        by_length: dict[int, list[int]] = {}
        for n, start in zip(lengths, itertools.accumulate(lengths, initial=0)):
            by_length.setdefault(n, []).append(start)
        for n, starts in by_length.items():
            rows = torch.stack([tokens[s : s + n] for s in starts])  # samples x n x width
            q, k, v = self.qkv(rows).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
            attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            loss = loss + self.mlp(attended.transpose(1, 2).flatten(2)).sum()
        return loss

"""Technique 2: column-wise sharding of sequence embeddings and its permute indices: the placement
maths (`placement`, pure torch), embnb's own lookup over a process group (`lookup`, any shard widths)
and torchrec's ShardedEmbeddingCollection (`torchrec_adapter`). Notebook 02's experiments, figures
and widgets live in `embnb.lab.columnwise`.

    from embnb.columnwise import cw_permute_indices, cw_sharding_plan, shard_cw
"""

from embnb.columnwise.lookup import cw_sequence_lookup, local_shards
from embnb.columnwise.placement import (
    check_shard_ranks,
    check_widths,
    column_offsets,
    concat_in_rank_order,
    cw_permute_indices,
    equal_widths,
    rank_order,
    stitch_cw,
)
from embnb.columnwise.torchrec_adapter import (
    compute_kernels,
    cw_sharding_plan,
    shard_cw,
    torchrec_permute_indices,
)

__all__ = [
    "cw_permute_indices",
    "rank_order",
    "stitch_cw",
    "concat_in_rank_order",
    "check_shard_ranks",
    "check_widths",
    "column_offsets",
    "equal_widths",
    "cw_sequence_lookup",
    "local_shards",
    "cw_sharding_plan",
    "shard_cw",
    "compute_kernels",
    "torchrec_permute_indices",
]

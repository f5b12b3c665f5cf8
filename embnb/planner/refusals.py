"""The sharding options a plan's sharders would refuse, found before they are proposed.

torchrec's enumerator offers every (sharding type, compute kernel) its sharders name, and some
of them fail only when DistributedModelParallel builds the sharded module, on every rank:

- **Four columns.** FBGEMM's table-batched training kernel asserts that each table it holds
  has a width that is a multiple of 4 (`construct_split_state` in
  `fbgemm_gpu/split_table_batched_embeddings_ops_training.py`: "embedding_dim must be a
  multiple of 4", fbgemm-gpu 1.6.0 and 1.8.0), on CPU and CUDA alike. torchrec's kernels
  `fused`, `fused_uvm` and `fused_uvm_caching` build it, for EmbeddingCollection and
  EmbeddingBagCollection. torchrec checks the same before it, as "local_cols=... not divisible
  by 4" (`_assert_local_cols_divisible_by_4` in `torchrec/distributed/batched_embedding_kernel.py`,
  1.6.1 and 1.8.0), in its EmbeddingBagCollection's fused kernel and its key-value, virtual-table
  and Triton kernels. A shard's width is its columns: the table's for table-wise and row-wise,
  the shard's for column-wise. The `dense` kernel (data-parallel) has no such rule.
- **A rank with no rows, on CPU.** FBGEMM's CPU kernels reject a rank that holds no rows of a
  table. torchrec's row-wise shards are blocks of ceil(N / W) rows, which can leave the last
  ranks empty (5 rows on 4 ranks: 2, 2, 1, 0); that rank's first forward fails ("weights[0]
  must be a GPU or MTIA tensor", fbgemm-gpu-cpu 1.8) and the other ranks lose their peer.
  embnb's routed sharders raise first, by their own layouts
  (`embnb.rowwise.routed.check_no_empty_rank`; round-robin routings pad every rank to a full
  block, so they leave none empty): that check is the one applied to their options here.
- **Sequence lookups on FBGEMM's CPU dense kernel.** FBGEMM's CPU dense table-batched kernel
  pools every bag whatever its pooling mode: `DenseTableBatchedEmbeddingBagsCodegen(
  pooling_mode=PoolingMode.NONE, use_cpu=True)` returns one row per bag, not one per id
  (fbgemm-gpu-cpu 1.8; its Python wrapper is the same in 1.6.0). An EmbeddingCollection's
  `dense` kernel (data-parallel) on CPU therefore fails in its first forward where a bag holds
  other than one id (torchrec splits the rows by ids: "split_with_sizes expects split_sizes to
  sum exactly to ..."), so it is refused too.
- **A routing needs row-wise.** A routed sharder raises where a table its `routings` name (with
  a routing other than continuous) is planned another way (`embnb.rowwise.routed.table_layouts`).

`Refusals(sharders, topology).why(option)` says why the option's sharder would refuse it, or
None; `split` keeps the options accepted. `create_planner` hands its sharders to the DP proposer
(`DynamicProgrammingProposer.expect_sharders`), which proposes only options accepted, and says
which tables have none.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
from torch import nn
from torchrec.distributed.planner.types import ShardingOption, Topology
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.types import ModuleSharder, ParameterSharding

from embnb.planner.layout import deferred

__all__ = ["FOUR_COLUMN_KERNELS", "Refusals", "no_option_reason", "shard_sizes", "table_name"]

# Compute kernels (torchrec's EmbeddingComputeKernel values, 1.6.1 and 1.8.0) whose every shard
# needs a width that is a multiple of 4: FBGEMM's table-batched kernel (the fused ones) and
# torchrec's own assertion (the key-value, virtual-table and Triton ones); the module docstring.
FOUR_COLUMN_KERNELS = frozenset(
    {
        "fused",
        "fused_uvm",
        "fused_uvm_caching",
        "key_value",
        "ssd_virtual_table",
        "dram_virtual_table",
        "dram_ssd_virtual_table",
        "fused_triton",
    }
)


def shard_sizes(option: ShardingOption) -> np.ndarray:
    """Each shard's [rows, columns] (int64), read without making the shards of a LayoutOption."""
    if deferred(option):
        return option.layout.table[:, 0]
    return np.array([shard.size for shard in option.shards], dtype=np.int64).reshape(len(option.shards), -1)


class Refusals:
    """Why the sharders of one `plan(module, sharders)` call would refuse an option.

    Args:
        sharders: the sharders the planner is given (each option's is the one of its module's type,
            as torchrec's enumerator picks it).
        topology: the topology planned for (its compute device and world size).
    """

    def __init__(self, sharders: Sequence[ModuleSharder[nn.Module]], topology: Topology) -> None:
        from embnb.rowwise.routed import RoutedSharder

        self._sharders = {sharder_name(sharder.module_type): sharder for sharder in sharders}
        self._routed = {name for name, s in self._sharders.items() if isinstance(s, RoutedSharder)}
        self.compute_device, self.world_size = topology.compute_device, topology.world_size

    def why(self, option: ShardingOption) -> str | None:
        """Why `option`'s sharder (or the kernel it builds) would refuse it; None if it would not."""
        sizes = shard_sizes(option)
        if option.compute_kernel in FOUR_COLUMN_KERNELS:
            odd = sizes[sizes[:, 1] % 4 != 0, 1]
            if len(odd):
                return (
                    f"a shard of {int(odd[0])} columns under compute kernel {option.compute_kernel!r}: "
                    "FBGEMM's table-batched kernels need a multiple of 4"
                )
        if self.compute_device == "cpu" and option.compute_kernel == "dense" and not option.is_pooled:
            return (
                "an EmbeddingCollection's dense kernel on CPU: FBGEMM's CPU dense kernel pools each "
                "bag whatever the pooling mode (a row per bag, not per id)"
            )
        module_type = sharder_name(type(option.module[1]))
        if module_type in self._routed:
            return self._routed_refusal(option, self._sharders[module_type])
        if self.compute_device == "cpu":
            empty = np.flatnonzero(sizes[:, 0] == 0)
            if len(empty):
                return (
                    f"{option.sharding_type} shards of {int(sizes[:, 0].max())} rows leave rank "
                    f"{int(empty[0])} with no rows of the table, which FBGEMM's CPU kernels reject"
                )
        return None

    def _routed_refusal(self, option: ShardingOption, sharder) -> str | None:
        """The routed sharder's own checks, on this one table (`table_layouts`, `check_no_empty_rank`)."""
        from embnb.rowwise.routed import check_no_empty_rank, table_layouts

        name = option.name
        routing = sharder.routing_of(name, option.module[0])  # None: the sharder's `others`
        config = SimpleNamespace(name=name, num_embeddings=int(option.tensor.shape[0]))
        planned = ParameterSharding(sharding_type=option.sharding_type, compute_kernel=option.compute_kernel)
        try:
            layouts = table_layouts(
                [config],
                {name: planned},
                self.world_size,
                {} if routing is None else {name: routing},
                sharder.others,
                sharder.seed,
            )
            check_no_empty_rank(layouts, self.compute_device)
        except ValueError as refused:
            return str(refused)
        return None

    def split(self, options: list[ShardingOption]) -> tuple[list[ShardingOption], dict[str, dict[str, str]]]:
        """The options accepted, and the options refused per table (`table_name`):
        "sharding_type/compute_kernel" -> why."""
        accepted, refused = [], {}
        for option in options:
            reason = self.why(option)
            if reason is None:
                accepted.append(option)
            else:
                kind = f"{option.sharding_type}/{option.compute_kernel}"
                refused.setdefault(table_name(option), {})[kind] = reason
        return accepted, refused


def table_name(option: ShardingOption) -> str:
    """The option's table, qualified by its collection's path in the model where it has one
    (torchrec's `fqn`, without its leading dot for a model that is the collection itself)."""
    return option.fqn.removeprefix(".")


def no_option_reason(tables: Sequence[str], refused: dict[str, dict[str, str]]) -> str:
    """Why `tables` have no option left: each one's options refused, and why (alike ones together)."""
    clauses = []
    for table in tables:
        kinds_by_why: dict[str, list[str]] = {}
        for kind, why in refused[table].items():
            kinds_by_why.setdefault(why, []).append(kind)
        whys = "; ".join(f"{', '.join(kinds)}: {why}" for why, kinds in kinds_by_why.items())
        clauses.append(f"table {table!r} has no option its sharders accept ({whys})")
    return "; ".join(clauses)

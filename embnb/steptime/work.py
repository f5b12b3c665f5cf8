"""Each rank's own work in a W-rank step, built from a configuration: which
shards it looks up and exactly which ids each receives.

Two configurations:

- a torchrec sharding plan (`plan_work`): the rank's shards of every table,
  fed the ids torchrec's input distribution delivers to it from the global
  batch: table-wise and column-wise shards get every id of their features
  from all W local batches; a row-wise shard gets the ids whose rows fall in
  its block, minus the block's first row (what `block_bucketize_sparse_features`
  sends), and so do table-row-wise and grid shards, whose blocks split a
  table (or a column block of it) over one host's devices; a data-parallel
  table gets the rank's local batch only.
- a routing mode with a key stream (`routing_work`): every feature's table
  row-wise over all ranks with `embnb.rowwise`'s owner rule.

    shards = plan_shards(plan, model.tables)
    work = plan_work(shards, batch, rank=3)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingPlan, ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from embnb._checks import check_int
from embnb.planner.perf_model import kernel_type, parameter_sharding_group_keys
from embnb.rowwise.routing import DistType, hash_key, owner_rank
from embnb.steptime.batch import GlobalBatch

__all__ = [
    "Shard",
    "LookupGroup",
    "RankWork",
    "module_plan",
    "plan_shards",
    "plan_work",
    "routing_work",
    "SUPPORTED_SHARDING_TYPES",
    "HOST_LEVEL_SHARDING_TYPES",
    "devices_per_host",
]

_LOW_63 = (1 << 63) - 1
WEIGHT_BYTES = 4  # fp32 table rows, as `kernels.lookup_module` builds every TBE
# the types whose every shard holds all the table's rows (a table, or a column block of it)
WHOLE_ROWS = tuple(
    t.value for t in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE)
)
# the types that place a table, or each of its column blocks, row-wise over one host's devices
HOST_LEVEL_SHARDING_TYPES = (ShardingType.TABLE_ROW_WISE.value, ShardingType.GRID_SHARD.value)
# Sharding types whose input and output distribution this package replays (torchrec 1.8.0's pooled
# EmbeddingBagCollection shardings)
SUPPORTED_SHARDING_TYPES = (
    ShardingType.DATA_PARALLEL.value,
    *WHOLE_ROWS,
    ShardingType.ROW_WISE.value,
    *HOST_LEVEL_SHARDING_TYPES,
)


@dataclass(frozen=True)
class Shard:
    """One table shard on one rank: rows [row_offset, row_offset + rows),
    columns [col_offset, col_offset + cols); `tbe_key`: torchrec's TBE grouping key
    (`embnb.planner.perf_model.parameter_sharding_group_keys`; empty: one group per
    sharding type and kernel)."""

    table: str
    sharding_type: str
    compute_kernel: str
    rank: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int
    features: tuple[str, ...]
    tbe_key: tuple = ()
    pooling: str = "SUM"  # the table's torchrec PoolingType value: how its TBE pools a bag

    def describe(self) -> dict[str, object]:
        """The shard as the results JSON records it."""
        keys = ("table", "compute_kernel", "row_offset", "rows", "col_offset", "cols")
        return {key: getattr(self, key) for key in keys}


@dataclass(frozen=True)
class LookupGroup:
    """The shards one lookup kernel (one FBGEMM TBE) serves on a rank, as
    torchrec groups them (one per distinct `Shard.tbe_key`, torchrec's
    `group_tables` key within each sharding type: `fused`, `fused_uvm` and
    `fused_uvm_caching` shards share one TBE, each at its own location), and
    its input: `lengths` and `ids` feature by feature (features in shard
    order), `batch_size` bags per feature. `compute_kernel`: the group's
    kernel type (`fused` for the UVM kernels)."""

    sharding_type: str
    compute_kernel: str
    shards: list[Shard]
    feature_shard: list[int]  # each input feature's shard (TBE's feature_table_map)
    batch_size: int
    lengths: torch.Tensor  # int64, len(feature_shard) * batch_size
    ids: torch.Tensor  # int64, local rows of each feature's shard

    @property
    def pooling(self) -> str:
        """How the TBE pools a bag (torchrec's PoolingType value, "SUM" or "MEAN"): one per group,
        since torchrec's grouping key holds the table's pooling."""
        return self.shards[0].pooling

    @property
    def pooled_dim(self) -> int:
        return sum(self.shards[s].cols for s in self.feature_shard)

    @property
    def bytes_read(self) -> int:
        """Bytes of table rows the forward gathers: each id's row, its shard's `cols` fp32 values
        (`kernels.lookup_module`'s weights); ids and offsets not counted."""
        ids_per_feature = self.lengths.view(len(self.feature_shard), -1).sum(1)
        cols = torch.tensor([self.shards[s].cols for s in self.feature_shard])
        return int((ids_per_feature * cols).sum()) * WEIGHT_BYTES

    def describe(self) -> dict[str, object]:
        """The TBE as the results JSON records it: sharding type, kernel type, its shards."""
        return {
            "sharding_type": self.sharding_type,
            "compute_kernel": self.compute_kernel,
            "shards": [shard.describe() for shard in self.shards],
        }


@dataclass(frozen=True)
class RankWork:
    """Rank `rank`'s lookups and its dense part's input: `dense_samples`
    samples of width `dense_width` (its pooled embeddings)."""

    rank: int
    world_size: int
    groups: list[LookupGroup]
    dense_samples: int
    dense_width: int

    @property
    def num_ids(self) -> int:
        return sum(int(g.ids.numel()) for g in self.groups)

    @property
    def bytes_read(self) -> int:
        """Bytes of table rows its lookups' forward gathers (`LookupGroup.bytes_read`)."""
        return sum(g.bytes_read for g in self.groups)


def module_plan(plan: ShardingPlan | EmbeddingModuleShardingPlan) -> EmbeddingModuleShardingPlan:
    """The one module's plan in `plan` (an EmbeddingBagCollection's)."""
    if isinstance(plan, ShardingPlan):
        if len(plan.plan) != 1:
            raise ValueError(f"the plan shards {len(plan.plan)} modules {list(plan.plan)}; pass one module's")
        return next(iter(plan.plan.values()))
    if not isinstance(plan, dict):
        raise TypeError(
            f"plan must be a ShardingPlan or EmbeddingModuleShardingPlan, got {type(plan).__name__}"
        )
    return plan


def plan_shards(
    plan: ShardingPlan | EmbeddingModuleShardingPlan, tables: Sequence[EmbeddingBagConfig], world_size: int
) -> list[Shard]:
    """Every shard of every table in `plan`, with its rank and row/column block."""
    check_int("world_size", world_size, low=1)
    by_name = {t.name: t for t in tables}
    shards = []
    for name, sharding in module_plan(plan).items():
        if name not in by_name:
            raise ValueError(f"the plan shards table {name!r}, not among the tables {sorted(by_name)[:5]}...")
        table, kind = by_name[name], sharding.sharding_type
        if kind not in SUPPORTED_SHARDING_TYPES:
            raise ValueError(
                f"table {name!r}: sharding type {kind!r} is not one of {SUPPORTED_SHARDING_TYPES}"
            )
        if kind == ShardingType.DATA_PARALLEL.value:  # the whole table on every rank
            blocks = [(r, (0, 0), (table.num_embeddings, table.embedding_dim)) for r in range(world_size)]
        else:
            blocks = [
                (m.placement.rank(), m.shard_offsets, m.shard_sizes) for m in sharding.sharding_spec.shards
            ]
        keys = parameter_sharding_group_keys(sharding, table, [cols for _, _, (_, cols) in blocks])
        features, kernel = tuple(table.feature_names), sharding.compute_kernel
        for (rank, (row, col), (rows, cols)), key in zip(blocks, keys):
            if not 0 <= rank < world_size:
                raise ValueError(f"table {name!r}: a shard on rank {rank}, outside world_size {world_size}")
            shards.append(
                Shard(name, kind, kernel, rank, row, rows, col, cols, features, key, table.pooling.value)
            )
    missing = set(by_name) - {s.table for s in shards}
    if missing:
        raise ValueError(f"the plan places no shard of tables {sorted(missing)}")
    return shards


def devices_per_host(shards: Sequence[Shard], world_size: int) -> int:
    """The devices per host a plan's host-level shards imply (torchrec's
    local_world_size): a table-row-wise table, or a grid table's column
    block, is split over every device of one host. `world_size` (one host)
    when the plan has none."""
    blocks: dict[tuple[str, int], set[int]] = {}
    for s in shards:
        if s.sharding_type in HOST_LEVEL_SHARDING_TYPES:
            blocks.setdefault((s.table, s.col_offset), set()).add(s.rank)
    sizes = {len(ranks) for ranks in blocks.values()}
    if not sizes:
        return world_size
    local = max(sizes)
    hosts_apart = [
        f"{table} (columns from {col}): ranks {sorted(ranks)}"
        for (table, col), ranks in blocks.items()
        if len(ranks) != local or len({r // local for r in ranks}) != 1
    ]
    if world_size % local or hosts_apart:
        raise ValueError(
            f"host-level shards must each span all {local} devices of one host of a world of "
            f"{world_size} (a multiple of {local}); these do not: {hosts_apart[:3] or 'the world size'}"
        )
    return local


def _deliver(
    lengths: torch.Tensor,
    ids: torch.Tensor,
    select: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bags kept to the ids `select` keeps (a mask and their local rows)."""
    mask, local = select(ids)
    kept_before = torch.nn.functional.pad(mask.cumsum(0), (1, 0))  # ids kept before each position
    ends = torch.cumsum(lengths, 0)
    return kept_before[ends] - kept_before[ends - lengths], local[mask]


def _rows_in(first: int, count: int) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    return lambda ids: ((ids >= first) & (ids < first + count), ids - first)


def _group(
    kind: str,
    kernel: str,
    shards: list[Shard],
    inputs: list[tuple[int, torch.Tensor, torch.Tensor]],
    batch_size: int,
) -> LookupGroup:
    feature_shard, lengths, ids = zip(*inputs)
    return LookupGroup(
        kind, kernel, shards, list(feature_shard), batch_size, torch.cat(lengths), torch.cat(ids)
    )


def plan_work(shards: Sequence[Shard], batch: GlobalBatch, rank: int) -> RankWork:
    """Rank `rank`'s lookups under a plan's shards, fed from `batch` (module docstring)."""
    world_size = batch.world_size
    check_int("rank", rank, low=0, high=world_size - 1)
    feature_index = {f: i for i, f in enumerate(batch.feature_names)}
    groups: dict[tuple, list[Shard]] = {}
    for shard in shards:
        if shard.rank == rank:
            key = shard.tbe_key or (shard.sharding_type, shard.compute_kernel)
            groups.setdefault(key, []).append(shard)
    built = []
    for mine in groups.values():
        kind = mine[0].sharding_type
        kernel = kernel_type(mine[0].compute_kernel)
        local = kind == ShardingType.DATA_PARALLEL.value
        inputs = []
        for s, shard in enumerate(mine):
            for feature in shard.features:
                f = feature_index[feature]
                if local:  # data-parallel: the rank's own samples, every id
                    inputs.append((s, batch.lengths[rank][f], batch.ids[rank][f]))
                elif kind in WHOLE_ROWS:  # every row's block: every bag of the global batch as it is
                    inputs.append((s, *batch.global_bags(f)))
                else:
                    lengths, ids = _deliver(*batch.global_bags(f), _rows_in(shard.row_offset, shard.rows))
                    inputs.append((s, lengths, ids))
        size = batch.local_batch_size * (1 if local else world_size)
        built.append(_group(kind, kernel, mine, inputs, size))
    table_dim: dict[str, int] = {}
    for shard in shards:  # a table's width: where its last column block ends
        table_dim[shard.table] = max(table_dim.get(shard.table, 0), shard.col_offset + shard.cols)
    features_width = sum(table_dim[t] for t in batch.feature_tables)
    return RankWork(rank, world_size, built, batch.local_batch_size, features_width)


def routing_work(
    batch: GlobalBatch,
    dist_type: DistType | str,
    rows: dict[str, int],
    dims: dict[str, int],
    rank: int,
    block_size: dict[str, int] | None = None,
) -> RankWork:
    """Rank `rank`'s lookups when every table (`rows`, `dims` by table name)
    is row-wise sharded over all ranks by `dist_type`: it receives the ids of
    the global batch it owns (`embnb.rowwise.owner_rank`). Its local row:
    `continuous`, id - rank * block (FBGEMM's rule past the last block:
    id // W); the round-robin modes, (id // W) % local rows, with
    hash_roundrobin on the hashed id's low 63 bits (a rank's table of
    ceil(rows / W) rows: a layout for timing, not dynamicemb's hash table)."""
    mode = DistType.parse(dist_type)
    world_size = batch.world_size
    check_int("rank", rank, low=0, high=world_size - 1)
    shards, inputs = [], []
    for f, (feature, table) in enumerate(zip(batch.feature_names, batch.feature_tables)):
        local_rows = -(-rows[table] // world_size)
        block = (block_size or {}).get(table, local_rows)

        def select(ids: torch.Tensor, block: int = block, local_rows: int = local_rows):
            owned = owner_rank(ids, world_size, mode, block if mode is DistType.CONTINUOUS else None) == rank
            if mode is DistType.CONTINUOUS:
                local = torch.where(ids < block * world_size, ids - rank * block, ids // world_size)
            else:
                # the hash's low 63 bits: a non-negative int64 to address rows with
                keys = hash_key(ids) & _LOW_63 if mode is DistType.HASH_ROUNDROBIN else ids
                local = torch.remainder(torch.div(keys, world_size, rounding_mode="floor"), local_rows)
            return owned, local

        shards.append(Shard(table, "row_wise", "fused", rank, 0, local_rows, 0, dims[table], (feature,)))
        inputs.append((len(shards) - 1, *_deliver(*batch.global_bags(f), select)))
    group = _group("row_wise", "fused", shards, inputs, batch.local_batch_size * world_size)
    width = sum(dims[t] for t in batch.feature_tables)
    return RankWork(rank, world_size, [group], batch.local_batch_size, width)

"""The bytes every collective of a step moves, per rank, counted exactly as
torchrec 1.8.0's pooled EmbeddingBagCollection shardings move them
(torchrec/distributed/dist_data.py, comm_ops.py), and a communication time
computed from them with torchrec's own link model (labelled computed: it is
not measured).

Per sharding type with shards on any rank (one input and one output
distribution each, every rank taking part):

- input dist (KJTAllToAll): a splits all-to-all of W x (lengths, values,
  stride, + a tag where torchrec validates collectives) int64 counts, then one
  all-to-all for the lengths and one for the ids. Table-wise and column-wise:
  each (shard, feature) on rank d gets the sender's whole local bag of that
  feature. Row-wise: every feature to every rank, the ids bucketed by block.
  Table-row-wise and grid (hosts of L devices): each feature of each block
  (a table, or a grid table's column block, on one host) to the L devices
  of its host, the ids bucketed by row block (TwRwSparseFeaturesDist).
- output dist: table-wise and column-wise, an all-to-all of the pooled
  embeddings (the shard's columns for the global batch, B rows to each
  rank); row-wise, a reduce-scatter of the partial sums. Table-row-wise and
  grid: a reduce-scatter within the host (each device keeps the partial sums
  of the ranks with its local rank on every host), then an all-to-all across
  hosts among the devices of one local rank (TwRwPooledEmbeddingDist).
  Backward: the reverse all-to-all; row-wise, an all-gather of the
  gradients; table-row-wise and grid, the reverse all-to-all, then the
  all-gather.
- data-parallel tables and the dense MLP: their gradients all-reduced (by
  DistributedDataParallel, outside the sharded module).

`sent_bytes` and `received_bytes` are the tensors a rank hands to the
collective and gets back, its own share included (`kept_bytes`, which
crosses no link). The validation test compares them, collective by
collective, with what torchrec's collectives are handed in a real job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torchrec.distributed.planner.types import CollectiveType, Topology

from embnb.rowwise.routing import DistType, owner_rank
from embnb.steptime.batch import GlobalBatch
from embnb.steptime.work import HOST_LEVEL_SHARDING_TYPES, Shard, devices_per_host

__all__ = ["Collective", "RankComms", "plan_comms", "routing_comms", "LINK_MODEL"]

LINK_MODEL = (
    "computed, not measured: bytes over links / torchrec 1.8.0's bandwidth "
    "(Topology.comms_bandwidths.get_bw, torchrec/distributed/planner/types.py BasicCommsBandwidths; "
    "defaults INTRA_NODE_BANDWIDTH 600 GiB/s and CROSS_NODE_BANDWIDTH 12.5 GiB/s in planner/constants.py)"
)
_INT64, _FP32 = 8, 4
_KINDS = {
    "all_to_all_single": CollectiveType.ALL_TO_ALL,
    "reduce_scatter_tensor": CollectiveType.REDUCE_SCATTER,
    "all_gather_into_tensor": CollectiveType.ALL_GATHER,
    "all_reduce": CollectiveType.ALL_REDUCE,
}


@dataclass(frozen=True)
class Collective:
    """One collective call of one rank: the torch.distributed function, the
    bytes handed in and got back, and of those the rank's own share."""

    name: str  # what it moves, e.g. "table_wise input ids"
    kind: str  # all_to_all_single, reduce_scatter_tensor, all_gather_into_tensor, all_reduce
    phase: str  # "forward" or "backward"
    sent_bytes: int
    received_bytes: int
    kept_bytes: int
    in_sharded_module: bool = True  # False: DistributedDataParallel's, outside the sharded module
    within_host: bool = False  # on one host's devices (torchrec's intra-node group), at its bandwidth

    @property
    def link_bytes(self) -> float:
        """Bytes that cross this rank's link: the larger direction, its own
        share left out; a ring all-reduce sends 2 (W-1)/W of the tensor
        (`kept_bytes` holds the tensor / W)."""
        if self.kind == "all_reduce":
            return 2 * (self.sent_bytes - self.kept_bytes)
        return max(self.sent_bytes, self.received_bytes) - self.kept_bytes


@dataclass(frozen=True)
class RankComms:
    rank: int
    collectives: list[Collective]

    @property
    def sent_bytes(self) -> int:
        return sum(c.sent_bytes for c in self.collectives)

    @property
    def received_bytes(self) -> int:
        return sum(c.received_bytes for c in self.collectives)

    def computed_seconds(self, topology: Topology) -> float:
        """Every collective one after another at torchrec's bandwidth (`LINK_MODEL`)."""
        bandwidths, local, world = topology.comms_bandwidths, topology.local_world_size, topology.world_size
        per_ms = [
            c.link_bytes / bandwidths.get_bw(local, local if c.within_host else world, _KINDS[c.kind])
            for c in self.collectives
        ]
        return sum(per_ms) / 1e3


def _splits_count() -> int:
    try:
        from torchrec.distributed.collective_utils import validate_collectives_enabled
    except ImportError:  # torchrecs without collective validation append no tag
        return 3
    # lengths, values, the stride (batch size: torchrec's KJTAllToAllSplitsAwaitable
    # sends it for a KJT of one stride) and, where torchrec validates collectives, a tag
    return 3 + int(validate_collectives_enabled())


def _kjt_all_to_all(
    kind: str, batch: GlobalBatch, lengths: tuple[int, int, int], ids: tuple[int, int, int]
) -> list[Collective]:
    """A KJTAllToAll's three all-to-alls: the splits, then the lengths and the ids, each of
    `lengths` and `ids` the (sent, received, kept) counts."""
    world, a2a = batch.world_size, "all_to_all_single"
    splits = world * _splits_count() * _INT64
    length_bytes, id_bytes = batch.lengths[0][0].element_size(), batch.ids[0][0].element_size()
    return [
        Collective(f"{kind} input splits", a2a, "forward", splits, splits, splits // world),
        Collective(f"{kind} input lengths", a2a, "forward", *(n * length_bytes for n in lengths)),
        Collective(f"{kind} input ids", a2a, "forward", *(n * id_bytes for n in ids)),
    ]


def _in_block(ids: torch.Tensor, first: int, count: int) -> int:
    return int(((ids >= first) & (ids < first + count)).sum())


def _input_dist(
    kind: str, shards: Sequence[Shard], batch: GlobalBatch, rank: int, local: int
) -> list[Collective]:
    """The KJTAllToAll of one sharding type: splits, lengths, ids (hosts of `local` devices)."""
    world, size = batch.world_size, batch.local_batch_size
    index = {f: i for i, f in enumerate(batch.feature_names)}
    entries = [(s, f) for s in shards if s.sharding_type == kind for f in s.features]
    mine = [(s, f) for s, f in entries if s.rank == rank]
    if kind in HOST_LEVEL_SHARDING_TYPES or kind == "row_wise":
        # each feature to every rank (on hosts: each block's feature to its host's `local` devices),
        # its ids bucketed by row block
        host = kind in HOST_LEVEL_SHARDING_TYPES
        units = {(s.table, s.col_offset, f) if host else f: f for s, f in entries}
        devices, kept = (local, len(mine)) if host else (world, len(units))
        lengths = (len(units) * devices * size, len(mine) * world * size, kept * size)
        ids = (
            sum(batch.ids[rank][index[f]].numel() for f in units.values()),
            sum(_in_block(batch.global_bags(index[f])[1], s.row_offset, s.rows) for s, f in mine),
            sum(_in_block(batch.ids[rank][index[f]], s.row_offset, s.rows) for s, f in mine),
        )
    else:  # each (shard, feature) gets every sender's whole local bag of the feature
        own = [batch.ids[rank][index[f]].numel() for _, f in entries]
        received = [batch.global_bags(index[f])[1].numel() for s, f in mine]
        kept = [batch.ids[rank][index[f]].numel() for s, f in mine]
        lengths = (len(entries) * size, len(mine) * world * size, len(mine) * size)
        ids = (sum(own), sum(received), sum(kept))
    return _kjt_all_to_all(kind, batch, lengths, ids)


def _row_wise_output(kind: str, batch: GlobalBatch, width: int) -> tuple[list[Collective], list[Collective]]:
    """Row-wise pooled embeddings of `width` columns: reduce-scatter forward, all-gather backward."""
    part = batch.local_batch_size * width * _FP32
    full = batch.world_size * part
    return [
        Collective(f"{kind} pooled reduce-scatter", "reduce_scatter_tensor", "forward", full, part, part)
    ], [Collective(f"{kind} gradient all-gather", "all_gather_into_tensor", "backward", part, full, part)]


def _output_dist(
    kind: str, shards: Sequence[Shard], batch: GlobalBatch, rank: int, local: int
) -> tuple[list[Collective], list[Collective]]:
    """The output dist's collectives of one sharding type: (forward, backward), each in call order."""
    world, size = batch.world_size, batch.local_batch_size
    entries = [(s, f) for s in shards if s.sharding_type == kind for f in s.features]
    if kind in HOST_LEVEL_SHARDING_TYPES:
        hosts = world // local
        # each host's pooled width: its first device's blocks (torchrec's _dim_sum_per_node)
        widths = [sum(s.cols for s, f in entries if s.rank == host * local) for host in range(hosts)]
        width = widths[rank // local]
        full, part = world * size * width * _FP32, hosts * size * width * _FP32
        own, everyone = size * width * _FP32, size * sum(widths) * _FP32
        scatter, gather, host = "reduce_scatter_tensor", "all_gather_into_tensor", {"within_host": True}
        return [
            Collective(f"{kind} pooled reduce-scatter", scatter, "forward", full, part, part, **host),
            Collective(f"{kind} pooled all-to-all", "all_to_all_single", "forward", part, everyone, own),
        ], [
            Collective(f"{kind} gradient all-to-all", "all_to_all_single", "backward", everyone, part, own),
            Collective(f"{kind} gradient all-gather", gather, "backward", part, full, part, **host),
        ]
    if kind == "row_wise":
        return _row_wise_output(kind, batch, sum(s.cols for s, f in entries if s.rank == rank))
    mine = sum(s.cols for s, f in entries if s.rank == rank)
    everyone = sum(s.cols for s, f in entries)
    sent, received, kept = world * size * mine * _FP32, size * everyone * _FP32, size * mine * _FP32
    return [Collective(f"{kind} pooled all-to-all", "all_to_all_single", "forward", sent, received, kept)], [
        Collective(f"{kind} gradient all-to-all", "all_to_all_single", "backward", received, sent, kept)
    ]


def _all_reduce(name: str, parameters: int, world: int) -> Collective:
    """DistributedDataParallel's all-reduce of `parameters` fp32 gradients, outside the sharded module."""
    total = parameters * _FP32
    return Collective(
        f"{name} gradient all-reduce", "all_reduce", "backward", total, total, total // world, False
    )


def plan_comms(
    shards: Sequence[Shard], batch: GlobalBatch, rank: int, dense_parameters: int = 0
) -> RankComms:
    """Every collective rank `rank` runs in one step of a plan's `shards` on
    `batch`, in torchrec's order of sharding types (first table's first);
    `dense_parameters`: the dense part's fp32 parameters, all-reduced. Hosts:
    as many devices each as the plan's host-level shards span
    (`work.devices_per_host`)."""
    world = batch.world_size
    local = devices_per_host(shards, world)
    kinds = list(dict.fromkeys(s.sharding_type for s in shards))
    forward, backward = [], []
    for kind in kinds:
        if kind == "data_parallel":
            continue
        forward += _input_dist(kind, shards, batch, rank, local)
        output, gradient = _output_dist(kind, shards, batch, rank, local)
        forward += output
        backward = gradient + backward  # autograd runs the output dists backwards, last first
    collectives = forward + backward
    replicated = {s.table: s.rows * s.cols for s in shards if s.sharding_type == "data_parallel"}
    for name, size in (("data_parallel tables", sum(replicated.values())), ("dense", dense_parameters)):
        if size:
            collectives.append(_all_reduce(name, size, world))
    return RankComms(rank, collectives)


def routing_comms(
    batch: GlobalBatch,
    dist_type: DistType | str,
    rows: dict[str, int],
    dims: dict[str, int],
    rank: int,
    block_size: dict[str, int] | None = None,
    dense_parameters: int = 0,
) -> RankComms:
    """The collectives of rank `rank` when every table is row-wise sharded
    by `dist_type` (as `work.routing_work`): torchrec's row-wise input dist
    (splits, lengths of every feature for every rank, each id to its owner)
    and its reduce-scatter / all-gather of the pooled embeddings."""
    mode = DistType.parse(dist_type)
    world, size, features = batch.world_size, batch.local_batch_size, len(batch.feature_names)

    def owned_by(source: int, dest: int) -> int:
        blocks = [(block_size or {}).get(table, -(-rows[table] // world)) for table in batch.feature_tables]
        return sum(  # as routing_work
            int((owner_rank(ids, world, mode, block if mode is DistType.CONTINUOUS else None) == dest).sum())
            for ids, block in zip(batch.ids[source], blocks)
        )

    lengths = (world * features * size, world * features * size, features * size)
    sent = sum(int(ids.numel()) for ids in batch.ids[rank])
    ids = (sent, sum(owned_by(source, rank) for source in range(world)), owned_by(rank, rank))
    forward, backward = _row_wise_output("row_wise", batch, sum(dims[t] for t in batch.feature_tables))
    collectives = _kjt_all_to_all("row_wise", batch, lengths, ids) + forward + backward
    if dense_parameters:
        collectives.append(_all_reduce("dense", dense_parameters, world))
    return RankComms(rank, collectives)

"""Column-wise (CW) sharding of sequence embeddings: permute indices and stitching.

A table's columns are cut into shards, shard `s` placed on rank
`shard_ranks[s]`. Lookups come back ordered by rank, not by column: with
`shard_ranks = [0, 1, 0]` they arrive as (s0, s2, s1). The permute indices
(`[0, 2, 1]`) put them back in column order before the concatenation.

Three layers, each usable alone:

- pure functions on placements: `cw_permute_indices`, `rank_order`,
  `stitch_cw`, `concat_in_rank_order` (the naive, wrong stitching),
  `equal_widths`, `check_widths`, `rank_ordered_shard_outputs`;
- torchrec: `compute_kernel_for` (a kernel that works per device),
  `cw_sharding_plan` and `shard_cw` (a real `ShardedEmbeddingCollection`),
  `torchrec_permute_indices` (what torchrec computed for it);
- runs on real ranks: `cw_sequence_lookup` (embnb's own CW lookup over a
  process group, any shard widths) and `run_cw_cases`, which shards
  `CWCase`s under `embnb.dist.launch` and returns every rank's outputs
  next to the unsharded `EmbeddingCollection`'s.

    >>> cw_permute_indices([0, 1, 0])
    [0, 2, 1]
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from embnb.dist import DEVICES, resolve_device  # noqa: F401  (re-exported)

if TYPE_CHECKING:  # torchrec is imported where used: the pure functions stay light
    from torchrec import EmbeddingCollection, KeyedJaggedTensor
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

__all__ = [
    "check_shard_ranks",
    "rank_order",
    "cw_permute_indices",
    "equal_widths",
    "check_widths",
    "stitch_cw",
    "concat_in_rank_order",
    "rank_ordered_shard_outputs",
    "COMPUTE_KERNELS",
    "compute_kernel_for",
    "resolve_device",
    "backend_for",
    "cw_sharding_plan",
    "shard_cw",
    "torchrec_permute_indices",
    "TableSpec",
    "CWCase",
    "CWRun",
    "make_embedding_collection",
    "make_batches",
    "to_kjt",
    "unsharded_outputs",
    "cw_sequence_lookup",
    "reference_cw_forward",
    "cw_cases_on_rank",
    "run_cw_cases",
]

# ---------------------------------------------------------------- placements


def check_shard_ranks(shard_ranks: Sequence[int], world_size: int | None = None) -> list[int]:
    """`shard_ranks` as a list of ints, or a ValueError naming what is wrong."""
    if isinstance(shard_ranks, (str, bytes)) or not isinstance(shard_ranks, Sequence):
        raise ValueError(f"shard_ranks must be a list of ranks, got {shard_ranks!r}")
    ranks = list(shard_ranks)
    if not ranks:
        raise ValueError("shard_ranks is empty: a column-wise table needs at least one shard")
    bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int) or r < 0]
    if bad:
        raise ValueError(f"shard_ranks {ranks} has {bad[0]!r}: ranks must be ints >= 0")
    if world_size is not None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        too_big = [r for r in ranks if r >= world_size]
        if too_big:
            raise ValueError(
                f"shard_ranks {ranks} has rank {too_big[0]} >= world_size {world_size}; "
                f"ranks must be in 0..{world_size - 1}"
            )
    return ranks


def rank_order(shard_ranks: Sequence[int]) -> list[int]:
    """Shard indices in the order their outputs arrive: by rank, then by shard
    index (a rank returns its shards in column order). [0, 1, 0] -> [0, 2, 1]."""
    ranks = check_shard_ranks(shard_ranks)
    return sorted(range(len(ranks)), key=lambda s: (ranks[s], s))


def cw_permute_indices(shard_ranks: Sequence[int], world_size: int | None = None) -> list[int]:
    """For each shard in column order, its position among the rank-ordered
    outputs: `stitched = cat([outputs[p] for p in permute], dim=1)`.

    torchrec's rule (ShardedEmbeddingCollection._generate_permute_indices_per_feature):
    position i of sorted(shard_ranks) belongs to the i-th shard, in column
    order, of the rank there. It is the inverse of `rank_order`; the two
    coincide for [0, 1, 0] but not for [1, 0, 0, 1] ([2, 0, 1, 3] vs [1, 2, 0, 3]).
    """
    ranks = check_shard_ranks(shard_ranks, world_size)
    positions: dict[int, deque[int]] = defaultdict(deque)
    for position, rank in enumerate(sorted(ranks)):
        positions[rank].append(position)
    return [positions[rank].popleft() for rank in ranks]


def equal_widths(embedding_dim: int, num_shards: int) -> list[int]:
    """torchrec's CW split: `num_shards` shards of `embedding_dim // num_shards` columns."""
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 1:
        raise ValueError(f"embedding_dim must be an int >= 1, got {embedding_dim!r}")
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be an int >= 1, got {num_shards!r}")
    if embedding_dim % num_shards:
        raise ValueError(
            f"embedding_dim {embedding_dim} is not divisible into {num_shards} equal shards; "
            f"pick a shard count dividing it or give widths explicitly"
        )
    return [embedding_dim // num_shards] * num_shards


def check_widths(widths: Sequence[int], embedding_dim: int, num_shards: int | None = None) -> list[int]:
    """Shard widths as a list, or a ValueError: positive ints summing to `embedding_dim`."""
    if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence) or not widths:
        raise ValueError(f"widths must be a non-empty list of column counts, got {widths!r}")
    widths = list(widths)
    bad = [w for w in widths if isinstance(w, bool) or not isinstance(w, int) or w < 1]
    if bad:
        raise ValueError(f"widths {widths} has {bad[0]!r}: each shard needs an int >= 1 columns")
    if num_shards is not None and len(widths) != num_shards:
        raise ValueError(f"widths {widths} has {len(widths)} entries for {num_shards} shards")
    if sum(widths) != embedding_dim:
        raise ValueError(f"widths {widths} sum to {sum(widths)}, not the embedding_dim {embedding_dim}")
    return widths


def _column_offsets(widths: Sequence[int]) -> list[int]:
    offsets = [0]
    for w in widths[:-1]:
        offsets.append(offsets[-1] + w)
    return offsets


def stitch_cw(rank_ordered_outputs: Sequence[torch.Tensor], shard_ranks: Sequence[int]) -> torch.Tensor:
    """Put rank-ordered shard outputs back in column order and concatenate them
    along the embedding (last) dim. Shards may have different widths."""
    ranks = check_shard_ranks(shard_ranks)
    if len(rank_ordered_outputs) != len(ranks):
        raise ValueError(
            f"got {len(rank_ordered_outputs)} shard outputs for shard_ranks {ranks} ({len(ranks)} shards)"
        )
    leading = {tuple(t.shape[:-1]) for t in rank_ordered_outputs}
    if len(leading) > 1:
        raise ValueError(f"shard outputs differ in their leading dims: {sorted(leading)}")
    permute = cw_permute_indices(ranks)
    return torch.cat([rank_ordered_outputs[p] for p in permute], dim=-1)


def concat_in_rank_order(rank_ordered_outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The naive stitching: concatenate in arrival order. Right only when
    `shard_ranks` is sorted; kept to show what goes wrong otherwise."""
    if not rank_ordered_outputs:
        raise ValueError("no shard outputs to concatenate")
    return torch.cat(list(rank_ordered_outputs), dim=-1)


def rank_ordered_shard_outputs(
    rows: torch.Tensor,
    shard_ranks: Sequence[int],
    widths: Sequence[int] | None = None,
) -> list[torch.Tensor]:
    """Cut looked-up `rows` ([n, D]) into column shards and return them in the
    order the ranks would send them back (`rank_order`); no communication."""
    ranks = check_shard_ranks(shard_ranks)
    dim = rows.shape[-1]
    widths = equal_widths(dim, len(ranks)) if widths is None else check_widths(widths, dim, len(ranks))
    shards = torch.split(rows, widths, dim=-1)
    return [shards[s] for s in rank_order(ranks)]


# ---------------------------------------------------------------- torchrec

# On CPU/gloo torchrec 1.8's default "dense" kernel corrupts the heap in
# ShardedEmbeddingCollection (see DESIGN.md); "fused" (FBGEMM's table-batched
# kernel with the optimizer fused into backward) runs. On CUDA "fused" is
# torchrec's usual choice for sharded tables.
COMPUTE_KERNELS = {"cpu": "fused", "cuda": "fused"}


def compute_kernel_for(device_type: str) -> str:
    """A compute kernel that runs ShardedEmbeddingCollection on `device_type`."""
    if device_type not in COMPUTE_KERNELS:
        raise ValueError(f"device_type {device_type!r} is not one of {list(COMPUTE_KERNELS)}")
    return COMPUTE_KERNELS[device_type]


def backend_for(device_type: str) -> str:
    """The process-group backend for a device: gloo on CPU, nccl on CUDA."""
    compute_kernel_for(device_type)  # validates the name
    return {"cpu": "gloo", "cuda": "nccl"}[device_type]


def _rank_device(group: dist.ProcessGroup | None = None) -> torch.device:
    # The launcher put nccl ranks on their own GPU; gloo ranks compute on CPU.
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


TORCHREC_CW_ALIGNMENT = 4  # column_wise() makes shards whose width is a multiple of this


def _torchrec_num_shards(embedding_dim: int, width: int) -> int:
    # torchrec.distributed.sharding_plan._find_base_dim: the first width >= the
    # asked one that divides embedding_dim and is a multiple of 4, else all of it.
    aligned = next(
        (w for w in range(width, embedding_dim) if embedding_dim % w == 0 and w % TORCHREC_CW_ALIGNMENT == 0),
        embedding_dim,
    )
    return embedding_dim // aligned


def _torchrec_shard_widths(
    embedding_dim: int,
    placements: Mapping[str, Sequence[int]],
    world_size: int,
) -> dict[str, int]:
    """The shard width of each table, checked against what torchrec's EC can do."""
    widths = {}
    for table, ranks in placements.items():
        ranks = check_shard_ranks(ranks, world_size)
        try:
            widths[table] = equal_widths(embedding_dim, len(ranks))[0]
        except ValueError as exc:
            raise ValueError(f"table {table!r}: {exc} (torchrec's CW needs equal widths)") from None
        # torchrec's column_wise() rounds a width up to a multiple of 4 (FBGEMM
        # alignment) and silently drops the ranks left without a shard.
        made = _torchrec_num_shards(embedding_dim, widths[table])
        if widths[table] % TORCHREC_CW_ALIGNMENT:
            raise ValueError(
                f"table {table!r}: {len(ranks)} shards of embedding_dim {embedding_dim} are "
                f"{widths[table]} columns wide; torchrec's column_wise() needs a multiple of "
                f"{TORCHREC_CW_ALIGNMENT} (it would make {made} shard{'s' * (made != 1)} "
                f"and drop the rest of shard_ranks {ranks})"
            )
    # torchrec's EC views every CW lookup as [-1, local_dim] with the first
    # table's width; other widths raise on some ranks ("Mixed dimension tables
    # only supported for pooling tables") while their peers wait in a collective.
    if len(set(widths.values())) > 1:
        raise ValueError(
            "torchrec's ShardedEmbeddingCollection needs one shard width for all "
            f"column-wise tables; got widths {widths} (embedding_dim {embedding_dim} "
            "split into different shard counts); use embnb's reference path for mixed widths"
        )
    return widths


def cw_sharding_plan(
    ec: EmbeddingCollection,
    placements: Mapping[str, Sequence[int]],
    world_size: int,
    device_type: str,
) -> EmbeddingModuleShardingPlan:
    """torchrec's EmbeddingModuleShardingPlan: each table of `ec` column-wise on
    `placements[table]` (a rank per shard), with a kernel that runs on `device_type`."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan

    tables = [config.name for config in ec.embedding_configs()]
    if sorted(placements) != sorted(tables):
        raise ValueError(f"placements name tables {sorted(placements)}; the collection has {tables}")
    _torchrec_shard_widths(ec.embedding_dim(), placements, world_size)
    kernel = compute_kernel_for(device_type)
    plan = construct_module_sharding_plan(
        ec,
        {t: column_wise(ranks=list(placements[t]), compute_kernel=kernel) for t in tables},
        sharder=EmbeddingCollectionSharder(),
        local_size=world_size,
        world_size=world_size,
        device_type=device_type,
    )
    for table in tables:  # torchrec must not have dropped or moved a shard
        if list(plan[table].ranks) != list(placements[table]):
            raise ValueError(
                f"torchrec planned table {table!r} on ranks {plan[table].ranks}, "
                f"not the shard_ranks {list(placements[table])} asked for"
            )
    return plan


def shard_cw(
    ec: EmbeddingCollection,
    placements: Mapping[str, Sequence[int]],
    group: dist.ProcessGroup | None = None,
) -> ShardedEmbeddingCollection:
    """A real ShardedEmbeddingCollection of `ec` over `group` (default: the
    world), holding `ec`'s weights. Collective: every rank of `group` calls it."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.types import ShardingEnv

    group = group or dist.group.WORLD
    device = _rank_device(group)
    plan = cw_sharding_plan(ec, placements, dist.get_world_size(group), device.type)
    if group == dist.group.WORLD:
        env = ShardingEnv.from_process_group(group)
    else:
        # from_process_group builds a DeviceMesh through a world-collective
        # new_group that only this subgroup's ranks would call: the next
        # new_group anywhere then hangs. The mesh only serves DTensor outputs
        # (output_dtensor=True), so a subgroup gets an env without one.
        env = ShardingEnv(dist.get_world_size(group), dist.get_rank(group), None)
        env.process_group = group
    sharded = EmbeddingCollectionSharder().shard(ec, plan, env=env, device=device)
    sharded.load_state_dict(ec.state_dict())
    return sharded


def torchrec_permute_indices(sharded: ShardedEmbeddingCollection) -> dict[str, list[int]]:
    """The permute indices torchrec computed, per output name (feature, or
    feature@table for a feature shared by tables). A private torchrec field."""
    return {name: list(p) for name, p in sharded._features_to_permute_indices.items()}


# ---------------------------------------------------------------- cases


@dataclass(frozen=True)
class TableSpec:
    """One table of an EmbeddingCollection: rows and the features it serves."""

    name: str
    num_embeddings: int
    feature_names: tuple[str, ...]


@dataclass
class CWCase:
    """An EmbeddingCollection, a CW placement per table and a batch per rank.

    `widths[table]` gives uneven shard widths (embnb's path only); tables
    missing from it get torchrec's equal split. `paths` picks what runs:
    "reference" (embnb's own lookup) and/or "torchrec".
    """

    world_size: int
    embedding_dim: int
    tables: tuple[TableSpec, ...]
    placements: dict[str, list[int]]
    widths: dict[str, list[int]] = field(default_factory=dict)
    paths: tuple[str, ...] = ("reference", "torchrec")
    batch_size: int = 4
    max_length: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        names = [t.name for t in self.tables]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"tables must be non-empty with unique names, got {names}")
        sizes = {
            "batch_size": (self.batch_size, 1),
            "max_length": (self.max_length, 0),
            **{f"{t.name}.num_embeddings": (t.num_embeddings, 1) for t in self.tables},
        }
        for what, (value, least) in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{what} must be an int >= {least}, got {value!r}")
        if sorted(self.placements) != sorted(names):
            raise ValueError(f"placements name tables {sorted(self.placements)}; tables are {names}")
        unknown = sorted(set(self.widths) - set(names))
        if unknown:
            raise ValueError(f"widths name unknown tables {unknown}; tables are {names}")
        for table in self.tables:
            if not table.feature_names:
                raise ValueError(f"table {table.name!r} has no feature_names")
            check_shard_ranks(self.placements[table.name], self.world_size)
            self.shard_widths(table.name)  # raises on widths that do not fit
        bad_paths = [p for p in self.paths if p not in ("reference", "torchrec")]
        if bad_paths or not self.paths:
            raise ValueError(f"paths {self.paths!r}: each must be 'reference' or 'torchrec'")
        if "torchrec" in self.paths:
            if self.widths and any(len(set(w)) > 1 for w in self.widths.values()):
                raise ValueError(
                    f"uneven widths {self.widths}: torchrec's ShardedEmbeddingCollection cuts "
                    "equal widths only; run them with paths=('reference',) (embnb's path)"
                )
            _torchrec_shard_widths(self.embedding_dim, self.placements, self.world_size)

    def shard_widths(self, table: str) -> list[int]:
        ranks = self.placements[table]
        if table in self.widths:
            return check_widths(self.widths[table], self.embedding_dim, len(ranks))
        return equal_widths(self.embedding_dim, len(ranks))

    def feature_names(self) -> list[str]:
        """Every feature once, in the order tables name them (the KJT's keys)."""
        return list(dict.fromkeys(f for t in self.tables for f in t.feature_names))

    def output_tables(self) -> dict[str, str]:
        """EmbeddingCollection's output names -> table: the feature's name, or
        feature@table when several tables read the feature."""
        readers = [f for t in self.tables for f in t.feature_names]
        return {
            (f if readers.count(f) == 1 else f"{f}@{t.name}"): t.name
            for t in self.tables
            for f in t.feature_names
        }


def make_embedding_collection(case: CWCase, device: torch.device | str = "cpu") -> EmbeddingCollection:
    """The unsharded torchrec EmbeddingCollection of `case`, its weights drawn
    from `case.seed` (the same on every rank and in the parent)."""
    from torchrec import EmbeddingCollection, EmbeddingConfig

    configs = [
        EmbeddingConfig(
            name=t.name,
            embedding_dim=case.embedding_dim,
            num_embeddings=t.num_embeddings,
            feature_names=list(t.feature_names),
        )
        for t in case.tables
    ]
    ec = EmbeddingCollection(tables=configs, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(case.seed)
    with torch.no_grad():
        for table in case.tables:
            weight = ec.embeddings[table.name].weight
            weight.copy_(torch.randn(weight.shape, generator=generator))
    return ec.to(device)


Batch = dict[str, tuple[torch.Tensor, torch.Tensor]]  # feature -> (lengths, ids)


def make_batches(case: CWCase) -> list[Batch]:
    """One batch per rank: for each feature `batch_size` sequences of 0 to
    `max_length` ids, valid in every table that reads the feature."""
    rows = {
        f: min(t.num_embeddings for t in case.tables if f in t.feature_names) for f in case.feature_names()
    }
    batches = []
    for rank in range(case.world_size):
        generator = torch.Generator().manual_seed(case.seed * 1000 + rank + 1)
        batch = {}
        for feature in case.feature_names():
            lengths = torch.randint(0, case.max_length + 1, (case.batch_size,), generator=generator)
            ids = torch.randint(0, rows[feature], (int(lengths.sum()),), generator=generator)
            batch[feature] = (lengths, ids)
        batches.append(batch)
    return batches


def to_kjt(batch: Batch, device: torch.device | str = "cpu") -> KeyedJaggedTensor:
    """A KeyedJaggedTensor of a batch, keys in the batch's order."""
    from torchrec import KeyedJaggedTensor

    keys = list(batch)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.cat([batch[k][1] for k in keys]).to(device),
        lengths=torch.cat([batch[k][0] for k in keys]).to(device),
    )


def _plain(outputs: Mapping[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    # JaggedTensor -> (lengths, values) on CPU, so results pickle anywhere.
    return {name: (jt.lengths().cpu(), jt.values().detach().cpu()) for name, jt in outputs.items()}


def unsharded_outputs(case: CWCase) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """What the unsharded EmbeddingCollection returns for each rank's batch."""
    ec = make_embedding_collection(case)
    with torch.no_grad():
        return [_plain(ec(to_kjt(batch))) for batch in make_batches(case)]


# ---------------------------------------------------------------- embnb's CW lookup


def cw_sequence_lookup(
    ids: torch.Tensor,
    local_shards: Mapping[int, torch.Tensor],
    shard_ranks: Sequence[int],
    widths: Sequence[int],
    group: dist.ProcessGroup | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Column-wise lookup of this rank's `ids` in one table, over `group`.

    `local_shards[s]` is column shard `s` ([num_embeddings, widths[s]]) for
    each shard this rank holds. Every rank of `group` calls this together:
    ids go to every rank (all_to_all), each rank looks them up in its shards,
    the shard outputs come back (all_to_all) in rank order and are stitched.
    `dtype` is the weights' (a rank holding no shard still receives rows).
    Returns (rows [len(ids), D], the rank-ordered shard outputs).
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    ranks = check_shard_ranks(shard_ranks, world_size)
    widths = check_widths(widths, sum(widths), len(ranks))
    mine = [s for s in range(len(ranks)) if ranks[s] == rank]
    if sorted(local_shards) != mine:
        raise ValueError(f"rank {rank} holds shards {sorted(local_shards)}; shard_ranks {ranks} say {mine}")
    wrong = {s: t.shape[1] for s, t in local_shards.items() if t.shape[1] != widths[s]}
    if wrong:
        raise ValueError(f"local shards have widths {wrong}; widths {widths} say otherwise")
    device = ids.device

    # 1. Every rank needs every rank's ids: CW shards cover all rows.
    count = torch.tensor([ids.numel()], device=device)
    counts = [torch.zeros_like(count) for _ in range(world_size)]
    dist.all_gather(counts, count, group=group)
    counts = [int(c.item()) for c in counts]
    all_ids = torch.empty(sum(counts), dtype=ids.dtype, device=device)
    dist.all_to_all_single(all_ids, ids.repeat(world_size), counts, [ids.numel()] * world_size, group=group)

    # 2. Look them up in the shards held here, in shard (column) order.
    my_width = sum(widths[s] for s in mine)
    blocks = [
        torch.cat([local_shards[s][src_ids] for s in mine], dim=1)
        if mine
        else torch.empty(len(src_ids), 0, dtype=dtype, device=device)
        for src_ids in torch.split(all_ids, counts)
    ]
    send = (
        torch.cat([b.reshape(-1) for b in blocks]) if blocks else torch.empty(0, dtype=dtype, device=device)
    )

    # 3. Send each requester its rows; they arrive ordered by owner rank.
    owner_widths = [sum(widths[s] for s in range(len(ranks)) if ranks[s] == r) for r in range(world_size)]
    recv = torch.empty(ids.numel() * sum(widths), dtype=dtype, device=device)
    dist.all_to_all_single(
        recv, send, [ids.numel() * w for w in owner_widths], [c * my_width for c in counts], group=group
    )
    per_owner = torch.split(recv, [ids.numel() * w for w in owner_widths])
    rank_ordered = []
    for owner, chunk in enumerate(per_owner):
        shards = [s for s in range(len(ranks)) if ranks[s] == owner]
        rank_ordered += torch.split(
            chunk.view(ids.numel(), owner_widths[owner]), [widths[s] for s in shards], dim=1
        )
    return stitch_cw(rank_ordered, ranks), list(rank_ordered)


def reference_cw_forward(
    case: CWCase,
    ec: EmbeddingCollection,
    features: KeyedJaggedTensor,
    group: dist.ProcessGroup | None = None,
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict[str, list[torch.Tensor]]]:
    """embnb's CW forward of `case` for this rank's KeyedJaggedTensor: per
    output name (as EmbeddingCollection names them), (lengths, rows) and the
    rank-ordered shard outputs. Each rank keeps only its own column shards
    of `ec`'s weights. Collective over `group`.
    """
    rank = dist.get_rank(group)
    local = {}
    for table in case.tables:
        ranks, widths = case.placements[table.name], case.shard_widths(table.name)
        weight = ec.embeddings[table.name].weight.detach()
        offsets = _column_offsets(widths)
        local[table.name] = {
            s: weight[:, offsets[s] : offsets[s] + widths[s]].clone()
            for s in range(len(ranks))
            if ranks[s] == rank
        }
    outputs, rank_ordered = {}, {}
    for name, table in case.output_tables().items():
        jt = features[name.split("@")[0]]
        rows, shards = cw_sequence_lookup(
            jt.values(),
            local[table],
            case.placements[table],
            case.shard_widths(table),
            group,
            ec.embeddings[table].weight.dtype,
        )
        outputs[name] = (jt.lengths().cpu(), rows.cpu())
        rank_ordered[name] = [s.cpu() for s in shards]
    return outputs, rank_ordered


def cw_cases_on_rank(rank: int, world_size: int, cases: Sequence[CWCase]) -> list[dict[str, Any] | None]:
    """Per-rank function for `embnb.dist.launch`: run every case on a process
    group of its own world size (ranks 0..case.world_size-1; one launch serves
    many world sizes). None for cases this rank is not part of."""
    results: list[dict[str, Any] | None] = [None] * len(cases)
    for size in sorted({c.world_size for c in cases}):
        # new_group is collective over the whole world, members or not.
        group = dist.group.WORLD if size == world_size else dist.new_group(list(range(size)))
        if rank < size:
            device = _rank_device(group)
            for i, case in enumerate(cases):
                if case.world_size == size:
                    results[i] = _run_case(case, rank, group, device)
        dist.barrier()
    return results


def _run_case(case: CWCase, rank: int, group: dist.ProcessGroup, device: torch.device) -> dict[str, Any]:
    ec = make_embedding_collection(case, device)
    features = to_kjt(make_batches(case)[rank], device)
    result: dict[str, Any] = {"device": device.type}
    with torch.no_grad():
        if "reference" in case.paths:
            result["reference"], result["rank_ordered"] = reference_cw_forward(case, ec, features, group)
        if "torchrec" in case.paths:
            sharded = shard_cw(ec, case.placements, group)
            result["torchrec"] = _plain(sharded(features).wait())
            result["torchrec_permute"] = torchrec_permute_indices(sharded)
            result["compute_kernel"] = compute_kernel_for(device.type)
    return result


@dataclass
class CWRun:
    """A case's outputs on every rank (index = rank), next to the unsharded
    EmbeddingCollection's. Each output: name -> (lengths, values)."""

    case: CWCase
    expected: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]
    ranks: list[dict[str, Any]]

    def _matches(self, path: str) -> bool:
        for want, got in zip(self.expected, self.ranks):
            if path not in got or sorted(got[path]) != sorted(want):
                return False
            for name, (lengths, values) in want.items():
                if not (torch.equal(got[path][name][0], lengths) and torch.equal(got[path][name][1], values)):
                    return False
        return True

    def reference_matches(self) -> bool:
        """embnb's CW lookup equals the unsharded EC on every rank, exactly."""
        return self._matches("reference")

    def torchrec_matches(self) -> bool:
        """torchrec's ShardedEmbeddingCollection equals the unsharded EC, exactly."""
        return self._matches("torchrec")

    def naive_matches(self) -> bool:
        """Concatenating shard outputs in arrival (rank) order equals the unsharded EC."""
        return all(
            torch.equal(concat_in_rank_order(got["rank_ordered"][name]), values)
            for want, got in zip(self.expected, self.ranks)
            for name, (_, values) in want.items()
        )

    def max_abs_error(self, path: str) -> float:
        """Largest |output - unsharded| over ranks and outputs ("naive" for rank-order concat)."""
        worst = 0.0
        for want, got in zip(self.expected, self.ranks):
            for name, (_, values) in want.items():
                out = (
                    concat_in_rank_order(got["rank_ordered"][name]) if path == "naive" else got[path][name][1]
                )
                if values.numel():
                    worst = max(worst, float((out - values).abs().max()))
        return worst


def run_cw_cases(cases: Sequence[CWCase], device: str = "auto", timeout_s: float = 300.0) -> list[CWRun]:
    """Run `cases` on real ranks in one `embnb.dist.launch` (gloo on CPU, nccl
    with a GPU per rank), and pair each with the unsharded EC's outputs."""
    from embnb.dist import launch

    cases = list(cases)
    if not cases:
        raise ValueError("cases is empty: nothing to run")
    world_size = max(c.world_size for c in cases)
    device_type = resolve_device(device, world_size)
    per_rank = launch(
        cw_cases_on_rank, world_size, cases, backend=backend_for(device_type), timeout_s=timeout_s
    )
    return [
        CWRun(case, unsharded_outputs(case), [per_rank[r][i] for r in range(case.world_size)])
        for i, case in enumerate(cases)
    ]

"""torchrec's side of column-wise sharding: the plan (`cw_sharding_plan`, checked first by
`check_torchrec_placements`: what torchrec's column_wise() and EC can take, with a message that says
why, in the parent before any rank starts), the sharded module (`shard_cw`), the permute indices and
the compute kernels torchrec built in it. torchrec is imported where used, so importing this module
stays light.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from embnb._checks import check_choice
from embnb.columnwise.placement import check_shard_ranks, equal_widths
from embnb.dist import rank_device

if TYPE_CHECKING:
    from torchrec import EmbeddingCollection
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

__all__ = [
    "COMPUTE_KERNEL",
    "TORCHREC_CW_ALIGNMENT",
    "compute_kernels",
    "fbgemm_cuda_problem",
    "torchrec_num_shards",
    "check_torchrec_placements",
    "cw_sharding_plan",
    "place_on_devices",
    "shard_cw",
    "torchrec_permute_indices",
]


# On CPU/gloo torchrec 1.8's default "dense" kernel corrupts the heap in ShardedEmbeddingCollection
# ("Split sizes doesn't match", heap corruption); "fused" (FBGEMM's table-batched kernel with the
# optimizer fused into backward) runs. On CUDA "fused" is torchrec's usual choice for sharded tables.
COMPUTE_KERNEL = "fused"


def fbgemm_cuda_problem(gpu_visible: bool | None = None) -> str | None:
    """Why torchrec's sharded modules cannot run on CUDA here, or None.

    They need FBGEMM's CUDA kernels; the fbgemm-gpu-cpu wheel (what the GPU
    kit carries: the CUDA wheel is hundreds of MB) has none. `gpu_visible`
    overrides torch.cuda.is_available() (to test the rule without a GPU).
    """
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm.*)

    if not (torch.cuda.is_available() if gpu_visible is None else gpu_visible):
        return "no CUDA GPU is visible"
    op = "fbgemm::block_bucketize_sparse_features"  # any op: a CUDA build registers CUDA kernels
    if not torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA"):
        return "this fbgemm build has no CUDA kernels (fbgemm-gpu-cpu)"
    return None


def compute_kernels(sharded: ShardedEmbeddingCollection) -> list[str]:
    """The compute kernels (torchrec's `EmbeddingComputeKernel` values, e.g. "fused") of the
    table-batched modules torchrec built in the lookups of a sharded module, as their `config` says,
    sorted; empty on a rank that holds no shard. Its lookups are a private field."""
    from torchrec.distributed.batched_embedding_kernel import BaseBatchedEmbedding, BaseBatchedEmbeddingBag

    from embnb._torchrec_private import lookups

    batched = [m for lookup in lookups(sharded) for m in lookup.modules()]
    kinds = (BaseBatchedEmbedding, BaseBatchedEmbeddingBag)
    return sorted({m.config.compute_kernel.value for m in batched if isinstance(m, kinds)})


TORCHREC_CW_ALIGNMENT = 4  # column_wise() makes shards whose width is a multiple of this


def torchrec_num_shards(embedding_dim: int, width: int) -> int:
    """How many shards torchrec's column_wise() makes when asked for `width` columns each."""
    # torchrec.distributed.sharding_plan._find_base_dim: the first width >= the
    # asked one that divides embedding_dim and is a multiple of 4, else all of it.
    aligned = next(
        (w for w in range(width, embedding_dim) if embedding_dim % w == 0 and w % TORCHREC_CW_ALIGNMENT == 0),
        embedding_dim,
    )
    return embedding_dim // aligned


def check_torchrec_placements(
    embedding_dim: int,
    placements: Mapping[str, Sequence[int]],
    world_size: int,
    widths: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, int]:
    """The shard width of each table, or a ValueError saying why torchrec's
    ShardedEmbeddingCollection cannot take these placements (and `widths`,
    explicit shard widths by table, which must be equal within a table)."""
    if widths and any(len(set(w)) > 1 for w in widths.values()):
        raise ValueError(
            f"uneven widths {dict(widths)}: embnb's check refuses them for torchrec, whose "
            "ShardedEmbeddingCollection fails in its output all-to-all with uneven "
            "column_wise(size_per_rank=...) shards (appendix 02a, section 2, runs it); "
            "run them with paths=('reference',) (embnb's path)"
        )
    widths = {}
    for table, ranks in placements.items():
        ranks = check_shard_ranks(ranks, world_size)
        try:
            widths[table] = equal_widths(embedding_dim, len(ranks))[0]
        except ValueError as exc:
            raise ValueError(f"table {table!r}: {exc} (torchrec's CW needs equal widths)") from None
        # torchrec's column_wise() rounds a width up to a multiple of 4 (FBGEMM
        # alignment) and silently drops the ranks left without a shard.
        made = torchrec_num_shards(embedding_dim, widths[table])
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
    `placements[table]` (a rank per shard), with a kernel that runs on `device_type`.
    Raises ValueError where torchrec's column_wise() would not make these shards
    (`check_torchrec_placements`) or did not."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan

    tables = [config.name for config in ec.embedding_configs()]
    if sorted(placements) != sorted(tables):
        raise ValueError(f"placements name tables {sorted(placements)}; the collection has {tables}")
    check_choice("device_type", device_type, ("cpu", "cuda"))
    check_torchrec_placements(ec.embedding_dim(), placements, world_size)
    generators = {t: column_wise(ranks=list(placements[t]), compute_kernel=COMPUTE_KERNEL) for t in tables}
    plan = construct_module_sharding_plan(
        ec,
        generators,
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


def place_on_devices(plan: EmbeddingModuleShardingPlan, devices: Sequence[str]) -> None:
    """Put each shard of `plan` on the device its rank uses, `devices[rank]`.
    torchrec places rank r on "cuda:r" (one GPU per rank, local_size ranks a
    host); ranks that share a GPU all use cuda:0, and torchrec refuses a local
    shard whose tensor is not on its placement's device."""
    for sharding in plan.values():
        spec = sharding.sharding_spec
        spec.shards = [  # ShardMetadata parses a "rank:r/device" string
            dataclasses.replace(s, placement=f"rank:{s.placement.rank()}/{devices[s.placement.rank()]}")
            for s in spec.shards
        ]


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
    device = rank_device(group)
    plan = cw_sharding_plan(ec, placements, dist.get_world_size(group), device.type)
    if device.type == "cuda":  # ranks may share a GPU: each shard placed on its rank's real device
        devices: list[str | None] = [None] * dist.get_world_size(group)
        dist.all_gather_object(devices, str(device), group=group)
        place_on_devices(plan, devices)
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
    from embnb._torchrec_private import features_to_permute_indices

    return {name: list(p) for name, p in features_to_permute_indices(sharded).items()}

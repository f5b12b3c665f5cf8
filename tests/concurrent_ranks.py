"""The same step in a real concurrent job: torchrec's ShardedEmbeddingBagCollection
on every rank of a real process group (`embnb.dist.launch`), one step, with
every TBE it built and every collective it ran recorded.

Per rank, a forward pre-hook on each FBGEMM TBE inside the sharded module's
lookups records the ids it reads; `kernel_signature` records what the TBE
is. Collectives are recorded by wrapping torch.distributed's functions
torchrec calls (tensor sizes in and out, then the real call).

    per_rank = launch(sharded_rank, 2, tables, constraints, plan, 256)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from embnb._torchrec_private import lookups
from embnb.steptime.batch import make_batch
from embnb.steptime.kernels import DEFAULT_OPTIMIZER

__all__ = ["ConcurrentRank", "RecordedCollective", "sharded_rank", "kernel_signature", "COLLECTIVES"]

# torch.distributed functions torchrec 1.8.0's EmbeddingBagCollection
# shardings call (torchrec/distributed/dist_data.py, comm_ops.py)
COLLECTIVES = (
    "all_to_all_single",
    "reduce_scatter_tensor",
    "reduce_scatter",
    "all_gather_into_tensor",
    "all_gather",
    "all_reduce",
)


@dataclass(frozen=True)
class RecordedCollective:
    """One collective a rank ran: its kind and the bytes it handed in and got back."""

    kind: str
    sent_bytes: int
    received_bytes: int


@dataclass(frozen=True)
class ConcurrentRank:
    """One rank of the concurrent job's step: its collectives; what each
    TBE read (a count and a checksum of its ids) and what kernel it is."""

    rank: int
    collectives: list[RecordedCollective]
    lookup_inputs: dict[tuple[str, ...], tuple[int, int]]  # each TBE's tables -> (ids it read, their sum)
    lookup_kernels: dict[tuple[str, ...], tuple]  # each TBE's tables -> kernel_signature


def kernel_signature(tbe: torch.nn.Module) -> tuple:
    """What decides a TBE's work besides its ids: its class, each table's
    (rows, cols), the feature-to-table layout, pooling, precision, the fused
    optimizer, its learning rate and arguments, and the shape of every
    parameter and state buffer."""
    optimizer = getattr(tbe, "optimizer", None)
    learning_rate = tbe.get_learning_rate() if optimizer is not None else None
    return (
        type(tbe).__name__,
        [tuple(spec[:2]) for spec in tbe.embedding_specs],
        tbe.D_offsets.tolist(),
        tbe.hash_size_cumsum.tolist(),
        str(tbe.pooling_mode),
        str(tbe.weights_precision),
        str(optimizer),
        learning_rate,
        repr(getattr(tbe, "optimizer_args", None)),
        sorted((name, tuple(t.shape)) for name, t in [*tbe.named_parameters(), *tbe.named_buffers()]),
    )


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _record(log: list[RecordedCollective]) -> dict:
    """Wrap torch.distributed's collectives so each call is logged; returns the originals."""
    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def wrap(name, real):
        def call(*args, **kwargs):
            names = {"all_to_all_single": ("output", "input"), "all_reduce": ("tensor", "tensor")}
            out_name, in_name = names.get(name, ("output", "input"))
            if name in ("reduce_scatter", "all_gather"):
                out_name, in_name = (
                    ("output", "input_list") if name == "reduce_scatter" else ("tensor_list", "tensor")
                )
            out = kwargs.get(out_name, args[0] if args else None)
            inp = kwargs.get(in_name, args[1] if len(args) > 1 else out)
            log.append(RecordedCollective(name, _nbytes(inp), _nbytes(out)))
            return real(*args, **kwargs)

        return call

    for name, real in originals.items():
        setattr(dist, name, wrap(name, real))
    return originals


class _TBERecorder:
    """Each TBE's tables, its kernel signature, and what it read."""

    def __init__(self, lookups: Sequence[torch.nn.Module]) -> None:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            DenseTableBatchedEmbeddingBagsCodegen,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        kinds = (SplitTableBatchedEmbeddingBagsCodegen, DenseTableBatchedEmbeddingBagsCodegen)
        # each TBE's tables, from the torchrec kernel holding it (a dense TBE keeps no table names)
        self.tables = {
            id(kernel.emb_module): tuple(t.name for t in kernel.config.embedding_tables)
            for lookup in lookups
            for kernel in lookup.modules()
            if isinstance(getattr(kernel, "emb_module", None), kinds)
        }
        tbes = [m for lookup in lookups for m in lookup.modules() if isinstance(m, kinds)]
        self.kernels = {self.tables[id(tbe)]: kernel_signature(tbe) for tbe in tbes}
        self.inputs: dict[tuple[str, ...], tuple[int, int]] = {}  # tables -> (ids, their sum)
        for tbe in tbes:
            tbe.register_forward_pre_hook(self._read, with_kwargs=True)

    def _read(self, module, args, kwargs) -> None:
        indices = args[0] if args else kwargs["indices"]
        self.inputs[self.tables[id(module)]] = (int(indices.numel()), int(indices.sum()))


def sharded_rank(
    rank: int,
    world_size: int,
    tables: Sequence[EmbeddingBagConfig],
    constraints: Mapping[str, ParameterConstraints] | None,
    plan: ShardingPlan,
    local_batch_size: int,
    seed: int = 0,
    optimizer: str = DEFAULT_OPTIMIZER,
    learning_rate: float = 0.01,
    devices_per_host: int | None = None,
) -> ConcurrentRank:
    """A rank of the concurrent job (for `embnb.dist.launch`): torchrec's sharded
    EmbeddingBagCollection under `plan`, fed this rank's local batch of
    `make_batch(tables, constraints, world_size, local_batch_size, seed)`,
    one step forward and backward (loss: the sum of its pooled output).
    `devices_per_host`: torchrec sees hosts of that many ranks (its
    LOCAL_WORLD_SIZE), for table-row-wise and grid shards."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from embnb.dist import rank_device
    from embnb.steptime.work import module_plan

    device = rank_device()
    ebc = EmbeddingBagCollection(tables=list(tables), device=torch.device("meta"))
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType(optimizer), "learning_rate": learning_rate}
    )
    launched = {key: os.environ[key] for key in ("LOCAL_WORLD_SIZE", "LOCAL_RANK")}
    if devices_per_host:  # read by torchrec's get_local_size when the shardings make their host groups
        os.environ.update(LOCAL_WORLD_SIZE=str(devices_per_host), LOCAL_RANK=str(rank % devices_per_host))
    try:
        sharded = sharder.shard(
            ebc, module_plan(plan), env=ShardingEnv.from_process_group(dist.group.WORLD), device=device
        )
    finally:
        os.environ.update(launched)
    kjt = make_batch(tables, constraints, world_size, local_batch_size, seed).kjt(rank, device)
    recorder = _TBERecorder(lookups(sharded))  # a plain list in torchrec 1.8.0, not submodules
    log: list[RecordedCollective] = []
    originals = _record(log)
    try:
        sharded(kjt).values().sum().backward()
    finally:
        for name, real in originals.items():
            setattr(dist, name, real)
    return ConcurrentRank(rank, log, recorder.inputs, recorder.kernels)

"""The same step in a real concurrent job: torchrec's ShardedEmbeddingBagCollection
on every rank of a real process group (`embnb.dist.launch`), timed the same
way as the rank-by-rank measurement, and every collective it runs recorded.

Per rank, forward pre/post hooks on each FBGEMM TBE inside the sharded
module's lookups, and pre/post hooks on the autograd node of its output,
read the calling thread's CPU time (`time.thread_time_ns`): the kernels'
own forward and backward (the fused optimizer included), not the
collectives, which gloo runs on its own threads. Collectives are recorded
by wrapping torch.distributed's functions torchrec calls (tensor sizes in
and out, then the real call).

    per_rank = launch(sharded_rank, 2, tables, constraints, plan, 256, 0, ...)
"""

from __future__ import annotations

import os
import time
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

__all__ = ["ConcurrentRank", "RecordedCollective", "sharded_rank", "COLLECTIVES"]

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
    """One rank of the concurrent job: per timed step, the TBEs' summed
    forward and backward thread CPU seconds; the collectives of one step;
    what each TBE read (a count and a checksum of its ids)."""

    rank: int
    threads: int
    lookup_forward_cpu_s: list[float]
    lookup_backward_cpu_s: list[float]
    collectives: list[RecordedCollective]
    lookup_inputs: dict[tuple[str, ...], tuple[int, int]]  # each TBE's tables -> (ids it read, their sum)

    @property
    def lookup_cpu_s(self) -> list[float]:
        return [f + b for f, b in zip(self.lookup_forward_cpu_s, self.lookup_backward_cpu_s)]


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


class _TBETimer:
    """Thread CPU time of every TBE's forward and of its output's backward node."""

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
        self.tbes = [m for lookup in lookups for m in lookup.modules() if isinstance(m, kinds)]
        self.forward_ns = self.backward_ns = 0
        self.inputs: dict[tuple[str, ...], tuple[int, int]] = {}  # tables -> (ids, their sum)
        self._start: dict[int, int] = {}
        for tbe in self.tbes:
            tbe.register_forward_pre_hook(self._before, with_kwargs=True)
            tbe.register_forward_hook(self._after)

    def _before(self, module, args, kwargs) -> None:
        indices = args[0] if args else kwargs["indices"]
        self.inputs[self.tables[id(module)]] = (int(indices.numel()), int(indices.sum()))
        self._start[id(module)] = time.thread_time_ns()

    def _after(self, module, inputs, output) -> None:
        self.forward_ns += time.thread_time_ns() - self._start.pop(id(module))
        node = output.grad_fn
        began = {}
        node.register_prehook(lambda grads: began.setdefault("t", time.thread_time_ns()) and None)

        def done(grad_inputs, grad_outputs) -> None:
            self.backward_ns += time.thread_time_ns() - began["t"]

        node.register_hook(done)

    def take(self) -> tuple[float, float]:
        taken = (self.forward_ns / 1e9, self.backward_ns / 1e9)
        self.forward_ns = self.backward_ns = 0
        return taken


def sharded_rank(
    rank: int,
    world_size: int,
    tables: Sequence[EmbeddingBagConfig],
    constraints: Mapping[str, ParameterConstraints] | None,
    plan: ShardingPlan,
    local_batch_size: int,
    seed: int,
    threads: int,
    warmup: int,
    repeats: int,
    optimizer: str = DEFAULT_OPTIMIZER,
    learning_rate: float = 0.01,
    devices_per_host: int | None = None,
) -> ConcurrentRank:
    """A rank of the concurrent job (for `embnb.dist.launch`): torchrec's sharded
    EmbeddingBagCollection under `plan`, fed this rank's local batch of
    `make_batch(tables, constraints, world_size, local_batch_size, seed)`,
    forward and backward (loss: the sum of its pooled output) `warmup +
    repeats` times, with `threads` intra-op threads. `devices_per_host`:
    torchrec sees hosts of that many ranks (its LOCAL_WORLD_SIZE), for
    table-row-wise and grid shards."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from embnb.dist import rank_device
    from embnb.steptime.work import module_plan

    torch.set_num_threads(threads)
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
    timer = _TBETimer(lookups(sharded))  # a plain list in torchrec 1.8.0, not submodules
    forward, backward, log = [], [], []
    for step in range(warmup + repeats):
        last = step == warmup + repeats - 1
        originals = _record(log) if last else None
        try:
            sharded(kjt).values().sum().backward()
            dist.barrier()  # every rank's step done before the next (as the rank-by-rank run: one at a time)
        finally:
            if originals:
                for name, real in originals.items():
                    setattr(dist, name, real)
        f, b = timer.take()
        if step >= warmup:
            forward.append(f)
            backward.append(b)
    return ConcurrentRank(rank, torch.get_num_threads(), forward, backward, log, timer.inputs)

"""Per-rank functions for tests/rowwise/test_sharders_edges.py: edge batches a real loader produces,
under the routed sharders and torchrec's own row-wise sharding (spawned ranks import them from here).

Each rank builds the same two-table module (an EmbeddingBagCollection, "a" sum- and "b" mean-pooled,
or an EmbeddingCollection), shards it row-wise under DistributedModelParallel with the fused kernel
(a routed sharder with one routing for both tables, or torchrec's sharder with row_wise offered on
CPU), loads the unsharded module's rows, and runs its batch of one edge case: the forward output
and, for an EBC, the tables after one fused SGD step (in id order); or the error raised, then one
step on an ordinary batch (what the ranks do next, in step with each other).
"""

from __future__ import annotations

import torch
from sharder_ranks import LR, Model, flat_output, make_module, output_grad, table_weight
from torch import nn
from torchrec import KeyedJaggedTensor
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from torchrec.distributed.types import ShardingPlan

from embnb.rowwise import (
    RoutedEmbeddingBagCollectionSharder,
    RoutedEmbeddingCollectionSharder,
    TableLayout,
    convert_rows,
    gather_rows,
    load_rows,
)

ROWS = {"a": 7, "b": 5}  # not multiples of W = 2 or 3: the round-robin tables have padding rows
BATCH = 3
CASES = (
    "fewer",  # rank r has BATCH - r samples
    "empty_rank",  # the last rank has no samples
    "no_ids",  # the last rank has BATCH samples and no ids
    "empty_feature",  # feature f_b has no ids on any rank
    "id_past_end",  # the last rank holds id 7 of table a (7 rows)
    "id_negative",  # rank 0 holds id -1 of table b, the last rank id 7 of table a
)
ORDINARY = "ordinary"  # BATCH samples, every id in range


def edge_batch(case: str, rank: int, world_size: int, seed: int) -> KeyedJaggedTensor:
    """This rank's batch of `case` (features f_a, f_b; 1-3 ids per bag but where the case says)."""
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    last = rank == world_size - 1
    batch = {"fewer": BATCH - rank, "empty_rank": 0 if last else BATCH}.get(case, BATCH)
    lengths, values = [], []
    for name, n in ROWS.items():
        per_sample = torch.randint(1, 4, (batch,), generator=gen)
        if (case == "empty_feature" and name == "b") or (case == "no_ids" and last):
            per_sample = torch.zeros(batch, dtype=torch.int64)
        lengths.append(per_sample)
        values.append(torch.randint(0, n, (int(per_sample.sum()),), generator=gen))
    if case in ("id_past_end", "id_negative") and last:
        values[0][-1] = ROWS["a"]
    if case == "id_negative" and rank == 0:
        values[1][0] = -1
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{name}" for name in ROWS], values=torch.cat(values), lengths=torch.cat(lengths)
    )


class _CpuRowWiseEBCSharder(EmbeddingBagCollectionSharder):
    """torchrec's sharder with row_wise offered on CPU (torchrec 1.8 offers it for CUDA only)."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = super().sharding_types(compute_device_type)
        return types if "row_wise" in types else [*types, "row_wise"]


class _CpuRowWiseECSharder(EmbeddingCollectionSharder):
    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = super().sharding_types(compute_device_type)
        return types if "row_wise" in types else [*types, "row_wise"]


def _sgd() -> dict:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}


def sharded_model(kind: str, routing: str, world_size: int, seed: int) -> nn.Module:
    """The module of `kind` row-wise over the ranks under `routing` ("torchrec": torchrec's own
    sharder), its rows the unsharded module's."""
    module = make_module(kind, ROWS, seed)
    if routing == "torchrec":
        sharder = (_CpuRowWiseEBCSharder if kind == "ebc" else _CpuRowWiseECSharder)(fused_params=_sgd())
    else:
        routed = RoutedEmbeddingBagCollectionSharder if kind == "ebc" else RoutedEmbeddingCollectionSharder
        sharder = routed(dict.fromkeys(ROWS, routing), fused_params=_sgd())
    plan = construct_module_sharding_plan(
        module,
        {name: row_wise(compute_kernel="fused") for name in ROWS},
        sharder=sharder,
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
    )
    model = DistributedModelParallel(
        Model(module), sharders=[sharder], plan=ShardingPlan({"tables": plan}), device=torch.device("cpu")
    )
    for name, layout in _layouts(model, world_size).items():  # torchrec's own EBC loads nothing on CPU
        rows = table_weight(module, name).detach()
        load_rows(model.module.tables, name, convert_rows(rows, TableLayout(ROWS[name], world_size), layout))
    return model


def _layouts(model: nn.Module, world_size: int) -> dict[str, TableLayout]:
    routed = getattr(model.module.tables, "table_layouts", {})
    return {name: routed.get(name, TableLayout(n, world_size)) for name, n in ROWS.items()}


def _step(model: nn.Module, kind: str, batch: KeyedJaggedTensor, rank: int, seed: int) -> dict:
    """The output on `batch`; for an EBC, after one SGD step on it, every table in id order."""
    out = flat_output(kind, model(batch))
    if kind == "ec":
        return {"out": out.detach()}
    (out * output_grad(out, rank, seed)).sum().backward()
    world_size = torch.distributed.get_world_size()
    after = {
        name: convert_rows(
            gather_rows(model.module.tables, name), layout, TableLayout(ROWS[name], world_size)
        )
        for name, layout in _layouts(model, world_size).items()
    }
    return {"out": out.detach(), "after": after}


def edge_case(rank: int, world_size: int, kind: str, routing: str, case: str, seed: int) -> dict:
    """{"step": the step on this rank's batch of `case`} or {"error": "Type: message", "next": the
    step on an ordinary batch after it}."""
    model = sharded_model(kind, routing, world_size, seed)
    try:
        return {"step": _step(model, kind, edge_batch(case, rank, world_size, seed), rank, seed)}
    except Exception as error:  # noqa: BLE001 - the error is the result
        raised = f"{type(error).__name__}: {error}"
    if routing == "torchrec":  # torchrec's failed step may have left collectives behind: no next step
        return {"error": raised}
    return {
        "error": raised,
        "next": _step(model, kind, edge_batch(ORDINARY, rank, world_size, seed), rank, seed),
    }

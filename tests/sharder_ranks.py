"""Per-rank functions for tests/rowwise/test_sharders.py (spawned ranks import them from here).

Each rank builds the same two-table EmbeddingBagCollection (table "a" sum
pooling, table "b" mean pooling), shards it row-wise with
RoutedEmbeddingBagCollectionSharder under DistributedModelParallel, loads the
unsharded weights laid out for the routing, runs one forward and one fused
SGD step on its own batch, and returns what the parent compares with the
unsharded module: outputs, the tables after the step (read back in id
order), and each rank's local shard.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from torchrec.distributed.types import ShardingPlan

from embnb.lab.rowwise.reference import fmix64
from embnb.rowwise import RoutedEmbeddingBagCollectionSharder, TableLayout, gather_rows, load_rows

DIM = 4
LR = 0.1
BATCH = 3


class Model(nn.Module):
    def __init__(self, ebc: nn.Module):
        super().__init__()
        self.ebc = ebc

    def forward(self, features: KeyedJaggedTensor):
        return self.ebc(features)


def make_ebc(rows: dict[str, int], seed: int) -> EmbeddingBagCollection:
    tables = [
        EmbeddingBagConfig(
            name=name,
            embedding_dim=DIM,
            num_embeddings=n,
            feature_names=[f"f_{name}"],
            pooling=PoolingType.SUM if name == "a" else PoolingType.MEAN,
        )
        for name, n in rows.items()
    ]
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(tables=tables)
    with torch.no_grad():
        for name, n in rows.items():
            ebc.embedding_bags[name].weight.copy_(torch.randn(n, DIM))
    return ebc


def make_batch(rows: dict[str, int], rank: int, seed: int) -> KeyedJaggedTensor:
    """Every id of each table appears (so every row is updated), plus repeats and an empty bag."""
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    lengths, values = [], []
    for n in rows.values():
        ids = torch.cat([torch.arange(n), torch.randint(0, n, (5,), generator=gen)])
        ids = ids[torch.randperm(ids.numel(), generator=gen)]
        cut = sorted(torch.randint(0, ids.numel() + 1, (BATCH - 1,), generator=gen).tolist())
        cut[0] = 0  # the first bag is empty
        bounds = [0, *cut, ids.numel()]
        lengths += [bounds[i + 1] - bounds[i] for i in range(BATCH)]
        values.append(ids)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{name}" for name in rows], values=torch.cat(values), lengths=torch.tensor(lengths)
    )


def output_grad(rank: int, seed: int, rows: dict[str, int]) -> torch.Tensor:
    return torch.randn(BATCH, DIM * len(rows), generator=torch.Generator().manual_seed(seed * 1000 + rank))


def _shard(rows: dict[str, int], routings: dict[str, str], seed: int, world_size: int):
    ebc = make_ebc(rows, seed)
    sharder = RoutedEmbeddingBagCollectionSharder(
        routings, fused_params={"optimizer": _sgd(), "learning_rate": LR}
    )
    plan = construct_module_sharding_plan(
        ebc,
        {name: row_wise(compute_kernel="fused") for name in rows},
        sharder=sharder,
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
    )
    model = DistributedModelParallel(
        Model(ebc), sharders=[sharder], plan=ShardingPlan({"ebc": plan}), device=torch.device("cpu")
    )
    return ebc, model


def _sgd():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return EmbOptimType.EXACT_SGD


def parity_case(rank: int, world_size: int, rows: dict[str, int], routings: dict[str, str], seed: int):
    """Outputs, the tables after one step (in id order) and the local shards, on this rank."""
    ebc, model = _shard(rows, routings, seed, world_size)
    sharded = model.module.ebc
    layouts = sharded.table_layouts
    for name in rows:
        logical = ebc.embedding_bags[name].weight.detach()
        load_rows(sharded, name, _to_storage(logical, layouts[name]))
    out = model(make_batch(rows, rank, seed)).values()
    (out * output_grad(rank, seed, rows)).sum().backward()
    after = {}
    for name in rows:
        storage = gather_rows(sharded, name)
        after[name] = storage[layouts[name].slots(torch.arange(rows[name]))]
    local = {name: _local(sharded, name) for name in rows}
    return {
        "out": out.detach(),
        "after": after,
        "local": local,
        "routings": sharded.routings,
        "storage_rows": {n: layouts[n].storage_rows for n in rows},
    }


def _to_storage(logical: torch.Tensor, layout: TableLayout) -> torch.Tensor:
    storage = logical.new_zeros((layout.storage_rows, logical.shape[1]))
    storage[layout.slots(torch.arange(layout.num_embeddings))] = logical
    return storage


def _local(sharded, name: str) -> torch.Tensor:
    weight = sharded.state_dict()[f"embedding_bags.{name}.weight"]
    (shard,) = weight.local_shards()
    return shard.tensor.detach().clone()


MASK64 = (1 << 64) - 1


def feistel_owner_local(i: int, n: int, world_size: int, seed: int = 0) -> tuple[int, int]:
    """feistel_roundrobin in plain ints: a 4-round Feistel on 2h bits, cycle-walked into [0, n),
    then round-robin."""
    h = 1
    while 4**h < n:
        h += 1
    mask = (1 << h) - 1
    keys = [fmix64(seed * 4 + r + 1) for r in range(4)]
    x = i
    while True:
        left, right = x >> h, x & mask
        for k in keys:
            left, right = right, left ^ (fmix64((right + k) & MASK64) & mask)
        x = (left << h) | right
        if x < n:
            break
    return x % world_size, x // world_size


def owner_local(routing: str, i: int, n: int, world_size: int) -> tuple[int, int]:
    """(rank, local row) of id i: the rule each routing promises."""
    block = -(-n // world_size)
    if routing == "continuous":
        return i // block, i - (i // block) * block
    if routing == "roundrobin":
        return i % world_size, i // world_size
    return feistel_owner_local(i, n, world_size)


def mismatch_case(rank: int, world_size: int, rows: dict[str, int], saved: dict, loaded: dict, seed: int):
    """Load a state dict saved under routings `saved` (None: the unsharded module's) into a module
    with `loaded`: the error, or None."""
    if saved is None:
        state = make_ebc(rows, seed).state_dict()
    else:
        state = _shard(rows, saved, seed, world_size)[1].module.ebc.state_dict()
    _, target = _shard(rows, loaded, seed, world_size)
    dist.barrier()
    try:
        target.module.ebc.load_state_dict(state)
    except ValueError as error:
        return f"{type(error).__name__}: {error}"
    return None

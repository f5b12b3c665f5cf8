"""Per-rank functions for tests/rowwise/test_sharders.py (spawned ranks import them from here).

Each rank builds the same two-table module, an EmbeddingBagCollection ("ebc": table "a" sum
pooling, table "b" mean pooling) or an EmbeddingCollection ("ec"), shards it row-wise with
the routed sharder under DistributedModelParallel, loads the unsharded weights at the slots
the oracle here names (`owner_local`, plain ints), runs one forward and one fused SGD step on
its own batch, and returns what the parent compares with the unsharded module.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    PoolingType,
)
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
from torchrec.distributed.types import ShardingPlan

from embnb.rowwise import (
    RoutedEmbeddingBagCollectionSharder,
    RoutedEmbeddingCollectionSharder,
    RoutedFeaturesDist,
    RoutedShardedEmbeddingBagCollection,
    TableLayout,
    convert_rows,
    gather_rows,
    load_rows,
)
from embnb.rowwise.sharded_rows import weight_key
from tests.lab.rowwise.plain_routing import fmix64

DIM = 4
LR = 0.1
BATCH = 3
MASK64 = (1 << 64) - 1


class Model(nn.Module):
    def __init__(self, tables: nn.Module):
        super().__init__()
        self.tables = tables

    def forward(self, features: KeyedJaggedTensor):
        return self.tables(features)


def make_module(kind: str, rows: dict[str, int], seed: int, need_indices: bool = False) -> nn.Module:
    """An EBC (table "a" sum-pooled, "b" mean-pooled) or an EC, with seeded weights."""
    if kind == "ebc":
        pooling = {"a": PoolingType.SUM, "b": PoolingType.MEAN}
        configs = [
            EmbeddingBagConfig(
                name=n, embedding_dim=DIM, num_embeddings=r, feature_names=[f"f_{n}"], pooling=pooling[n]
            )
            for n, r in rows.items()
        ]
        module, weights = EmbeddingBagCollection(tables=configs), "embedding_bags"
    else:
        configs = [
            EmbeddingConfig(name=n, embedding_dim=DIM, num_embeddings=r, feature_names=[f"f_{n}"])
            for n, r in rows.items()
        ]
        module, weights = EmbeddingCollection(tables=configs, need_indices=need_indices), "embeddings"
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, n in rows.items():
            getattr(module, weights)[name].weight.copy_(torch.randn(n, DIM))
    return module


def table_weight(module: nn.Module, name: str) -> torch.Tensor:
    tables = module.embedding_bags if isinstance(module, EmbeddingBagCollection) else module.embeddings
    return tables[name].weight


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


def flat_output(kind: str, out) -> torch.Tensor:
    """An EBC's pooled [batch, dims] or an EC's sequence embeddings, features in key order."""
    if kind == "ebc":
        return out.values()
    jagged = dict(out.items())  # a sharded EC's output awaitable resolves on items()
    return torch.cat([jagged[key].values() for key in sorted(jagged)])


def output_grad(out: torch.Tensor, rank: int, seed: int) -> torch.Tensor:
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(seed * 1000 + rank))


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


def oracle_slots(routing: str, n: int, world_size: int) -> torch.Tensor:
    """Storage row of each id: rank * ceil(n / W) + local row."""
    block = -(-n // world_size)
    return torch.tensor(
        [r * block + local for r, local in (owner_local(routing, i, n, world_size) for i in range(n))]
    )


def oracle_storage(logical: torch.Tensor, routing: str, world_size: int) -> torch.Tensor:
    n = logical.shape[0]
    total = n if routing == "continuous" else world_size * -(-n // world_size)
    storage = logical.new_zeros((total, logical.shape[1]))
    storage[oracle_slots(routing, n, world_size)] = logical
    return storage


class OffByOneLayout(TableLayout):
    """A layout with the local row index off by one (wrapping in the rank's block): the bug the
    parity check must catch."""

    def slots(self, ids: torch.Tensor) -> torch.Tensor:
        slots, b = super().slots(ids), self.block_size
        return slots // b * b + (slots % b + 1) % b


class OffByOneDist(RoutedFeaturesDist):
    """The input distribution with each local row sent off by one (wrapping in the rank's block)."""

    def bucketize_features(self, sparse_features):
        out = super().bucketize_features(sparse_features)
        num_features = len(self.layouts)
        segment_feature = torch.arange(out.lengths.numel()) // sparse_features.stride() % num_features
        blocks = torch.tensor([layout.block_size for layout in self.layouts])[segment_feature]
        block = blocks.repeat_interleave(out.lengths.long())
        return out._replace(indices=((out.indices + 1) % block).to(out.indices.dtype))


class OffByOneEBC(RoutedShardedEmbeddingBagCollection):
    """Rows loaded from the unsharded module and ids sent, each with the local row off by one."""

    layout_type = OffByOneLayout
    features_dist_type = OffByOneDist


class OffByOneSharder(RoutedEmbeddingBagCollectionSharder):
    @property
    def sharded_module_type(self) -> type[OffByOneEBC]:
        return OffByOneEBC


def rank_device() -> torch.device:
    """This rank's GPU under nccl (the GPU kit's CUDA parity), else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sgd():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return EmbOptimType.EXACT_SGD


def _shard(kind: str, rows: dict[str, int], routings: dict, seed: int, world_size: int, off_by_one=False):
    return _shard_module(make_module(kind, rows, seed), kind, rows, routings, world_size, off_by_one)


def _shard_module(
    module, kind: str, rows: dict[str, int], routings: dict, world_size: int, off_by_one=False, on_rank_0=()
):
    """`module` sharded row-wise over the ranks, but the tables `on_rank_0` (table-wise on rank 0)."""
    sharder_type = RoutedEmbeddingBagCollectionSharder if kind == "ebc" else RoutedEmbeddingCollectionSharder
    if off_by_one:
        sharder_type = OffByOneSharder
    sharder = sharder_type(routings, fused_params={"optimizer": _sgd(), "learning_rate": LR})
    plan = construct_module_sharding_plan(
        module,
        {
            name: table_wise(rank=0, compute_kernel="fused")
            if name in on_rank_0
            else row_wise(compute_kernel="fused")
            for name in rows
        },
        sharder=sharder,
        local_size=world_size,
        world_size=world_size,
        device_type=rank_device().type,
    )
    model = DistributedModelParallel(
        Model(module), sharders=[sharder], plan=ShardingPlan({"tables": plan}), device=rank_device()
    )
    return model


def _local(sharded, name: str) -> torch.Tensor:
    (shard,) = sharded.state_dict()[weight_key(sharded, name)].local_shards()
    return shard.tensor.detach().cpu().clone()


def parity_case(rank, world_size, kind, rows, routings, seed, off_by_one=False):
    """On this rank: the local shards as built (from the unsharded module), then, with the rows
    loaded at the oracle's slots, the outputs, the storage rows after one step, the local shards
    and a checkpoint of each table (its storage rows and layout)."""
    model = _shard(kind, rows, routings, seed, world_size, off_by_one)
    sharded = model.module.tables
    built = {name: _local(sharded, name) for name in rows}
    logical = make_module(kind, rows, seed)
    for name in rows:
        storage = oracle_storage(
            table_weight(logical, name).detach(), routings.get(name, "continuous"), world_size
        )
        load_rows(sharded, name, storage)
    out = flat_output(kind, model(make_batch(rows, rank, seed).to(rank_device())))
    (out * output_grad(out, rank, seed).to(out.device)).sum().backward()
    after = {name: gather_rows(sharded, name).cpu() for name in rows}
    layouts = {name: dataclasses.asdict(layout) for name, layout in sharded.table_layouts.items()}
    return {
        "built": built,
        "out": out.detach().cpu(),
        "after": after,
        "local": {name: _local(sharded, name) for name in rows},
        "routings": sharded.routings,
        "checkpoint": {name: (after[name], layouts[name]) for name in rows},
    }


def load_case(rank, world_size, kind, rows, checkpoint: dict, routings: dict, seed: int):
    """Load a checkpoint saved under another (W, routing), converted with convert_rows, into a
    module sharded with `routings` over these ranks: the local shards."""
    sharded = _shard(kind, rows, routings, seed, world_size).module.tables
    for name, (saved, layout) in checkpoint.items():
        source = TableLayout(
            layout["num_embeddings"], layout["world_size"], layout["routing"], layout["seed"]
        )
        load_rows(sharded, name, convert_rows(saved, source, sharded.table_layouts[name]))
    return {name: _local(sharded, name) for name in rows}


def mismatch_case(rank, world_size, kind, rows, saved, loaded, seed):
    """Load a state dict saved under routings `saved` (None: the unsharded module's) into a module
    with `loaded`: the error, or None."""
    if saved is None:
        state = make_module(kind, rows, seed).state_dict()
    else:
        state = _shard(kind, rows, saved, seed, world_size).module.tables.state_dict()
    target = _shard(kind, rows, loaded, seed, world_size).module.tables
    dist.barrier()
    try:
        target.load_state_dict(state)
    except ValueError as error:
        return f"{type(error).__name__}: {error}"
    return None


def edge_case(rank, world_size, what: str, seed: int):
    """The error a routed module raises for an id outside its table ("bad_id"); the largest difference
    of a forward pass from the unsharded module's with table "b" table-wise ("mixed"); what a KJT with
    a variable batch per feature delivers (`vbe_received`, "vbe"); or the indices a routed
    EmbeddingCollection with need_indices returns for EDGE_IDS, per feature ("need_indices")."""
    rows, routings = {"a": 8, "b": 7}, {"a": "roundrobin", "b": "feistel_roundrobin"}
    if what == "mixed":  # a routed row-wise table beside a table-wise one: the forward pass, both ways
        module = make_module("ebc", rows, seed)
        model = _shard_module(module, "ebc", rows, {"a": "roundrobin"}, world_size, on_rank_0=("b",))
        batch = make_batch(rows, rank, seed)
        return (model(batch).values() - make_module("ebc", rows, seed)(batch).values()).abs().max().item()
    if what == "need_indices":
        module = make_module("ec", rows, seed, need_indices=True)
        model = _shard_module(module, "ec", rows, routings, world_size)
        out = model(KeyedJaggedTensor.from_lengths_sync(["f_a", "f_b"], *EDGE_IDS))
        return {key: jagged.weights().tolist() for key, jagged in out.items()}
    if what == "vbe":  # a variable batch per feature: 3 bags of f_a, 2 of f_b, for 4 samples
        kjt = KeyedJaggedTensor(
            keys=["f_a", "f_b"],
            values=torch.tensor([3, 5, 7, 1, 0, 6, 2, 2]),
            lengths=torch.tensor([2, 0, 3, 1, 2]),
            stride_per_key_per_rank=[[3], [2]],
            inverse_indices=(["f_a", "f_b"], torch.tensor([[0, 1, 2, 2], [1, 0, 0, 1]])),
        )
        return vbe_received(kjt, rows, routings, world_size)
    kjt = KeyedJaggedTensor.from_lengths_sync(["f_a", "f_b"], torch.tensor([3, 8, 1]), torch.tensor([2, 1]))
    try:  # "bad_id": 8 is outside table a's [0, 8)
        _shard("ebc", rows, routings, seed, world_size)(kjt)
    except ValueError as error:
        return f"{type(error).__name__}: {error}"
    return None


def vbe_received(kjt: KeyedJaggedTensor, rows: dict[str, int], routings: dict, world_size: int) -> dict:
    """What this rank receives from the routed input distribution for `kjt`, and from torchrec's own
    row-wise one (FBGEMM's bucketize) for the same ids renumbered to their storage slots. (FBGEMM's CPU
    TBE takes no variable batch per feature, so no lookup follows on CPU.)"""
    layouts = [TableLayout(n, world_size, routings.get(t, "continuous")) for t, n in rows.items()]
    group = dist.group.WORLD
    ours = RoutedFeaturesDist(group, kjt.keys(), layouts)(kjt).wait().wait()
    slots = torch.cat([la.slots(ids) for la, ids in zip(layouts, kjt.values().split(kjt.length_per_key()))])
    renumbered = KeyedJaggedTensor(
        keys=kjt.keys(),
        values=slots,
        lengths=kjt.lengths(),
        stride_per_key_per_rank=kjt.stride_per_key_per_rank(),
        inverse_indices=kjt.inverse_indices(),
    )
    torchrecs = RwSparseFeaturesDist(group, len(layouts), [la.storage_rows for la in layouts])
    theirs = torchrecs(renumbered).wait().wait()
    return {
        name: (got.values().tolist(), got.lengths().tolist(), got.stride_per_key_per_rank())
        for name, got in (("routed", ours), ("torchrec", theirs))
    }


EDGE_IDS = (torch.tensor([3, 7, 1, 6, 0]), torch.tensor([2, 1, 1, 1]))  # values, lengths: f_a then f_b

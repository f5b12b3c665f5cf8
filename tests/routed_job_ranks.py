"""Per-rank functions for tests/rowwise/test_sharders_jobs.py: the routed sharders used as a torchrec
job uses them (spawned ranks import them from here).

- `shared_feature_case`: a feature read by two tables ("f" by "t1" and "t2"), another ("g") by one;
  an EmbeddingBagCollection (weighted or not) or an EmbeddingCollection, sharded row-wise with a
  routing per table: the outputs and the tables after one SGD step, for the parent to compare with the
  unsharded module.
- `two_collections_case`: a model holding an unweighted and a weighted EBC under one sharder whose
  routings name a table by its name and one by its collection's path; or names no table.
- `save_case` / `reshard_case`: a routed model trained one row-wise Adagrad step and saved with DCP;
  what DCP and `load_state_dict` do with it in other layouts; `load_resharded` at another W and routing.
- `dynamic_reshard_case`: a routed row-wise table and a table-wise one, trained with row-wise Adagrad;
  torchrec's `DistributedModelParallel.reshard` moves the table-wise one (test_sharders_reshard.py).
- `block_save_case` / `block_load_case` (test_dcp_blocks.py) and `ec_save_case` / `ec_load_case`
  (test_dcp_ec.py): one routed table, of an EmbeddingBagCollection or an EmbeddingCollection, saved
  with DCP and loaded by `load_resharded` in blocks of rows, each read recorded (`recorded_reads`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
from torchrec.distributed.types import ShardingPlan

from embnb.rowwise import RoutedEmbeddingBagCollectionSharder, RoutedEmbeddingCollectionSharder
from embnb.rowwise.dcp_rows import load_resharded
from embnb.rowwise.sharded_rows import gather_rows, weight_key

DIM = 4
LR = 0.1
SHARED_ROWS = {"t1": 10, "t2": 7, "t3": 9}  # t1 and t2 read feature "f", t3 reads "g"
SHARED_FEATURES = {"t1": ["f"], "t2": ["f"], "t3": ["g"]}
SEQ_ROWS = 11  # the table the checkpoint cases train


def _sgd():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}


def _adagrad():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR}


def seeded(module: nn.Module, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    with torch.no_grad():
        for _, weight in sorted(module.named_parameters()):
            weight.copy_(torch.randn(weight.shape))
    return module


def shared_module(kind: str, seed: int) -> nn.Module:
    """t1, t2 read "f"; t3 reads "g"; seeded weights."""
    if kind == "ec":
        configs = [
            EmbeddingConfig(name=n, embedding_dim=DIM, num_embeddings=r, feature_names=SHARED_FEATURES[n])
            for n, r in SHARED_ROWS.items()
        ]
        return seeded(EmbeddingCollection(tables=configs), seed)
    configs = [
        EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=r, feature_names=SHARED_FEATURES[n])
        for n, r in SHARED_ROWS.items()
    ]
    return seeded(EmbeddingBagCollection(tables=configs, is_weighted=kind == "weighted_ebc"), seed)


def shared_batch(kind: str, rank: int, seed: int) -> KeyedJaggedTensor:
    """ids of "f" in [0, 7) (both its tables' rows), of "g" in [0, 9); an empty bag; weights where
    the collection is weighted."""
    gen = torch.Generator().manual_seed(seed * 10 + rank)
    f = torch.cat([torch.arange(7), torch.randint(0, 7, (5,), generator=gen)])
    g = torch.cat([torch.arange(9), torch.randint(0, 9, (3,), generator=gen)])
    lengths = torch.tensor([0, 5, 7, 4, 8, 0])  # 3 samples of f, then of g
    weights = torch.rand(len(f) + len(g), generator=gen) if kind == "weighted_ebc" else None
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f", "g"], values=torch.cat([f, g]), lengths=lengths, weights=weights
    )


def flat(out) -> torch.Tensor:
    """An EBC's pooled values or an EC's sequence embeddings, in key order."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "values") and not hasattr(out, "items"):
        return out.values()
    jagged = dict(out.items())
    return torch.cat([jagged[key].values() for key in sorted(jagged)])


def _plan(module, sharder, world_size, tables):
    return construct_module_sharding_plan(
        module,
        {name: row_wise(compute_kernel="fused") for name in tables},
        sharder=sharder,
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
    )


def shared_feature_case(rank, world_size, kind, routings, seed):
    """Outputs on this rank's batch, then every table (storage order) after one SGD step."""
    module = shared_module(kind, seed)
    sharder_type = RoutedEmbeddingCollectionSharder if kind == "ec" else RoutedEmbeddingBagCollectionSharder
    sharder = sharder_type(routings, fused_params=_sgd())
    plan = _plan(module, sharder, world_size, SHARED_ROWS)
    model = DistributedModelParallel(
        module, sharders=[sharder], plan=ShardingPlan({"": plan}), device=torch.device("cpu")
    )
    out = flat(model(shared_batch(kind, rank, seed)))
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + rank))
    (out * grad).sum().backward()
    return {"out": out.detach(), "after": {t: gather_rows(model.module, t) for t in SHARED_ROWS}}


class TwoCollections(nn.Module):
    """An unweighted EBC (table t_item, feature item) and a weighted one (t_w, feature w)."""

    def __init__(self, seed: int):
        super().__init__()
        item = EmbeddingBagConfig(name="t_item", embedding_dim=DIM, num_embeddings=9, feature_names=["item"])
        w = EmbeddingBagConfig(name="t_w", embedding_dim=DIM, num_embeddings=6, feature_names=["w"])
        self.ebc = seeded(EmbeddingBagCollection(tables=[item]), seed)
        self.wbc = seeded(EmbeddingBagCollection(tables=[w], is_weighted=True), seed + 1)

    def forward(self, items: KeyedJaggedTensor, weighted: KeyedJaggedTensor) -> torch.Tensor:
        return torch.cat([self.ebc(items).values(), self.wbc(weighted).values()], dim=1)


def two_collections_batch(rank: int) -> tuple[KeyedJaggedTensor, KeyedJaggedTensor]:
    items = KeyedJaggedTensor.from_lengths_sync(
        ["item"], torch.tensor([8, 0, 3, 5, 1, 7][rank:]), torch.tensor([2, 3 - rank, 1])
    )
    weighted = KeyedJaggedTensor.from_lengths_sync(
        ["w"],
        torch.tensor([5, 2, 0, 4]),
        torch.tensor([1, 0, 3]),
        weights=torch.tensor([0.5, 2.0, 1.0, 0.25]),
    )
    return items, weighted


def two_collections_case(rank, world_size, routings, seed):
    """The forward output and each collection's routings; or the error the routings raise."""
    model = TwoCollections(seed)
    sharder = RoutedEmbeddingBagCollectionSharder(routings, fused_params=_sgd())
    plans = {
        "ebc": _plan(model.ebc, sharder, world_size, ["t_item"]),
        "wbc": _plan(model.wbc, sharder, world_size, ["t_w"]),
    }
    try:
        dmp = DistributedModelParallel(
            model, sharders=[sharder], plan=ShardingPlan(plans), device=torch.device("cpu")
        )
        out = dmp(*two_collections_batch(rank))
    except ValueError as error:
        return f"{type(error).__name__}: {error}"
    inner = dmp.module
    return {"out": out.detach(), "routings": {**inner.ebc.routings, **inner.wbc.routings}}


def _config() -> EmbeddingBagConfig:
    return EmbeddingBagConfig(name="t", embedding_dim=DIM, num_embeddings=SEQ_ROWS, feature_names=["f"])


def _routed_model(world_size: int, routing: str, seed: int):
    """One table "t" of SEQ_ROWS rows, row-wise under `routing` with row-wise Adagrad, inside a model."""
    module = seeded(EmbeddingBagCollection(tables=[_config()]), seed)
    if routing == "torchrec":  # torchrec's own row-wise sharder (the rows torchrec's layout holds)
        sharder = _CpuRowWiseSharder(fused_params=_adagrad())
    else:
        sharder = RoutedEmbeddingBagCollectionSharder({"t": routing}, fused_params=_adagrad())
    plan = _plan(module, sharder, world_size, ["t"])
    return DistributedModelParallel(
        nn.ModuleDict({"ebc": module}),
        sharders=[sharder],
        plan=ShardingPlan({"ebc": plan}),
        device=torch.device("cpu"),
    )


class _CpuRowWiseSharder(EmbeddingBagCollectionSharder):
    """torchrec's sharder with row_wise offered on CPU (torchrec 1.8 offers it for CUDA only)."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [*super().sharding_types(compute_device_type), "row_wise"]


def _train_step(model, rank: int) -> None:
    ids = torch.tensor([3, 10, 0, 7, 7, 1, 5, 9][rank:])
    kjt = KeyedJaggedTensor.from_lengths_sync(["f"], ids, torch.tensor([2, len(ids) - 2]))
    model.module["ebc"](kjt).values().sum().backward()


def _momentum(model, key: str = "ebc") -> torch.Tensor:
    """The row-wise Adagrad state of the one table of `model.module[key]`, in storage order, gathered
    from the ranks."""
    sharded = model.module[key]
    (value,) = sharded.fused_optimizer.state[next(iter(sharded.fused_optimizer.params.values()))].values()
    (shard,) = value.local_shards()
    blocks = [None] * dist.get_world_size()
    dist.all_gather_object(blocks, (int(shard.metadata.shard_offsets[0]), shard.tensor.clone()))
    return torch.cat([block for _, block in sorted(blocks, key=lambda b: b[0])])


def _error(fn) -> str | None:
    try:
        fn()
    except BaseException as error:  # DCP's CheckpointException is a BaseException
        if isinstance(error, KeyboardInterrupt):
            raise
        return f"{type(error).__name__}: {error}"
    return None


def save_case(rank, world_size, routing, path, seed):
    """Train one step under `routing`, save model and optimizer with DCP; then try to load the
    checkpoint into other layouts: DCP into a plain module, into torchrec's row-wise module and into a
    routed one of another routing (each: the error and whether the target's weights changed), and
    `load_state_dict` of the routed state dict into torchrec's row-wise module and into another routing."""
    model = _routed_model(world_size, routing, seed)
    _train_step(model, rank)
    sharded = model.module["ebc"]
    dcp.save({"model": model.state_dict(), "optim": model.fused_optimizer.state_dict()}, checkpoint_id=path)
    out = {"rows": gather_rows(sharded, "t"), "momentum": _momentum(model), "keys": list(model.state_dict())}
    out["optimizer_keys"] = list(model.fused_optimizer.state_dict()["state"])

    plain = nn.ModuleDict({"ebc": EmbeddingBagCollection(tables=[_config()])})
    plain_before = {k: v.clone() for k, v in plain.state_dict().items()}
    targets = {"plain": (plain, None)}
    for name, other in (("torchrec", "torchrec"), ("other_routing", "feistel_roundrobin")):
        target = _routed_model(world_size, other, seed + 1)
        targets[name] = (target, gather_rows(target.module["ebc"], "t"))
    for name, (target, before) in targets.items():
        state = {"model": target.state_dict()}
        out[f"dcp_{name}"] = _error(lambda state=state: dcp.load(state, checkpoint_id=path))
        if name == "plain":
            out["plain_unchanged"] = all(
                torch.equal(v, plain_before[k]) for k, v in plain.state_dict().items()
            )
        else:
            out[f"{name}_unchanged"] = torch.equal(gather_rows(target.module["ebc"], "t"), before)
    saved = model.state_dict()
    out["load_torchrec"] = _error(lambda: targets["torchrec"][0].load_state_dict(saved))
    out["load_other_routing"] = _error(lambda: targets["other_routing"][0].load_state_dict(saved))
    out["load_plain"] = _error(lambda: plain.load_state_dict(saved))
    return out


def reshard_case(rank, world_size, routing, path, seed):
    """A model of another W and routing loads the checkpoint with load_resharded: its rows and
    optimizer state in storage order, and the keys they came from."""
    model = _routed_model(world_size, routing, seed + 2)
    sharded = model.module["ebc"]
    found = load_resharded(sharded, path, prefix="model.ebc.", optimizer_prefix="optim.state.ebc.")
    return {
        "rows": gather_rows(sharded, "t"),
        "momentum": _momentum(model),
        "found": found,
        "key": weight_key(sharded, "t"),
    }


RESHARD_ROWS = {"t_r": 11, "t_tw": 7}  # t_r: row-wise, routed, reads "f"; t_tw: table-wise, reads "g"
RESHARD_BATCH = 3


def reshard_module(seed: int) -> EmbeddingBagCollection:
    configs = [
        EmbeddingBagConfig(name=name, embedding_dim=DIM, num_embeddings=rows, feature_names=[feature])
        for (name, rows), feature in zip(RESHARD_ROWS.items(), ["f", "g"])
    ]
    return seeded(EmbeddingBagCollection(tables=configs), seed)


def reshard_batch(rank: int, step: int, seed: int) -> KeyedJaggedTensor:
    """RESHARD_BATCH samples of "f" and "g", 0-3 ids per bag."""
    gen = torch.Generator().manual_seed(seed * 1000 + step * 10 + rank)
    lengths = torch.randint(0, 4, (2 * RESHARD_BATCH,), generator=gen)
    f, g = lengths.split(RESHARD_BATCH)
    values = [
        torch.randint(0, n, (int(bags.sum()),), generator=gen)
        for n, bags in zip(RESHARD_ROWS.values(), (f, g))
    ]
    return KeyedJaggedTensor.from_lengths_sync(keys=["f", "g"], values=torch.cat(values), lengths=lengths)


def reshard_grad(rank: int, step: int, seed: int, shape: torch.Size) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed * 1000 + step * 10 + rank + 5))


def _reshard_plan(world_size: int, sharder, tw_rank: int, seed: int):
    return construct_module_sharding_plan(
        reshard_module(seed),
        {"t_r": row_wise(compute_kernel="fused"), "t_tw": table_wise(rank=tw_rank, compute_kernel="fused")},
        sharder=sharder,
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
    )


def _local_blocks(sharded) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """Each state dict key and each optimizer state ("{key}/{state name}") -> this rank's
    (first row, rows) blocks."""
    blocks = {key: value.local_shards() for key, value in sharded.state_dict().items()}
    for key, states in sharded.fused_optimizer.state_dict()["state"].items():
        blocks |= {f"{key}/{name}": value.local_shards() for name, value in states.items()}
    return {
        key: [(int(s.metadata.shard_offsets[0]), s.tensor.detach().clone()) for s in shards]
        for key, shards in blocks.items()
    }


class ReshardModel(nn.Module):
    """reshard_module's EBC times a dense scale of 1 (never stepped): torchrec 1.8's
    `DistributedModelParallel.reshard` reads `.module` of the DDP wrapper, which a model without
    dense parameters lacks."""

    def __init__(self, seed: int):
        super().__init__()
        self.ebc = reshard_module(seed)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.ebc(features).values() * self.scale


def _reshard_step(model, rank: int, step: int, seed: int) -> torch.Tensor:
    out = model(reshard_batch(rank, step, seed))
    (out * reshard_grad(rank, step, seed, out.shape)).sum().backward()
    return out.detach()


def dynamic_reshard_case(rank, world_size, routing, seed):
    """A routed row-wise table (t_r) and a table-wise one (t_tw, on rank 0) trained one row-wise
    Adagrad step; torchrec's `DistributedModelParallel.reshard` moves t_tw to rank 1; a second step.
    Returns the blocks (`_local_blocks`) before and after the reshard and after the second step, the
    outputs, the keys, the output on a batch of no samples on rank 0 (its backward too), and the
    errors of a reshard of t_r and of a table the module lacks, with whether anything changed."""
    from torchrec.distributed.sharding.dynamic_sharding import output_sharding_plan_delta_single
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    sharder = RoutedEmbeddingBagCollectionSharder({"t_r": routing}, fused_params=_adagrad())
    plan = _reshard_plan(world_size, sharder, 0, seed)
    model = DistributedModelParallel(
        ReshardModel(seed),
        sharders=[sharder],
        plan=ShardingPlan({"ebc": plan}),
        device=torch.device("cpu"),
    )
    sharded = model.module.ebc
    out = {"out_1": _reshard_step(model, rank, 1, seed), "before": _local_blocks(sharded)}
    delta = output_sharding_plan_delta_single(plan, _reshard_plan(world_size, sharder, 1, seed), True)
    out["delta"] = sorted(delta[1])
    model.reshard({"ebc": delta}, "ebc")
    out["after"] = _local_blocks(sharded)
    out["keys"] = list(model.state_dict())
    out["optimizer_keys"] = list(model.fused_optimizer.state_dict()["state"])
    out["out_2"] = _reshard_step(model, rank, 2, seed)
    out["after_2"] = _local_blocks(sharded)

    def no_samples_step():
        batch = reshard_batch(rank, 3, seed)
        if rank == 0:
            batch = KeyedJaggedTensor.from_lengths_sync(
                keys=["f", "g"],
                values=torch.zeros(0, dtype=torch.int64),
                lengths=torch.zeros(0, dtype=torch.int64),
            )
        values = model(batch)
        values.sum().backward()
        out["out_3_shape"] = list(values.shape)

    out["error_3"] = _error(no_samples_step)
    before = _local_blocks(sharded)
    routed_delta = EmbeddingModuleShardingPlan({"t_r": plan["t_r"]})
    out["error_routed"] = _error(lambda: model.reshard({"ebc": (0.0, routed_delta)}, "ebc"))
    unknown_delta = EmbeddingModuleShardingPlan({"t_typo": plan["t_tw"]})
    out["error_unknown"] = _error(lambda: model.reshard({"ebc": (0.0, unknown_delta)}, "ebc"))
    after = _local_blocks(sharded)
    out["routed_unchanged"] = before.keys() == after.keys() and all(
        all(torch.equal(a[1], b[1]) for a, b in zip(before[k], after[k])) for k in before
    )
    return out


BLOCK_ROWS = 50  # the table the block-read cases save and load: many blocks of a few rows


def _block_model(world_size: int, routing: str, seed: int, sequence: bool = False):
    """One table "t" of BLOCK_ROWS rows, row-wise under `routing` with row-wise Adagrad, at
    `model.module["ebc"]` (an EmbeddingBagCollection) or, with `sequence`, `model.module["ec"]`."""
    if sequence:
        config = EmbeddingConfig(name="t", embedding_dim=DIM, num_embeddings=BLOCK_ROWS, feature_names=["f"])
        module = seeded(EmbeddingCollection(tables=[config]), seed)
        sharder = RoutedEmbeddingCollectionSharder({"t": routing}, fused_params=_adagrad())
    else:
        config = EmbeddingBagConfig(
            name="t", embedding_dim=DIM, num_embeddings=BLOCK_ROWS, feature_names=["f"]
        )
        module = seeded(EmbeddingBagCollection(tables=[config]), seed)
        sharder = RoutedEmbeddingBagCollectionSharder({"t": routing}, fused_params=_adagrad())
    key = "ec" if sequence else "ebc"
    return DistributedModelParallel(
        nn.ModuleDict({key: module}),
        sharders=[sharder],
        plan=ShardingPlan({key: _plan(module, sharder, world_size, ["t"])}),
        device=torch.device("cpu"),
    )


@contextlib.contextmanager
def recorded_reads():
    """DCP's real FileSystemReader, each read recorded: the keys it loads into, the most rows of a
    destination tensor and the rows it reads (a list that fills while the block runs)."""
    reads, real = [], dcp.FileSystemReader.read_data

    def spy(self, plan, planner):
        held = [planner.lookup_tensor(item.dest_index).shape[0] for item in plan.items]
        keys = sorted({item.dest_index.fqn for item in plan.items})
        reads.append({"keys": keys, "dest_rows": max(held), "rows": sum(i.lengths[0] for i in plan.items)})
        return real(self, plan, planner)

    dcp.FileSystemReader.read_data = spy
    try:
        yield reads
    finally:
        dcp.FileSystemReader.read_data = real


def block_save_case(rank, world_size, routing, path, seed):
    """Train one row-wise Adagrad step on ids across the table under `routing`, save with DCP: the
    rows and the Adagrad state in storage order."""
    model = _block_model(world_size, routing, seed)
    ids = torch.arange(rank, BLOCK_ROWS, 3)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["f"], ids, torch.tensor([len(ids) // 2, len(ids) - len(ids) // 2])
    )
    model.module["ebc"](kjt).values().sum().backward()
    dcp.save({"model": model.state_dict(), "optim": model.fused_optimizer.state_dict()}, checkpoint_id=path)
    return {"rows": gather_rows(model.module["ebc"], "t"), "momentum": _momentum(model)}


def block_load_case(rank, world_size, routing, path, seed, max_rows):
    """load_resharded with max_rows_per_read=max_rows into a model of `routing`, DCP's real
    FileSystemReader wrapped to record each read: the destination tensor's rows and the rows it
    received (per read call); then the rows and Adagrad state in storage order, and this rank's
    rows of each."""
    model = _block_model(world_size, routing, seed + 2)
    with recorded_reads() as reads:
        found = load_resharded(
            model.module["ebc"],
            path,
            prefix="model.ebc.",
            optimizer_prefix="optim.state.ebc.",
            max_rows_per_read=max_rows,
        )
    (shard,) = model.module["ebc"].state_dict()[weight_key(model.module["ebc"], "t")].local_shards()
    return {
        "found": found,
        "reads": reads,
        "rows": gather_rows(model.module["ebc"], "t"),
        "momentum": _momentum(model),
        "shard": (int(shard.metadata.shard_offsets[0]), int(shard.metadata.shard_sizes[0])),
    }


def ec_batch(rank: int, seed: int) -> KeyedJaggedTensor:
    """Two sequences of "f" on this rank: every id once across the ranks, then repeats and an empty one."""
    gen = torch.Generator().manual_seed(seed * 10 + rank)
    ids = torch.cat([torch.arange(rank, BLOCK_ROWS, 3), torch.randint(0, BLOCK_ROWS, (4,), generator=gen)])
    return KeyedJaggedTensor.from_lengths_sync(["f"], ids, torch.tensor([len(ids) - 3, 0, 3]))


def ec_save_case(rank, world_size, routing, path, seed):
    """Train one row-wise Adagrad step of the EC under `routing` on this rank's `ec_batch`, save model
    and optimizer with DCP: the rows and Adagrad state in storage order, the saved keys."""
    model = _block_model(world_size, routing, seed, sequence=True)
    out = model.module["ec"](ec_batch(rank, seed))["f"].values()
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + rank))
    (out * grad).sum().backward()
    dcp.save({"model": model.state_dict(), "optim": model.fused_optimizer.state_dict()}, checkpoint_id=path)
    sharded = model.module["ec"]
    return {
        "rows": gather_rows(sharded, "t"),
        "momentum": _momentum(model, "ec"),
        "keys": list(model.state_dict()),
        "optimizer_keys": list(model.fused_optimizer.state_dict()["state"]),
    }


def ec_load_case(rank, world_size, routing, path, seed, max_rows):
    """load_resharded with max_rows_per_read=max_rows into an EC model of `routing`, DCP's
    FileSystemReader wrapped to record each read: the keys it loaded from, the reads, the rows and
    Adagrad state in storage order, and the sequence embeddings (values, lengths) of this rank's
    `ec_batch`."""
    model = _block_model(world_size, routing, seed + 2, sequence=True)
    sharded = model.module["ec"]
    with recorded_reads() as reads:
        found = load_resharded(
            sharded, path, prefix="model.ec.", optimizer_prefix="optim.state.ec.", max_rows_per_read=max_rows
        )
    with torch.no_grad():
        out = model.module["ec"](ec_batch(rank, seed + 1))["f"]
    return {
        "found": found,
        "reads": reads,
        "rows": gather_rows(sharded, "t"),
        "momentum": _momentum(model, "ec"),
        "out": out.values().detach(),
        "lengths": out.lengths(),
    }

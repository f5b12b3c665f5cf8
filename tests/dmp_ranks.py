"""Per-rank functions for the torchrec DMP tests of BalancedShuffle (spawned
ranks import them from here): a DistributedModelParallel model (three
table-wise sharded EmbeddingBagConfigs, fused SGD; a small MLP under DDP)
trained a few steps on heavy-tailed batches, with the shuffle synchronous,
in the background on a group of its own, or not at all."""

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from embnb.balancing import BalancedShuffle

TABLES = 3  # embedding tables t0.. (features f0..), table-wise on ranks 0, 1, 0, ...
NUM_EMBEDDINGS, DIM, DENSE_IN, BATCH_SIZE, LR = 40, 4, 3, 6, 0.1


class TinyModel(nn.Module):
    """Pooled embeddings of every feature and the dense features through a
    two-layer MLP: one prediction per sample."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        tables = [
            EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=DIM, num_embeddings=NUM_EMBEDDINGS, feature_names=[f"f{i}"]
            )
            for i in range(TABLES)
        ]
        self.ebc = EmbeddingBagCollection(tables=tables, device=device)
        self.mlp = nn.Sequential(nn.Linear(TABLES * DIM + DENSE_IN, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, kjt: KeyedJaggedTensor, dense: torch.Tensor) -> torch.Tensor:
        pooled = self.ebc(kjt).values()
        return self.mlp(torch.cat([pooled, dense], dim=1)).squeeze(1)


class PipelineModel(nn.Module):
    """TinyModel as TrainPipelineSparseDist wants it: a torchrec Batch in,
    (loss, predictions) out."""

    def __init__(self, inner: TinyModel) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, batch: Batch):
        predictions = self.inner(batch.sparse_features, batch.dense_features)
        return ((predictions - batch.labels) ** 2).mean(), predictions.detach()


def local_batch(rank: int, step: int, batch_size: int = BATCH_SIZE, keys: int = TABLES):
    """This rank's batch of `step`: a KJT (f0 heavy-tailed), dense features
    with the label as their last column, and the per-sample workloads."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    lengths = torch.randint(0, 3, (keys, batch_size), generator=gen)
    lengths[0] = (torch.rand(batch_size, generator=gen) ** 4 * 30).long()  # heavy tail on f0
    values = torch.randint(0, NUM_EMBEDDINGS, (int(lengths.sum()),), generator=gen)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(keys)], values=values, lengths=lengths.reshape(-1)
    )
    dense = torch.randn(batch_size, DENSE_IN + 1, generator=gen)
    return kjt, dense, lengths[0].to(torch.float64) + 1


def _dmp(world_size: int, wrap=None):
    """The model, sharded table-wise; the same initial weights on every rank and in every run."""
    torch.manual_seed(0)
    reference = TinyModel(torch.device("cpu"))
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}  # the tables' optimizer
    sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    plan = construct_module_sharding_plan(
        reference.ebc,
        {f"t{i}": table_wise(rank=i % world_size, compute_kernel="fused") for i in range(TABLES)},
        world_size=world_size,
        device_type="cpu",
        sharder=sharder,
    )
    torch.manual_seed(0)
    module = TinyModel(torch.device("meta"))
    model = DistributedModelParallel(
        module if wrap is None else wrap(module),
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        plan=ShardingPlan({"ebc" if wrap is None else "inner.ebc": plan}),
        sharders=[sharder],
    )
    model.load_state_dict((reference if wrap is None else wrap(reference)).state_dict())
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.SGD(params, lr=LR),
    )
    return model, CombinedOptimizer([model.fused_optimizer, dense])


def _step(model, optimizer, kjt, dense) -> float:
    optimizer.zero_grad()
    loss = ((model(kjt, dense[:, :-1]) - dense[:, -1]) ** 2).mean()
    loss.backward()
    optimizer.step()
    return float(loss)


def _local_weights(model) -> dict[str, torch.Tensor]:
    """This rank's parameters: its tables' shards and the MLP."""
    weights = {}
    for name, tensor in model.state_dict().items():
        if hasattr(tensor, "local_shards"):
            shards = tensor.local_shards()
            if shards:
                weights[name] = torch.cat([s.tensor.detach().reshape(-1) for s in shards]).clone()
        else:
            weights[name] = tensor.detach().clone()
    return weights


def train_dmp(rank: int, world_size: int, mode: str, steps: int = 4) -> dict:
    """Train `steps` steps: mode "none" (each rank its loader's batch),
    "sync" (BalancedShuffle(overlap=False) on the default group) or
    "overlap" (the shuffle of batch s+1 in the background, on a gloo group
    of its own, while step s runs DMP's forward, backward and optimizer) or
    "caller" (on the default group, the collectives on this thread and KK
    alone in the background).
    Returns the local weights, the losses and the samples per step."""
    model, optimizer = _dmp(world_size)
    losses, ids = [], []
    if mode == "none":
        for step in range(steps):
            kjt, dense, _ = local_batch(rank, step)
            losses.append(_step(model, optimizer, kjt, dense))
            ids.append(kjt.values().numel())
        return {"weights": _local_weights(model), "losses": losses, "ids": ids}
    overlap = mode in ("overlap", "caller")
    group = dist.new_group(backend="gloo") if mode == "overlap" else None
    thread = "caller" if mode == "caller" else "worker"
    with BalancedShuffle(overlap=overlap, group=group, collective_thread=thread) as shuffle:
        shuffle.start(*local_batch(rank, 0), step=0)
        for step in range(steps):
            kjt, dense = shuffle.finish()
            if step + 1 < steps:  # with overlap, balanced in the background meanwhile
                shuffle.start(*local_batch(rank, step + 1), step=step + 1)
            losses.append(_step(model, optimizer, kjt, dense))
            ids.append(kjt.values().numel())
    if group is not None:
        dist.destroy_process_group(group)
    return {"weights": _local_weights(model), "losses": losses, "ids": ids}


def train_pipeline(rank: int, world_size: int, collective_thread: str = "worker", steps: int = 4) -> dict:
    """TrainPipelineSparseDist over `BalancedShuffle.batches`: each torchrec
    Batch balanced in the background while the pipeline trains on the one
    before ("worker": on a gloo group of its own; "caller": on the default
    group, KK alone in the background)."""

    model, optimizer = _dmp(world_size, wrap=PipelineModel)
    pipeline = TrainPipelineSparseDist(model, optimizer, torch.device("cpu"), execute_all_batches=True)
    group = dist.new_group(backend="gloo") if collective_thread == "worker" else None
    losses, ids = [], []
    with BalancedShuffle(overlap=True, group=group, collective_thread=collective_thread) as shuffle:
        batches = _recorded(
            shuffle.batches(
                (_batch(rank, s) for s in range(steps)), lambda b: b.sparse_features["f0"].lengths() + 1.0
            ),
            ids,
        )
        while True:
            try:
                losses.append(float(pipeline.progress(batches)[0]))
            except StopIteration:
                break
    if group is not None:
        dist.destroy_process_group(group)
    weights = {name.removeprefix("inner."): w for name, w in _local_weights(model).items()}
    return {"weights": weights, "losses": losses, "ids": ids}


def _recorded(batches, ids):
    for batch in batches:
        ids.append(batch.sparse_features.values().numel())
        yield batch


def shuffle_errors(rank: int, world_size: int) -> dict[str, str]:
    """The error messages of: the overlapped shuffle on the default group; a
    rank with a partial batch; a rank with other keys (every rank must raise,
    and the group must still work afterwards)."""
    messages = {}
    for name, kwargs in {"default_group": {}, "bad_thread": {"collective_thread": "sideways"}}.items():
        try:
            BalancedShuffle(overlap=True, **kwargs)
        except ValueError as e:
            messages[name] = str(e)
    cases = {
        "partial_batch": local_batch(rank, 0, batch_size=BATCH_SIZE - 2 if rank == 1 else BATCH_SIZE),
        "other_keys": local_batch(rank, 0, keys=TABLES - 1 if rank == 1 else TABLES),
    }
    group = dist.new_group(backend="gloo")
    with BalancedShuffle(overlap=True, group=group) as shuffle:
        for name, batch in cases.items():
            shuffle.start(*batch, step=0)
            try:
                shuffle.finish()
            except ValueError as e:
                messages[name] = str(e)
        # rank 1's loader ends one batch early: every rank raises, none waits forever
        loader = [_batch(rank, step) for step in range(3 if rank == 1 else 4)]
        try:
            for _ in shuffle.batches(loader, lambda b: b.sparse_features["f0"].lengths() + 1.0):
                pass
        except ValueError as e:
            messages["ended_early"] = str(e)
    dist.barrier()  # the default group still works
    dist.destroy_process_group(group)
    return messages


def _batch(rank: int, step: int) -> Batch:
    kjt, dense, _ = local_batch(rank, step)
    return Batch(dense_features=dense[:, :-1], sparse_features=kjt, labels=dense[:, -1])


def uneven_loaders(rank: int, world_size: int, short_rank: int = 1, batches: int = 4) -> dict:
    """The filed case: `short_rank`'s loader one batch shorter than the
    others', one DMP step per batch `BalancedShuffle.batches` yields: with
    overlap on a gloo group of its own (the README's set-up), with the
    collectives on the caller's thread, synchronous, and in
    TrainPipelineSparseDist (last: it leaves batches in flight). Per run, the
    batches taken and the error; then a barrier: the default group still works."""
    lengths = [batches - 1 if r == short_rank else batches for r in range(world_size)]
    loader = [_batch(rank, step) for step in range(lengths[rank])]
    item_lengths = lambda b: b.sparse_features["f0"].lengths() + 1.0  # noqa: E731
    own_group = dist.new_group(backend="gloo")
    model, optimizer = _dmp(world_size)
    runs = {}
    for name, overlap, thread, group in [
        ("worker", True, "worker", own_group),
        ("caller", True, "caller", None),
        ("sync", False, "caller", None),
    ]:
        taken, error = 0, None
        with BalancedShuffle(overlap=overlap, group=group, collective_thread=thread) as shuffle:
            try:
                for batch in shuffle.batches(loader, item_lengths):
                    _step(
                        model,
                        optimizer,
                        batch.sparse_features,
                        torch.cat([batch.dense_features, batch.labels[:, None]], 1),
                    )
                    taken += 1
            except ValueError as e:
                error = str(e)
        runs[name] = {"taken": taken, "error": error}
    model, optimizer = _dmp(world_size, wrap=PipelineModel)
    pipeline = TrainPipelineSparseDist(model, optimizer, torch.device("cpu"), execute_all_batches=True)
    ids, progressed, error = [], 0, None
    with BalancedShuffle(overlap=True, group=own_group) as shuffle:
        batches_taken = _recorded(shuffle.batches(loader, item_lengths), ids)
        try:
            while True:
                pipeline.progress(batches_taken)
                progressed += 1
        except ValueError as e:
            error = str(e)
        except StopIteration:
            pass
    runs["pipeline"] = {"taken": len(ids), "progressed": progressed, "error": error}
    dist.barrier()
    dist.destroy_process_group(own_group)
    return runs

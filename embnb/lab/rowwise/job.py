"""The torchrec call a training job writes (`shard_model`: the routed sharder, a row-wise plan,
DistributedModelParallel), and a small DMP job built on it on real gloo ranks (`train_rank`) that
counts the ids torchrec's input all-to-all delivers to each rank, against the layout's count."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from embnb.lab.rowwise.routed_loads import TABLE, case_ids
from embnb.metrics import max_over_mean
from embnb.rowwise import TableLayout


def shard_model(model: torch.nn.Module, routings: dict[str, str], world_size: int, fused_params: dict):
    """`model.ebc`'s tables row-wise under DMP, each routed as `routings` says (torchrec's own
    row-wise path: its all-to-alls, FBGEMM's fused TBE)."""
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from embnb.rowwise import RoutedEmbeddingBagCollectionSharder

    sharder = RoutedEmbeddingBagCollectionSharder(routings, fused_params=fused_params)
    plan = construct_module_sharding_plan(
        model.ebc,
        {table: row_wise(compute_kernel="fused") for table in routings},
        sharder=sharder,
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
    )
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    plan = ShardingPlan({"ebc": plan})
    return DistributedModelParallel(model, env=env, device=torch.device("cpu"), plan=plan, sharders=[sharder])


@dataclass(frozen=True)
class TrainConfig:
    """The small DMP job: one row-wise table and a linear head, trained on
    frequency-numbered ids (the `frequency` stream)."""

    num_embeddings: int = 4096
    embedding_dim: int = 16
    batch_size: int = 64  # samples per rank per step
    bag_size: int = 8
    alpha: float = 1.05
    steps: int = 5
    learning_rate: float = 0.05
    seed: int = 0


def _local_batch(config: TrainConfig, rank: int, step: int) -> torch.Tensor:
    """Rank `rank`'s ids of step `step`: `batch_size` bags of `bag_size` frequency-numbered ids."""
    num, seed = config.batch_size * config.bag_size, config.seed + 1000 * step + rank
    return case_ids("frequency", num, config.num_embeddings, 1, config.alpha, seed)


def train_rank(rank: int, world_size: int, routing: str, config: TrainConfig) -> dict:
    """On this rank: shard one EBC table row-wise with the routed sharder under DMP, train `config.steps`
    steps (fused SGD on the table, SGD on the head) and count, per step, the ids torchrec's input
    all-to-all delivers to this rank (`ids_received`) and the ids the layout says this rank owns in the
    step's global batch (`ids_by_layout`, from every rank's batch, which each rank can make). Returns
    those, the losses, this rank's local rows, its state dict key and its local ids per step."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    from embnb.rowwise.sharded_rows import weight_key

    # torchrec 1.8's sharded modules call c10d's deprecated reduce_scatter_tensor and
    # all_gather_into_tensor, and its DDP wrapping passes DDP's deprecated `broadcast_buffers`: a
    # FutureWarning per rank that a user of torchrec cannot act on
    warnings.filterwarnings("ignore", r".*is deprecated\. Please use .*|`broadcast_buffers`", FutureWarning)
    torch.manual_seed(config.seed)
    table = EmbeddingBagConfig(config.num_embeddings, config.embedding_dim, TABLE, feature_names=["f"])

    class Model(nn.Module):
        def __init__(self, device: torch.device) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=[table], device=device)
            self.head = nn.Linear(config.embedding_dim, 1)

        def forward(self, kjt):
            return self.head(self.ebc(kjt)["f"]).squeeze(1)

    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": config.learning_rate}
    dmp = shard_model(Model(torch.device("meta")), {TABLE: routing}, world_size, fused)
    sharded, layout = dmp.module.ebc, TableLayout(config.num_embeddings, world_size, routing, config.seed)
    head = torch.optim.SGD([p for n, p in dmp.named_parameters() if "head" in n], lr=config.learning_rate)
    out: dict = {"losses": [], "ids_received": [], "ids_by_layout": [], "local_ids": []}
    for step in range(config.steps):
        ids = _local_batch(config, rank, step)
        lengths = torch.full((config.batch_size,), config.bag_size)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=ids, lengths=lengths)
        everyone = torch.cat([_local_batch(config, r, step) for r in range(world_size)])
        out["ids_by_layout"].append(int((layout.owner(everyone) == rank).sum()))
        # what torchrec's row-wise input all-to-all delivers to this rank for this batch (the sharder's
        # public input_dist, run once more beside the step: every rank calls it in turn)
        with torch.no_grad():
            delivered = sharded.input_dist(sharded.create_context(), kjt).wait().wait()
        parts = [delivered] if hasattr(delivered, "values") else delivered  # a KJT, or torchrec's KJTList
        out["ids_received"].append(sum(f.values().numel() for f in parts))
        head.zero_grad()
        label = (ids.view(config.batch_size, -1) < 16).float().mean(1)  # a target that needs the rows
        loss = ((dmp(kjt) - label) ** 2).mean()
        loss.backward()
        head.step()
        out["losses"].append(float(loss.detach()))
        out["local_ids"].append(ids.tolist())
    key = weight_key(sharded, TABLE)  # torchrec's key + the layout (docs/sharders.md)
    (shard,) = sharded.state_dict()[key].local_shards()
    routing = str(sharded.routings[TABLE])
    return out | {"routing": routing, "local_rows": int(shard.tensor.shape[0]), "state_dict_key": key}


def training_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """Per routing of the DMP run (`runs[routing]`: `train_rank`'s result per rank): each rank's local
    rows and ids received over all steps, whether every step's equal the layout's count, the state dict
    key, and rank 0's losses at the first and last step."""
    rows = []
    for routing, ranks in runs.items():
        totals = [sum(r["ids_received"]) for r in ranks]
        rows.append(
            {
                "routing": routing,
                "routing_on_module": ranks[0]["routing"],
                "local_rows": [r["local_rows"] for r in ranks],
                "ids_received": totals,
                "ids_max_over_mean": max_over_mean(totals),
                "received_equals_layout": all(r["ids_received"] == r["ids_by_layout"] for r in ranks),
                "state_dict_key": ranks[0]["state_dict_key"],
                "loss_first": ranks[0]["losses"][0],
                "loss_last": ranks[0]["losses"][-1],
            }
        )
    return rows

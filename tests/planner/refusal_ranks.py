"""Per-rank function for tests/planner/test_refusals.py (spawned ranks import it from here).

Each rank plans a model with `create_planner` inside the process group, then builds
DistributedModelParallel from that plan with the same sharders and runs a forward and a backward:
torchrec and FBGEMM refuse an option they cannot build at these steps, on every rank.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

BATCH = 4


class Model(nn.Module):
    def __init__(self, tables: list[tuple[str, int, int]]):
        super().__init__()
        configs = [
            EmbeddingBagConfig(name=name, feature_names=[f"f_{name}"], num_embeddings=rows, embedding_dim=dim)
            for name, rows, dim in tables
        ]
        self.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.ebc(features).values()


def plan_and_run(rank: int, world_size: int, tables: list[tuple[str, int, int]]) -> dict:
    """Plan `tables` under the routed sharder with create_planner, build DMP from the plan, step once."""
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from embnb.planner import create_planner
    from embnb.rowwise import RoutedEmbeddingBagCollectionSharder

    sharders = [RoutedEmbeddingBagCollectionSharder()]
    plan = create_planner("cpu", BATCH, progress=False).plan(Model(tables), sharders)
    planned = {
        name: (p.sharding_type, p.compute_kernel, [s.shard_sizes for s in p.sharding_spec.shards])
        if p.sharding_spec is not None
        else (p.sharding_type, p.compute_kernel, None)
        for name, p in plan.plan["ebc"].items()
    }
    model = DistributedModelParallel(Model(tables), plan=plan, sharders=sharders, device=torch.device("cpu"))
    # every table: BATCH bags of two ids (one id per rank differs), a bag of more than one row
    ids = [[(b + rank) % rows, b % rows] for _, rows, _ in tables for b in range(BATCH)]
    features = KeyedJaggedTensor(
        keys=[f"f_{name}" for name, _, _ in tables],
        values=torch.tensor([i for bag in ids for i in bag]),
        lengths=torch.full((len(ids),), 2),
    )
    out = model(features)
    out.sum().backward()
    return {"plan": planned, "shape": tuple(out.shape), "finite": bool(torch.isfinite(out).all())}

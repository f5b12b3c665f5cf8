"""The training loop a torchrec user writes around `BalancedShuffle`, as the README's job has it (an
EmbeddingBagCollection under DDP instead of DMP, so it starts in a second), run by notebook 04 on
real ranks: `launch(balanced_job, 2, steps)` returns per rank each step's item ids before (the
loader's cut) and after the shuffle.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch

from embnb.balancing import BalancedShuffle

FEATURES, ROWS, DIM = ["user", "item"], 1000, 8


def loader(rank: int, steps: int, batch_size: int, seed: int):
    """This rank's batches: a user id and a history of items of heavy-tailed length."""
    for step in range(steps):
        gen = torch.Generator().manual_seed(seed + 100 * step + rank)
        lengths = torch.ones(len(FEATURES), batch_size, dtype=torch.long)
        lengths[1] = (torch.rand(batch_size, generator=gen) ** 4 * 500).long() + 1
        values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=gen)
        kjt = KeyedJaggedTensor.from_lengths_sync(FEATURES, values, lengths.reshape(-1))
        yield Batch(torch.randn(batch_size, 4, generator=gen), kjt, torch.rand(batch_size, generator=gen))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        tables = [
            EmbeddingBagConfig(name=f"t_{f}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f])
            for f in FEATURES
        ]
        self.ebc = EmbeddingBagCollection(tables=tables)
        self.head = torch.nn.Linear(DIM * len(FEATURES) + 4, 1)

    def forward(self, kjt: KeyedJaggedTensor, dense: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.ebc(kjt).values(), dense], dim=1)).squeeze(1)


def balanced_job(rank: int, world_size: int, steps: int = 4, batch_size: int = 32, seed: int = 0) -> dict:
    torch.manual_seed(seed)  # the same weights on every rank
    model = torch.nn.parallel.DistributedDataParallel(Model())  # its all-reduce: the default group
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loaded = [b.sparse_features["item"].values().numel() for b in loader(rank, steps, batch_size, seed)]
    balanced = []
    # the shuffle on a gloo group of its own: DDP's all-reduce runs on the default one meanwhile
    with BalancedShuffle(overlap=True, group=dist.new_group(backend="gloo")) as shuffle:
        history = lambda batch: batch.sparse_features["item"].lengths()  # noqa: E731
        for batch in shuffle.batches(loader(rank, steps, batch_size, seed), history):
            loss = ((model(batch.sparse_features, batch.dense_features) - batch.labels) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            balanced.append(batch.sparse_features["item"].values().numel())
    return {"loaded": loaded, "balanced": balanced}

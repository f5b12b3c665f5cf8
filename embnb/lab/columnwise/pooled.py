"""torchrec's pooled column-wise path, run: an EmbeddingBagCollection (one pooled vector per bag, the more
common module) sharded column-wise on real ranks, against the unsharded module. Its output all-to-all also
returns shards in rank order; torchrec puts them back with FBGEMM's `PermutePooledEmbeddingsSplit`
(`torchrec_layouts.POOLED_PERMUTE_STEPS`).

    calls = [(pooled_on_rank, ([0, 1, 0], 12, 0))]   # one call of a `launch_each` on 2 CPU ranks
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

NUM_ROWS, BAGS, MAX_BAG = 50, 8, 5  # each rank's batch: BAGS bags of 0..MAX_BAG ids


def pooled_on_rank(rank: int, world_size: int, ranks: list[int], embedding_dim: int, seed: int) -> float:
    """Per rank: max |sharded EBC's pooled output - the unsharded EBC's| on this rank's bags."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan
    from torchrec.distributed.types import ShardingEnv

    torch.manual_seed(seed)  # the same weights on every rank
    config = EmbeddingBagConfig(NUM_ROWS, embedding_dim, "t0", feature_names=["f0"])
    ebc = EmbeddingBagCollection(tables=[config], device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed * 1000 + rank)  # each rank its own bags
    lengths = torch.randint(0, MAX_BAG + 1, (BAGS,), generator=generator)
    ids = torch.randint(0, NUM_ROWS, (int(lengths.sum()),), generator=generator)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f0"], values=ids, lengths=lengths)
    with torch.no_grad():
        expected = ebc(kjt).values()
    sharder = EmbeddingBagCollectionSharder()
    plan = construct_module_sharding_plan(
        ebc,
        {"t0": column_wise(ranks=ranks, compute_kernel="fused")},
        sharder=sharder,
        local_size=world_size,
        world_size=world_size,
        device_type="cpu",
    )
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = sharder.shard(ebc, plan, env=env, device=torch.device("cpu"))
    sharded.load_state_dict(ebc.state_dict())
    with torch.no_grad():
        return float((sharded(kjt).wait().values() - expected).abs().max())


@dataclass
class PooledRun:
    """One column-wise EmbeddingBagCollection run against the unsharded module."""

    shard_ranks: list[int]
    world_size: int
    embedding_dim: int
    max_abs_error: list[float]  # per rank: its pooled output against the unsharded module's
    matches: bool = field(init=False)  # equal to the unsharded module's up to float rounding (1e-6)

    def __post_init__(self) -> None:
        self.matches = max(self.max_abs_error) <= 1e-6

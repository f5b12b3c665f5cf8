"""Per-rank function of tests/balancing/test_shuffle_end.py (spawned ranks
import it from here): `BalancedShuffle.batches` over loaders of given lengths
per rank, in each collective_thread mode with overlap and without, a
collective on the default group standing in for each training step."""

import torch
import torch.distributed as dist
from torchrec import KeyedJaggedTensor
from torchrec.datasets.utils import Batch

from embnb.balancing import BalancedShuffle

BATCH_SIZE = 4


def make_batch(rank: int, step: int) -> Batch:
    """Rank `rank`'s batch `step`: heavy-tailed item histories, ids that say
    where they came from (1000 x rank + 100 x step + ...)."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    lengths = (torch.rand(BATCH_SIZE, generator=gen) ** 3 * 12).long() + 1
    values = 1000 * rank + 100 * step + torch.arange(int(lengths.sum()))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["item"], values=values, lengths=lengths)
    dense = torch.randn(BATCH_SIZE, 2, generator=gen)
    return Batch(dense_features=dense, sparse_features=kjt, labels=torch.rand(BATCH_SIZE, generator=gen))


def _item_lengths(batch: Batch) -> torch.Tensor:
    return batch.sparse_features["item"].lengths().to(torch.float64)


def _run(rank: int, shuffle: BalancedShuffle, length: int) -> dict:
    """Consume the shuffled batches of a loader of `length` batches: the ids
    of each batch taken, and the error raised (None where the batches ended)."""
    ids, error = [], None
    try:
        for batch in shuffle.batches([make_batch(rank, s) for s in range(length)], _item_lengths):
            ids.append(sorted(batch.sparse_features.values().tolist()))
            dist.all_reduce(torch.ones(1))  # the training step, on the default group: every rank joins it
    except ValueError as e:
        error = str(e)
    return {"ids": ids, "error": error}


def end_of_data(rank: int, world_size: int, cases: dict[str, tuple[int, ...]], modes: list) -> dict:
    """For each case (each rank's loader length) and each mode (overlap,
    collective_thread): what `_run` records. With the worker issuing the
    collectives, the shuffle has a gloo group of its own (made once)."""
    own_group = dist.new_group(backend="gloo")
    results = {}
    for overlap, thread in modes:
        in_worker = overlap and thread in ("worker", "auto")
        group = own_group if in_worker else None
        with BalancedShuffle(overlap=overlap, group=group, collective_thread=thread) as shuffle:
            for case, lengths in cases.items():
                results[(case, overlap, thread)] = _run(rank, shuffle, lengths[rank])
    dist.barrier()  # the default group still works
    dist.destroy_process_group(own_group)
    return results

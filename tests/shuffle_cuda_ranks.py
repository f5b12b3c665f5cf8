"""Per-rank function of tests/balancing/test_shuffle_cuda.py (spawned ranks
import it from here): BalancedShuffle on a rank's device, each collective
thread, returning what each rank received on the CPU."""

import torch
import torch.distributed as dist
from torchrec import KeyedJaggedTensor

from embnb.balancing import BalancedShuffle
from embnb.dist import rank_device

STEPS, BATCH = 3, 8


def _batch(rank: int, step: int, device: torch.device):
    gen = torch.Generator().manual_seed(100 * step + rank)
    lengths = (torch.rand(BATCH, generator=gen) ** 3 * 40).long()
    values = torch.randint(0, 1000, (int(lengths.sum()),), generator=gen)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["item"], values=values, lengths=lengths).to(device)
    dense = torch.randn(BATCH, 3, generator=gen).to(device)
    return kjt, dense, lengths.to(torch.float64).to(device) + 1


def shuffle_on_device(rank: int, world_size: int, collective_thread: str, on_cpu: bool) -> dict:
    """Three overlapped shuffles; the backward's stand-in (a matmul) runs on
    the caller's stream while the next batch is shuffled."""
    device = torch.device("cpu") if on_cpu else rank_device()
    group = dist.new_group(backend="gloo") if collective_thread == "worker" else None
    received = []
    with BalancedShuffle(overlap=True, group=group, collective_thread=collective_thread) as shuffle:
        chosen = shuffle.collective_thread
        shuffle.start(*_batch(rank, 0, device), step=0)
        for step in range(STEPS):
            kjt, dense = shuffle.finish()
            if step + 1 < STEPS:
                shuffle.start(*_batch(rank, step + 1, device), step=step + 1)
            busy = torch.randn(512, 512, device=device)
            (busy @ busy).sum().item()
            received.append((kjt.lengths().cpu(), kjt.values().cpu(), dense.cpu(), str(dense.device)))
    backend = str(dist.get_backend())
    if group is not None:
        dist.destroy_process_group(group)
    return {"received": received, "backend": backend, "collective_thread": chosen}

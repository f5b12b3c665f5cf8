"""Per-rank functions for the launcher tests: spawned ranks import them from here."""

import os
import subprocess
import time

import torch
import torch.distributed as dist


def identity(rank, world_size, payload):
    return {"rank": rank, "world_size": world_size, "payload": payload, "pid": os.getpid()}


def tensor_result(rank, world_size):
    return torch.arange(rank * 3, rank * 3 + 3)


def fail_on_rank(rank, world_size, bad_rank):
    if rank == bad_rank:
        raise KeyError(f"deliberate failure on rank {rank}")
    # The healthy ranks wait on a collective the failed rank never joins.
    dist.barrier()
    return rank


def hang_on_rank(rank, world_size, bad_rank, pid_dir):
    """Every rank records its pid; the bad rank also starts a child, then hangs."""
    with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if rank == bad_rank:
        child = subprocess.Popen(["sleep", "3600"])
        with open(os.path.join(pid_dir, f"rank{rank}-child.pid"), "w") as f:
            f.write(str(child.pid))
        time.sleep(3600)
    dist.barrier()
    return os.getpid()


def exit_on_rank(rank, world_size, bad_rank):
    if rank == bad_rank:
        os._exit(7)
    dist.barrier()
    return rank

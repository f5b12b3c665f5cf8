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


def kv_load_and_lookup(rank, world_size, directory, dist_type, seed, batches):
    """Load embnb.rowwise.kv's saved table on this rank, then look up batches[rank]."""
    from embnb.rowwise import kv

    table = kv.ShardedKVTable.load(directory, kv.TABLE_NAME, dist_type, seed=seed)
    keys, rows = table.keys.clone(), table.rows.clone()
    return {"keys": keys, "rows": rows, "lookup": table.lookup(batches[rank])}


def kv_train(rank, world_size, spec, batches, grads, lr, directory):
    """One SGD step on a fresh table of embnb.rowwise.kv (`spec.table`): look up batches[rank], apply
    grads[rank], look up again, save the table in `directory`; the stats count both lookups."""
    table = spec.table(rank, world_size)
    rows = table.lookup(batches[rank])
    table.apply_gradients(batches[rank], grads[rank], lr)
    rows_after = table.lookup(batches[rank])
    table.dump(directory)
    return {"rows": rows, "rows_after": rows_after, "stats": table.stats()}


def kv_rank_mismatch(rank, world_size):
    """Error messages of tables whose layout contradicts the process group."""
    from embnb.rowwise import kv

    messages = []
    for size, r in [(world_size + 1, rank), (world_size, (rank + 1) % world_size)]:
        try:
            kv.ShardedKVTable("t", 4, "roundrobin", world_size=size, rank=r)
        except ValueError as e:
            messages.append(str(e))
    return messages


def rank_devices(rank, world_size):
    """Where embnb.dist says this rank computes and runs its collectives."""
    from embnb import dist as edist

    return {"rank_device": str(edist.rank_device()), "collective_device": str(edist.collective_device())}


def collective_helpers(rank, world_size):
    """embnb.collectives' staged collectives (all_reduce_, all_gather_flat,
    exchange) on tensors on this rank's device, and where their results are."""
    from embnb import collectives
    from embnb import dist as edist

    device = edist.rank_device()
    total = collectives.all_reduce_(torch.tensor([float(rank + 1)], device=device))
    gathered = collectives.all_gather_flat(torch.tensor([[rank, 10 * rank]], device=device))
    # rank r sends d + 1 rows of [r, d] to rank d
    send = torch.cat([torch.tensor([[rank, d]] * (d + 1), device=device) for d in range(world_size)])
    received = collectives.exchange(send, [d + 1 for d in range(world_size)], [rank + 1] * world_size)
    return {
        "total": total.tolist(),
        "gathered": gathered.tolist(),
        "received": received.tolist(),
        "devices": [str(t.device) for t in (total, gathered, received)],
        "backend": torch.distributed.get_backend(),
    }


def call_is_fx_tracing(rank, world_size):
    """What torchrec's sharded modules call on every rank."""
    from torch.fx._symbolic_trace import is_fx_tracing

    return is_fx_tracing()


def train_failing_in_kk(rank, world_size, config, bad_rank):
    """training.train, with the bad rank's KK (run in its shuffle's worker
    thread) raising: the fault is injected here, not through the library."""
    from embnb.balancing import shuffle, training

    if rank == bad_rank:

        def failing_balance(*args, **kwargs):
            raise RuntimeError(f"deliberate failure in the KK thread of rank {rank}")

        shuffle.balance = failing_balance
    return training.train(rank, world_size, config)


def train_failing_at_step(rank, world_size, config, bad_rank, bad_step):
    """training.train, with the bad rank's main thread raising when it loads `bad_step`."""
    from embnb.balancing import training

    if rank == bad_rank:
        make_local_batch = training.make_local_batch

        def failing_load(config, rank, step):
            if step == bad_step:
                raise RuntimeError(f"deliberate failure on rank {rank} at step {step}")
            return make_local_batch(config, rank, step)

        training.make_local_batch = failing_load
    return training.train(rank, world_size, config)


def planner_world_sizes(rank, world_size):
    """create_planner inside a process group: the world size it takes by
    default, and its errors for a world size the group does not have."""
    from embnb.planner import create_planner, make_topology

    result = {"default": create_planner("cpu", 8, progress=False).world_size, "errors": []}
    for call in (
        lambda: create_planner("cpu", 8, world_size=world_size + 2, progress=False),
        lambda: create_planner(make_topology(world_size + 2, "cpu"), 8, progress=False),
    ):
        try:
            call()
        except ValueError as e:
            result["errors"].append(str(e))
    return result


def torchrec_loaded(rank, world_size):
    """Whether the rank started with torchrec imported (forked from a server that preloaded it)."""
    import sys

    return "torchrec" in sys.modules


def collective_latency_affinity(rank, world_size):
    """A rank of `embnb.planner.latency`'s measurement, then the cores each of its threads may
    run on (gloo's threads included)."""
    import os

    from embnb.planner import latency

    latency._rank_times(rank, world_size, 0, 1)
    return [sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")]

"""BalancedShuffle with CUDA tensors (where a GPU is lent; the GPU kit runs
it): on one NCCL rank, where "auto" picks the caller's thread, and on two
ranks sharing the GPU over gloo, with each collective thread. Each rank
receives what the same shuffle on the CPU gives it."""

import pytest
import shuffle_cuda_ranks
import torch

from embnb.dist import launch_each

pytestmark = pytest.mark.cuda


def _runs(world_size: int, threads: tuple[str, ...]) -> dict:
    calls = [
        (shuffle_cuda_ranks.shuffle_on_device, (thread, on_cpu))
        for thread in threads
        for on_cpu in (True, False)
    ]
    results = launch_each(calls, world_size, device="cuda", timeout_s=240)
    return {(thread, on_cpu): r for (_, (thread, on_cpu)), r in zip(calls, results)}


def _assert_same(cpu_ranks, cuda_ranks):
    for on_cpu, on_gpu in zip(cpu_ranks, cuda_ranks):
        for (lengths, values, dense, where), (g_lengths, g_values, g_dense, g_where) in zip(
            on_cpu["received"], on_gpu["received"]
        ):
            assert where == "cpu" and g_where.startswith("cuda")
            assert torch.equal(g_lengths, lengths) and torch.equal(g_values, values)
            torch.testing.assert_close(g_dense, dense)


def test_one_nccl_rank_shuffles_on_the_callers_thread_like_the_cpu():
    runs = _runs(1, ("auto",))
    (gpu,) = runs[("auto", False)]
    assert "nccl" in gpu["backend"] and gpu["collective_thread"] == "caller"
    _assert_same(runs[("auto", True)], runs[("auto", False)])


@pytest.mark.parametrize("thread", ["worker", "caller"])
def test_two_ranks_sharing_the_gpu_shuffle_like_the_cpu(thread):
    runs = _runs(2, (thread,))
    _assert_same(runs[(thread, True)], runs[(thread, False)])

"""Each rank's peak activation memory in a batch partition, measured rank
by rank: the memory its dense step (`kernels.SequenceDense`, forward and
backward on its samples) allocates above what it held before.

On a GPU: `torch.cuda.max_memory_allocated` after resetting the peak,
minus what was allocated before the step. On a CPU: torch's profiler with
`profile_memory=True` records every allocation and free of the step (the
CPU allocator keeps no peak); their running sum, in time order, peaks at
the step's activation memory. Parameters and the rank's input tokens are
allocated before the step, so neither is counted; their gradients are.

    peaks = peak_memory_partition([[512, 64], [128, 128, 200]], width=64)   # bytes per rank
"""

from __future__ import annotations

import itertools
import sys
import warnings
from collections.abc import Sequence

import torch

from embnb._checks import check_int
from embnb._stderr import native_stderr
from embnb.steptime.kernels import SequenceDense
from embnb.steptime.measure import DEFAULT_HIDDEN

__all__ = ["peak_memory_partition", "peak_step_bytes"]


# What Kineto writes to fd 2 around every CPU profile: its start and stop
# markers, a note on blocks allocated before it started (the inputs), and,
# under a CUDA build of torch without a GPU, its failed probe for GPUs
KINETO_NOISE = (
    "USDT:",
    "Memory block of unknown size was allocated before the profiling",
    "gpuGetDeviceCount failed",
)


def _cpu_peak(step) -> int:
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings(), native_stderr() as lines:
        # torch 2.11 warns that a profile keeps one cycle's events: one cycle is all this reads
        warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
    kept = [line for line in lines if not any(noise in line for noise in KINETO_NOISE)]
    if kept:
        sys.stderr.write("".join(kept))

    def walk(nodes):
        for node in nodes:
            yield node
            yield from walk(node.children)

    events = prof.profiler.kineto_results.experimental_event_tree()
    allocations = sorted(
        (n.start_time_ns, n.extra_fields.alloc_size)
        for n in walk(events)
        if n.tag == _EventType.Allocation and n.extra_fields.device.type == "cpu"
    )
    return max(itertools.accumulate(size for _, size in allocations), default=0)


def peak_step_bytes(
    lengths: Sequence[int],
    width: int,
    hidden: Sequence[int] = DEFAULT_HIDDEN,
    device: str = "cpu",
    seed: int = 0,
) -> int:
    """Peak bytes one forward and backward of `SequenceDense` on samples of
    `lengths` allocates above what it held before (module docstring)."""
    device = torch.device(device)
    torch.manual_seed(seed)
    dense = SequenceDense(width, hidden).to(device)
    tokens = torch.randn(sum(lengths), width, device=device, requires_grad=True)

    def step() -> None:
        dense(tokens, list(lengths)).backward()

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    return _cpu_peak(step)


def peak_memory_partition(
    sequence_lengths: Sequence[Sequence[int]],
    width: int = 64,
    hidden: Sequence[int] = DEFAULT_HIDDEN,
    device: str = "cpu",
) -> list[int]:
    """Every rank's peak activation bytes in a batch partition
    (`sequence_lengths[r]`: rank r's samples' lengths), one rank after another."""
    check_int("width", width, low=1)
    if not sequence_lengths:
        raise ValueError("sequence_lengths is empty: pass one list of lengths per rank")
    return [
        peak_step_bytes([check_int("sequence length", int(n), low=1) for n in lengths], width, hidden, device)
        for lengths in sequence_lengths
    ]

"""Timing of the bucketize kernels: embnb's against FBGEMM's and the reference (notebook 01a's kernel
table and `python -m embnb.bench bucketize`).

Per (dist_type, num_keys, W, threads), on the same inputs in the same run: embnb's op
(`torch.ops.embnb.bucketize`), FBGEMM's `block_bucketize_sparse_features(sequence=True)` (continuous only;
on a GPU only with a CUDA FBGEMM) and the pure-torch reference. Outputs are compared bit for bit first,
then the calls are interleaved round by round; figures are medians after warm-up, with the best round and
per-round ratios. On CPU, embnb's kernel uses `at::parallel_for` and FBGEMM's CPU op one thread, so only
the one-thread ratio compares the kernels themselves. GB/s counts the bytes any implementation must move
(the bench sets it against the copy bandwidth). Input: 8 features, lengths uniform on [0, 64] scaled to
exactly `num_keys` keys, keys uniform over 10**8 rows, FBGEMM's block size ceil(rows / W).
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from embnb._checks import check_int
from embnb.cuda import loader
from embnb.rowwise.routing import DIST_CODES, DistType, bucketize, feistel_round_keys
from embnb.timing import interleaved_seconds, machine_name, paired_ratio

PEERS = ("embnb", "fbgemm", "reference")


@dataclass(frozen=True)
class KernelCases:
    """The cases `run` times and how."""

    sizes: tuple[int, ...]  # keys per call
    world_sizes: tuple[int, ...]
    dist_types: tuple[str, ...] = ("continuous",)
    device: str = "cpu"
    threads: tuple[int, ...] = (1, 0)  # torch threads, a row each (0: all cores; CUDA: the first only)
    repeats: int = 15  # interleaved timed rounds
    warmup: int = 3
    reference_repeats: int = 3  # rounds the slow pure-torch reference is timed in


# the input of every case (the module docstring), recorded with the results
INPUT = {
    "num_features": 8,
    "avg_length": 32,
    "rows": 10**8,
    "lengths_dtype": "int32",
    "indices_dtype": "int64",
}


def make_inputs(num_keys: int, device: str, rows: int = INPUT["rows"], seed: int = 0):
    """(lengths int32, indices int64) of `INPUT`'s features with exactly `num_keys` keys (the remainder
    one key each to the first segments), ids uniform in [0, rows)."""
    num_features, avg_length = INPUT["num_features"], INPUT["avg_length"]
    gen = torch.Generator().manual_seed(seed)
    batch = max(1, round(num_keys / (num_features * avg_length)))
    drawn = torch.randint(0, 2 * avg_length + 1, (num_features * batch,), generator=gen)
    lengths = drawn * num_keys // max(int(drawn.sum()), 1)
    lengths[: num_keys - int(lengths.sum())] += 1
    indices = torch.randint(0, rows, (num_keys,), generator=gen)
    return (lengths.to(device, torch.int32), indices.to(device, torch.int64))


def fbgemm_peer(device: str) -> Callable | None:
    """FBGEMM's op when it runs on `device`, else None."""
    try:
        import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm.*)

        op = torch.ops.fbgemm.block_bucketize_sparse_features
        one = torch.ones(1, dtype=torch.int64, device=device)
        op(one, one - 1, False, True, one, 1)
        return op
    except Exception:  # not installed, or a CPU-only build on a GPU
        return None


def _same(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def measure_case(
    num_keys: int, world_size: int, dist_type: str, threads: int, cases: KernelCases, fbgemm: Callable | None
) -> dict:
    """One row of the table: outputs compared, then every implementation timed interleaved."""
    device, num_features, rows = cases.device, INPUT["num_features"], INPUT["rows"]  # each feature's rows
    lengths, indices = make_inputs(num_keys, device)
    block = math.ceil(rows / world_size)
    mode = DistType.parse(dist_type)
    # the op's entry: a continuous feature's block, a feistel table's rows; roundrobin routes unbounded
    # keys here (0), as the KV tables and dynamicemb do
    entry = {DistType.CONTINUOUS: block, DistType.FEISTEL_ROUNDROBIN: rows}.get(mode, 0)
    blocks = [entry] * num_features
    keys = feistel_round_keys(0) if mode is DistType.FEISTEL_ROUNDROBIN else None
    loader.load()
    calls = {  # the op itself, as FBGEMM's: no Python-side argument checks timed
        "embnb": lambda: torch.ops.embnb.bucketize(
            lengths, indices, world_size, [DIST_CODES[mode]] * num_features, blocks, None, keys
        ),
        "reference": lambda: bucketize(
            lengths, indices, world_size, mode, blocks, num_embeddings=blocks, native=False
        ),
    }
    if fbgemm is not None and mode is DistType.CONTINUOUS:
        block_sizes = torch.full((num_features,), block, dtype=indices.dtype, device=device)
        calls["fbgemm"] = lambda: fbgemm(lengths, indices, False, True, block_sizes, world_size)
    # bit-identical outputs first: a fast wrong answer is not a result
    ours = calls["embnb"]()
    identical = _same(ours[:3], calls["reference"]()[:3])
    if "fbgemm" in calls:
        theirs = calls["fbgemm"]()
        identical &= _same(ours[:3], (theirs[0], theirs[1], theirs[4]))
    times, used_threads = interleaved_seconds(
        calls, cases.repeats, cases.warmup, device, threads, {"reference": cases.reference_repeats}
    )
    # what any implementation moves: read lengths and keys; write W * len(lengths) lengths, keys, permute
    moved = lengths.nbytes * (1 + world_size) + 3 * indices.nbytes
    row: dict[str, Any] = dict(
        num_keys=indices.numel(),
        world_size=world_size,
        dist_type=mode.value,
        threads=used_threads,
        num_segments=lengths.numel(),
        bytes_moved=moved,
        identical=bool(identical),
    )
    for name in PEERS:  # seconds (median, best), keys/s and GB/s; None where not timed
        seconds = statistics.median(times[name]) if name in times else None
        row[f"{name}_s"] = seconds
        row[f"{name}_min_s"] = min(times[name]) if name in times else None
        row[f"{name}_mkeys_s"] = seconds and indices.numel() / seconds / 1e6
        row[f"{name}_gbps"] = seconds and moved / seconds / 1e9
    # per interleaved round: the spread of the ratio, which moves between runs on a shared machine
    row["embnb_rounds_s"], row["fbgemm_rounds_s"] = times["embnb"], times.get("fbgemm")
    per_round = paired_ratio(times["fbgemm"], times["embnb"]) if "fbgemm" in times else None
    row["embnb_over_fbgemm_low"] = per_round and per_round.low
    row["embnb_over_fbgemm_high"] = per_round and per_round.high
    for peer in PEERS[1:]:  # best-of-rounds ratio: less sensitive to load from other processes
        row[f"embnb_over_{peer}"] = row[f"{peer}_s"] and row[f"{peer}_s"] / row["embnb_s"]
        row[f"embnb_over_{peer}_min"] = row[f"{peer}_min_s"] and row[f"{peer}_min_s"] / row["embnb_min_s"]
    return row


def run(cases: KernelCases, progress: bool = True) -> dict:
    """Every case of `cases` at each thread count (`progress`: a tqdm bar): the rows, with the device,
    its machine and cores, and whether FBGEMM's op ran there. Raises ValueError on a bad thread count."""
    threads = cases.threads
    if not threads:
        raise ValueError("threads must be a non-empty list of ints >= 0 (0: all cores), got []")
    for t in threads:
        check_int("threads", t, low=0)
    if torch.device(cases.device).type == "cuda":
        threads = threads[:1]  # the host threads only launch the kernels
    fbgemm = fbgemm_peer(cases.device)
    grid = list(itertools.product(cases.dist_types, cases.sizes, cases.world_sizes, threads))
    rows = [
        measure_case(num_keys, world_size, dist_type, thread_count, cases, fbgemm)
        for dist_type, num_keys, world_size, thread_count in tqdm(grid, desc="cases", disable=not progress)
    ]
    machine, fbgemm = machine_name(cases.device), "available" if fbgemm else "not available on this device"
    return dict(device=cases.device, machine=machine, cores=os.cpu_count(), fbgemm=fbgemm, rows=rows)

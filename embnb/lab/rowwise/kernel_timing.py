"""Timing of the bucketize kernels: embnb's against FBGEMM and the reference.

Used by notebook 01's kernel table and by `python -m embnb.bench bucketize`
(the CLI, which writes the JSON of a full run).

For each number of keys and world size W this times, on the same inputs in
the same run: embnb's native kernel (`torch.ops.embnb.bucketize`),
FBGEMM's `block_bucketize_sparse_features(sequence=True)` (both ops called
directly; FBGEMM in continuous mode only, and on a GPU only where a CUDA
FBGEMM is installed) and the pure-torch reference. Calls are interleaved
round by round so that load from other processes hits all of them alike;
each figure is a median after warm-up (CUDA timed with events); the JSON
also keeps the best round, and the table the ratio of best rounds.

On CPU each case runs at every thread count of `threads` (0: all cores),
set with `torch.set_num_threads` for all implementations alike: embnb's
kernel splits its work with `at::parallel_for`, FBGEMM's CPU op runs on one
thread whatever the setting, so a ratio at all cores depends on the core
count and only the one-thread ratio compares the kernels themselves. On a GPU the pure-torch reference runs on
the GPU too: it is the torch-native GPU peer.
Before timing, the outputs are compared: embnb must equal FBGEMM and the
reference bit for bit, or the run fails.

Bandwidth counts the bytes any implementation must move: read lengths and
keys, write the new lengths, the keys and the permute. It is compared with
the device's copy bandwidth (`dst.copy_(src)`, bytes read + written).

The input is a KeyedJaggedTensor of `num_features` features whose lengths
are uniform on [0, 2 * avg_length] scaled to `num_keys` keys exactly, keys uniform over `rows` table rows and,
for continuous, FBGEMM's block size ceil(rows / W).
"""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from embnb.cuda import loader
from embnb.rowwise.routing import DIST_CODES, DistType, bucketize
from embnb.timing import interleaved_seconds, machine_name, median_seconds

SIZES = [10**5, 10**6, 10**7]
QUICK_SIZES = [10**4, 10**5]
WORLD_SIZES = [8, 64]


def make_inputs(
    num_keys: int,
    device: str,
    *,
    num_features: int = 8,
    avg_length: int = 32,
    rows: int = 10**8,
    seed: int = 0,
    lengths_dtype: torch.dtype = torch.int32,
    indices_dtype: torch.dtype = torch.int64,
):
    """(lengths, indices) with exactly `num_keys` keys: lengths drawn uniform
    on [0, 2 * avg_length], then scaled to sum to `num_keys` (the remainder
    one key each to the first segments), so a table row's key count is the
    one asked for."""
    gen = torch.Generator().manual_seed(seed)
    batch = max(1, round(num_keys / (num_features * avg_length)))
    drawn = torch.randint(0, 2 * avg_length + 1, (num_features * batch,), generator=gen)
    lengths = drawn * num_keys // max(int(drawn.sum()), 1)
    lengths[: num_keys - int(lengths.sum())] += 1
    indices = torch.randint(0, rows, (num_keys,), generator=gen)
    return (lengths.to(device, lengths_dtype), indices.to(device, indices_dtype))


def bytes_moved(lengths: torch.Tensor, indices: torch.Tensor, world_size: int) -> int:
    """Read lengths and keys; write W * len(lengths) lengths, keys, permute."""
    length_bytes = lengths.element_size() * lengths.numel()
    key_bytes = indices.element_size() * indices.numel()
    return length_bytes * (1 + world_size) + 3 * key_bytes


def copy_gbps(device: str, num_bytes: int = 256 << 20, repeats: int = 10) -> float:
    """The device's copy bandwidth, bytes read + written per second / 1e9."""
    src = torch.ones(num_bytes // 8, dtype=torch.int64, device=device)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), repeats, 2, device)
    return 2 * num_bytes / seconds / 1e9


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
    num_keys: int,
    world_size: int,
    dist_type: str,
    device: str,
    *,
    threads: int,
    repeats: int,
    warmup: int,
    reference_repeats: int,
    fbgemm: Callable | None,
) -> dict:
    lengths, indices = make_inputs(num_keys, device)
    num_features = 8
    rows = 10**8
    block = math.ceil(rows / world_size)
    blocks = [block] * num_features
    mode = DistType.parse(dist_type)

    loader.load()
    code = DIST_CODES[mode]
    calls = {
        # The op itself, as FBGEMM's: no Python-side argument checks timed.
        "embnb": lambda: torch.ops.embnb.bucketize(
            lengths, indices, world_size, [code] * num_features, blocks
        ),
        "reference": lambda: bucketize(lengths, indices, world_size, mode, blocks, native=False),
    }
    if fbgemm is not None and mode is DistType.CONTINUOUS:
        block_sizes = torch.full((num_features,), block, dtype=indices.dtype, device=device)
        calls["fbgemm"] = lambda: fbgemm(lengths, indices, False, True, block_sizes, world_size)

    # Bit-identical outputs first: a fast wrong answer is not a result.
    ours = calls["embnb"]()
    identical = _same(ours[:3], calls["reference"]()[:3])
    if "fbgemm" in calls:
        theirs = calls["fbgemm"]()
        identical &= _same(ours[:3], (theirs[0], theirs[1], theirs[4]))

    times, used_threads = interleaved_seconds(
        calls, repeats, warmup, device, threads, first_rounds_only={"reference": reference_repeats}
    )
    num = indices.numel()
    moved = bytes_moved(lengths, indices, world_size)
    row: dict[str, Any] = dict(
        num_keys=num,
        world_size=world_size,
        dist_type=mode.value,
        threads=used_threads,
        num_segments=lengths.numel(),
        bytes_moved=moved,
        identical=bool(identical),
    )
    row.update(_speeds(times, num, moved))
    return row


def _speeds(times: dict[str, list[float]], num_keys: int, moved: int) -> dict[str, Any]:
    """Seconds (median and best), keys/s and GB/s per implementation, and embnb's ratios to the peers."""
    row: dict[str, Any] = {}
    for name in ("embnb", "fbgemm", "reference"):
        if name not in times:
            row.update(
                {f"{name}_s": None, f"{name}_min_s": None, f"{name}_mkeys_s": None, f"{name}_gbps": None}
            )
            continue
        seconds = statistics.median(times[name])
        row.update(
            {
                f"{name}_s": seconds,
                f"{name}_min_s": min(times[name]),
                f"{name}_mkeys_s": num_keys / seconds / 1e6,
                f"{name}_gbps": moved / seconds / 1e9,
            }
        )
    # per interleaved round: the spread of the ratio, which moves between runs on a shared machine
    row["embnb_rounds_s"] = times["embnb"]
    row["fbgemm_rounds_s"] = times.get("fbgemm")
    if "fbgemm" in times:
        per_round = [f / e for f, e in zip(times["fbgemm"], times["embnb"])]
        row["embnb_over_fbgemm_low"], row["embnb_over_fbgemm_high"] = min(per_round), max(per_round)
    else:
        row["embnb_over_fbgemm_low"] = row["embnb_over_fbgemm_high"] = None
    for peer in ("fbgemm", "reference"):
        theirs, best = row[f"{peer}_s"], row[f"{peer}_min_s"]
        row[f"embnb_over_{peer}"] = theirs / row["embnb_s"] if theirs else None
        # Best-of-rounds ratio: less sensitive to load from other processes.
        row[f"embnb_over_{peer}_min"] = best / row["embnb_min_s"] if best else None
    return row


def run(
    sizes=SIZES,
    world_sizes=WORLD_SIZES,
    dist_types=("continuous",),
    device: str = "cpu",
    *,
    threads: Sequence[int] = (1, 0),
    repeats: int = 15,
    warmup: int = 3,
    reference_repeats: int = 3,
    progress: bool = True,
) -> dict:
    """Measure every case at every thread count of `threads` (0: all cores;
    on CUDA only the first); returns the JSON payload (rows plus context)."""
    bad = [t for t in threads if not isinstance(t, int) or isinstance(t, bool) or t < 0]
    if not threads or bad:
        raise ValueError(f"threads must be a non-empty list of ints >= 0 (0: all cores), got {list(threads)}")
    if torch.device(device).type == "cuda":
        threads = threads[:1]  # the host threads only launch the kernels
    fbgemm = fbgemm_peer(device)
    load_before = os.getloadavg()
    rows = []
    cases = itertools.product(dist_types, sizes, world_sizes, threads)
    for dist_type, num_keys, world_size, thread_count in cases:
        row = measure_case(
            num_keys,
            world_size,
            dist_type,
            device,
            threads=thread_count,
            repeats=repeats,
            warmup=warmup,
            reference_repeats=reference_repeats,
            fbgemm=fbgemm,
        )
        rows.append(row)
        if progress:
            print(format_table([row], header=len(rows) == 1), flush=True)
    copy = copy_gbps(device)
    for row in rows:
        row["embnb_fraction_of_copy"] = row["embnb_gbps"] / copy
    return dict(
        benchmark="bucketize",
        device=device,
        machine=machine_name(device),
        cpu_model=_cpu_model(),
        cores=os.cpu_count(),
        threads=list(threads),
        torch=torch.__version__,
        fbgemm="available" if fbgemm else "not available on this device",
        copy_gbps=copy,
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        input=dict(
            num_features=8,
            avg_length=32,
            rows=10**8,
            lengths_dtype="int32",
            indices_dtype="int64",
            repeats=repeats,
            warmup=warmup,
            reference_repeats=reference_repeats,
        ),
        rows=rows,
    )


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _rounds(row: dict) -> str:
    low, high = row.get("embnb_over_fbgemm_low"), row.get("embnb_over_fbgemm_high")
    return "n/a" if low is None else f"{low:.2f}-{high:.2f}"


def fbgemm_ratio_sentence(rows: list[dict], threads: int = 1) -> str:
    """embnb over FBGEMM at `threads` per case: the ratio of medians with the
    range of the per-round ratios, so a reader sees how far it moves."""
    cases = [r for r in rows if r["threads"] == threads and r.get("embnb_over_fbgemm_low") is not None]
    if not cases:
        return f"no case timed FBGEMM at {threads} thread(s)"
    return (
        f"embnb's kernel over FBGEMM's at {threads} thread(s), this run, ratio of medians "
        "(range over its interleaved rounds): "
        + "; ".join(
            f"{r['num_keys']:,} keys, W={r['world_size']}: {r['embnb_over_fbgemm']:.2f}x "
            f"({r['embnb_over_fbgemm_low']:.2f}-{r['embnb_over_fbgemm_high']:.2f}, "
            f"{len(r['embnb_rounds_s'])} rounds)"
            for r in cases
        )
        + ". The ratio moves between runs on this shared machine (docs/performance.md has the bench's runs): "
        "read it with its range, as this run's"
    )


def format_table(rows: list[dict], header: bool = True) -> str:
    lines = []
    if header:
        lines.append(
            f"{'keys':>9} {'W':>3} {'dist_type':<15} {'threads':>7} {'embnb Mk/s':>10} "
            f"{'GB/s':>6} {'fbgemm Mk/s':>11} {'GB/s':>6} {'ref Mk/s':>8} "
            f"{'x fbgemm':>8} {'rounds':>11} {'(best)':>6} {'x ref':>6} same"
        )
    for r in rows:
        lines.append(
            f"{r['num_keys']:>9} {r['world_size']:>3} {r['dist_type']:<15} {r['threads']:>7} "
            f"{_fmt(r['embnb_mkeys_s']):>10} {_fmt(r['embnb_gbps'], 2):>6} "
            f"{_fmt(r['fbgemm_mkeys_s']):>11} {_fmt(r['fbgemm_gbps'], 2):>6} "
            f"{_fmt(r['reference_mkeys_s'], 2):>8} "
            f"{_fmt(r['embnb_over_fbgemm'], 2):>8} "
            f"{_rounds(r):>11} "
            f"{_fmt(r['embnb_over_fbgemm_min'], 2):>6} "
            f"{_fmt(r['embnb_over_reference'], 0):>6} "
            f"{'yes' if r['identical'] else 'NO'}"
        )
    return "\n".join(lines)

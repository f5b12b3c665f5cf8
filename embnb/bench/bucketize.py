"""`python -m embnb.bench bucketize`: embnb's kernels against FBGEMM.

The measuring is `embnb.lab.rowwise.kernel_timing` (read its docstring for what
is timed and how); this CLI picks the cases, prints the table and writes the
JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from dataclasses import asdict

import pandas as pd

from embnb.bench.results import add_out_argument, write_results
from embnb.dist import resolve_device
from embnb.lab.rowwise.kernel_timing import INPUT, KernelCases, run
from embnb.rowwise.routing import DistType
from embnb.scaling import copy_bandwidth

SIZES = [10**5, 10**6, 10**7]
QUICK_SIZES = [10**4, 10**5]
WORLD_SIZES = [8, 64]

# the bench's printed table: speeds (M keys/s, GB/s), FBGEMM's time over embnb's (median, per-round range,
# best) and over the reference's, and whether the outputs were identical
TABLE_COLUMNS = ["num_keys", "world_size", "dist_type", "threads", "embnb_mkeys_s", "embnb_gbps"]
TABLE_COLUMNS += ["fbgemm_mkeys_s", "reference_mkeys_s", "embnb_over_fbgemm", "embnb_over_fbgemm_low"]
TABLE_COLUMNS += ["embnb_over_fbgemm_high", "embnb_over_fbgemm_min", "embnb_over_reference", "identical"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embnb.bench bucketize", description=__doc__.splitlines()[0]
    )
    add, ints = parser.add_argument, lambda text: [int(float(x)) for x in text.split(",")]
    add("--sizes", type=ints, default=None, help="numbers of keys, e.g. 1e5,1e6")
    add("--world-sizes", type=ints, default=WORLD_SIZES)
    add("--dist-types", default="continuous", help="comma-separated; FBGEMM runs only continuous")
    add("--device", default="auto", choices=["auto", "cpu", "cuda"])
    add("--threads", type=ints, default=[1, 0], help="torch threads, one row each (0: all cores; CPU only)")
    add("--repeats", type=int, default=15)
    add("--warmup", type=int, default=3)
    add("--reference-repeats", type=int, default=3)
    add("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, 5 repeats, no JSON written")
    add("--no-write", action="store_true")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
    except ValueError as error:  # --device cuda without a GPU
        parser.error(str(error))
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    dist_types = tuple(DistType.parse(d).value for d in args.dist_types.split(","))
    cases = KernelCases(
        tuple(sizes),
        tuple(args.world_sizes),
        dist_types,
        device,
        tuple(args.threads),
        5 if args.quick else args.repeats,
        args.warmup,
        args.reference_repeats,
    )
    load_before = os.getloadavg()
    payload = run(cases)
    copy = copy_bandwidth(device) / 1e9  # GB/s
    for row in payload["rows"]:
        row["embnb_fraction_of_copy"] = row["embnb_gbps"] / copy
    timing = {k: v for k, v in asdict(cases).items() if k in ("repeats", "warmup", "reference_repeats")}
    payload |= dict(benchmark="bucketize", cpu_model=_cpu_model(), copy_gbps=copy, input=INPUT | timing)
    payload |= dict(load_average_before=load_before, load_average_after=os.getloadavg())
    print(pd.DataFrame(payload["rows"])[TABLE_COLUMNS].to_string(index=False, float_format="{:.2f}".format))
    print(
        f"machine: {payload['machine']} ({payload['cpu_model']}), {os.cpu_count()} cores, copy "
        f"{payload['copy_gbps']:.1f} GB/s, load average {payload['load_average_before'][0]:.1f} -> "
        f"{payload['load_average_after'][0]:.1f}"
    )
    if not (args.quick or args.no_write):
        print(f"wrote {write_results('bucketize', payload, args.out)}")
    if not all(r["identical"] for r in payload["rows"]):
        print("bucketize bench: embnb's output differs from a peer's", file=sys.stderr)
        return 1
    return 0


def _cpu_model() -> str:
    try:
        lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"

"""The GPU kit: verify every CUDA path of embnb in one short run on an
air-gapped GPU machine whose Python stack is fixed (Python 3.12, torch
2.11.0+cu130, no torchrec, fbgemm, papermill or jupyter; docs/testing.md, "The GPU kit").

On a machine with a package registry:

    python scripts/gpu_kit.py gather            # wheels into build/gpu-kit (< 48 MiB)

On the GPU machine, from the repository root, with that folder:

    python3 scripts/gpu_kit.py run --kit build/gpu-kit --out OUT

`run` installs the wheels into a temporary target (never into the machine's
Python; with `--fbgemm-cuda PARTS`, FBGEMM's slimmed CUDA build from
scripts/fbgemm_cuda.py instead of fbgemm-gpu-cpu), builds the native
extension for the local GPU, runs the CUDA parity and launcher tests (a
process per file), then the benches in a GPU window's planned order (GROUPS):
`python -m embnb.bench calibrate`, `steptime` (STEPTIME_BENCH, then at a capped
HBM; STEPTIME_SCALE_BENCH before them: plans made beforehand, production-scale
tables, Zipf ids), `hstu` (HSTU_BENCH: the balancer at recsys-examples' shape, within
HSTU_STEP_S) and `balancer` (BALANCER_BENCH: rank by rank at W = 8 and 16 on
the one GPU; the memory-capped balance with each rank's
torch.cuda.max_memory_allocated), all with `--device cuda`; the hstu and
balancer benches compare methods only after issue 70's acceptance check
(`embnb.scaling`: a batch sweep of the critical rank, "overhead-bound: not
compared" where no batch passes), then `routing` (ROUTING_BENCH: notebook 01's streams and routings on
one table of 9.5 GiB, W = 8 rank by rank, within ROUTING_STEP_S). Then every notebook with device="cuda"
(small parameters) and `python -m embnb.bench bucketize --device cuda`. It
writes JSON results, pytest reports and executed notebooks under OUT; the
benches' JSON files (named after the GPU) are the ones to commit to
benchmarks/results. Each step has its own time limit and is recorded in
OUT/steps.json as it ends and in OUT/kit.json at the end, with its outcome and
time; a failed or cut step does not stop the others nor lose their files.
Where a GPU is visible the run cannot pass unless
CUDA really ran: the build fails without CUDA kernels, EMBNB_REQUIRE_GPU=1
turns a skipped CUDA test into a failure, and kit.json records the CUDA
kernels built and the CUDA tests run, skipped and failed. Without a GPU
(the CPU test of the kit) it runs the same steps with device="cpu";
`--short-bench` runs the benches at tiny sizes (the *_SHORT sizes), the
acceptance check included.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
KIT_REQUIREMENTS = ROOT / "scripts" / "gpu_kit.txt"
DEFAULT_KIT = ROOT / "build" / "gpu-kit"
DEFAULT_FBGEMM_STORE = pathlib.Path("/tmp/embnb-fbgemm-cuda")  # outside the checkout: kept between commands
MAX_KIT_BYTES = 48 << 20  # 64 MiB travel per call; the repository needs the rest
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64", "any"]

# Notebook parameters small enough for one short GPU run.
NOTEBOOK_PARAMETERS = {
    "01_modulo_aliasing": {"num_keys": 100_000, "world_sizes": [6, 8, 12], "zipf_seeds": 8},
    "01a_routing_measured": {
        "num_keys": 100_000,
        "world_sizes": [6, 8, 12],
        "hash_keys_per_rank": [100, 1_000, 10_000],
        "kv_keys_per_rank": 1024,
        "kernel_sizes": [1_000_000],
        "kernel_repeats": 3,
    },
    "02_cw_permute_indices": {},
    "02a_cw_bytes": {},
    "03_dp_planner": {"num_tables": 12, "quality_instances": 4},
    # the plans measured rank by rank at W = 8 of 40 tables: at W = 8 and 32 of 100 they took 136 s on
    # the H200 (2026-11-27)
    "03a_dp_planner_measured": {
        "num_tables": 12,
        "budget_fractions": [1.0, 0.5],
        "measured_world_size": 8,
        "measured_num_tables": 40,
    },
    "04_balancer_overlap": {
        "batch_size": 32,
        "max_length": 1024,
        "repeats": 3,
        "steps": 3,
        "sample_counts": [256],
        "part_counts": [8],
        "seeds": [0],
        "comparison_max_length": 1024,
        "job_steps": 2,
    },
    "04a_balancer_measured": {
        "batch_size": 32,
        "max_length": 1024,
        "steps": 3,
        "repeats": 3,
        "measured_batch_size": 32,
    },
}
# `python -m embnb.bench balancer` on the GPU: every part of the bench, at
# sizes that take minutes. Rank by rank after the acceptance check (issue 70: each distribution's
# and W's heaviest rank at 32, 128 and 512 samples per rank, compared only where the fitted fixed
# share is at most 10%), at the bench's own lengths and model; W = 64 left out: compared at up to
# 512 samples per rank it would take minutes alone. Partitioning (CPU work) at two sizes; training
# and exchanges shortened.
BALANCER_BENCH = {
    "--samples": [1024, 16384],
    "--parts": [8, 64],
    "--budget": 0.2,
    "--world-size": [2],
    "--steps": 8,
    "--repeats": 5,
    "--exchange-world-size": [2, 4],
    "--measured-world-size": [8, 16],
    "--measured-batch-size": 32,
    "--measured-max-length": 2048,
    "--measured-width": 256,  # width 32 was launch-bound on the H100 (2026-11-26)
    "--measured-repeats": 3,
    "--cap-world-size": 16,
    "--sweep-factors": [1, 4, 16],
    "--max-fixed-share": 0.1,
}
# `python -m embnb.bench steptime --plans`: notebook 03's plans at production scale (issue 70, item 3),
# first in the "plans" group: the bench's 100 tables of 1,000 to 10 M rows (54 GiB of fp32 rows),
# planned beforehand here on the CPU for a CUDA topology of one host of 8 (torchrec 1.6.1, the machine's;
# `python -m embnb.bench steptime --tables 100 --max-rows 10000000 --world-sizes 8 --compute-device cuda
# --batch-size 256 --write-plans benchmarks/plans/steptime-scale-cuda-1x8.json`: torchrec's default,
# Greedy, embnb DP, and embnb DP on the committed GPU refit), so no planner runs there; Zipf ids of
# exponent 1.2 (the HSTU step's); the acceptance check on each plan's critical rank at 256, 1,024 and
# 4,096 samples per rank (fixed share of its lookups at most 20% of their time), then the plans compared
# at the chosen batch, W = 8, 3 rounds. GPU time, from the committed H200 runs (2026-11-28, 256 samples
# per rank): a rank's lookups took about 5.5 ns per id (19.5 ms for 3.5 M ids) plus about 0.45 ms per
# TBE; at 4,096 samples per rank the critical rank reads about 7 M ids, about 40 ms a step, so the
# sweep (4 plans x 3 batches x 4 calls) and the comparison (4 plans x 8 ranks x 3 rounds x 2 steps) are
# about 10 s of kernels; the rest is the host's: the Zipf batches (74 M ids over the three batches, each
# table's CDF built once), the ids each rank receives (selected once per plan and rank) and the TBEs
# built for each rank of each round, about 2-3 minutes in all; the step's limit is 300 s and the bench
# writes its JSON after the check, so a cut keeps the check. Memory: the ranks run one after another on
# the one GPU; the largest rank holds 9.7 GiB of table rows (torchrec's storage estimate, every plan
# under 10 GiB), and with its inputs at the three batches and the backward's buffers the peak is under
# 20 GiB.
STEPTIME_SCALE_BENCH = {
    "--plans": "benchmarks/plans/steptime-scale-cuda-1x8.json",
    "--batch-size": 256,
    "--sweep-factors": [1, 4, 16],
    "--max-fixed-share": 0.2,
    "--ids": "zipf",
    "--zipf-alpha": 1.2,
    "--repeats": 3,
}
STEPTIME_SCALE_STEP_S = 300
# the same flags on a tiny plans file beside it (6 tables of at most 2,000 rows, one host of 4)
STEPTIME_SCALE_BENCH_SHORT = {
    **STEPTIME_SCALE_BENCH,
    "--plans": "benchmarks/plans/steptime-scale-tiny.json",
    "--batch-size": 8,
    "--repeats": 1,
}
# `python -m embnb.bench steptime`: notebook 03's plans rank by rank, on the
# device's own topology (torchrec's GPU estimates beside what was measured): one host of 8, then 2
# hosts of 8 (table_row_wise and grid_shard across hosts).
STEPTIME_BENCH = {"--world-sizes": [8, 16], "--devices-per-host": 8, "--timeout-s": 60, "--repeats": 3}
# The regime of notebook 03's headline, UVM caching: HBM per device at about half the model's share
# (the model's tables are 0.97 GiB of fp32 weights, 0.12 GiB per device at W = 8), so the planners
# put tables in UVM with an HBM cache; steptime runs FBGEMM's UVM-caching TBEs.
STEPTIME_UVM_BENCH = {**STEPTIME_BENCH, "--world-sizes": [8], "--hbm-gib": 0.06}
# `python -m embnb.bench calibrate --device cuda`: torchrec's perf model fitted on the GPU (two
# coefficients per sharding type and kernel, lookup bytes and a cost per shard: the kernels of a
# CUDA topology are more than a CPU's, and on the H100 a small model's step followed its kernel
# calls, not its bytes).
CALIBRATE_BENCH = {
    "--train-seeds": [1, 2],
    "--train-world-sizes": [8],
    "--train-plans": 4,
    "--heldout": ["0:8", "3:8"],
    "--terms": ["lookup_size_multiplier", "shard_multiplier"],
    "--timeout-s": 20,
    "--repeats": 3,
}
# calibrate has never finished on a GPU: its limit keeps the production-scale steptime step after it
# (at most 300 s) inside the first command's 500 s deadline with the cheap group's 170 s.
CALIBRATE_STEP_S = 120
CALIBRATE_BENCH_SHORT = {
    "--tables": 5,
    "--max-rows": 2000,
    "--batch-size": 8,
    "--train-seeds": [1],
    "--train-world-sizes": [2, 3],
    "--train-plans": 3,
    "--heldout": ["0:2"],
    "--terms": ["lookup_size_multiplier", "shard_multiplier"],
    "--timeout-s": 5,
    "--warmup": 0,
    "--repeats": 2,
}
STEPTIME_BENCH_SHORT = {  # 2 hosts of 2 on a CUDA topology: the host-level types on the CPU too
    "--world-sizes": [4],
    "--devices-per-host": 2,
    "--compute-device": "cuda",
    "--tables": 6,
    "--max-rows": 2000,
    "--batch-size": 16,
    "--repeats": 1,
    # the check at tiny sizes on a CPU says overhead-bound at 20%: at 100% over 8x the work it passes
    # wherever the fitted fixed cost is below the time, so the comparison's code runs too
    "--sweep-factors": [1, 8],
    "--max-fixed-share": 1.0,
}
# `python -m embnb.bench hstu` on the GPU: the balancer at recsys-examples' shape (an HSTU-like model of
# width 1024, 8 layers, 4 heads of 256, bf16; Zipf(1.2) lengths up to 4096), rank by rank at W = 8, then
# W = 16 while the bench's deadline allows, each after the acceptance check (issue 70): the cut's
# heaviest rank at 32, 128 and 512 samples per rank, the methods compared only at the smallest of
# those whose fitted fixed share is at most 10%. The committed H200 run (2026-11-27, 32 samples per
# rank) fits about 69 ms + 13.5 ms per TFLOP per rank: at 512 samples per rank, about 8 ms of forward
# and backward per sample, a W = 8 comparison is about 4 methods x 8 ranks x 4 rounds x 0.25-0.5 s,
# 30-65 s. The width sweep is left out (recsys-examples' width only). The step's own limit
# (HSTU_STEP_S) is above the bench's deadline by one unit at 512 samples per rank; the bench rewrites
# its JSON after each unit, so a cut keeps them.
HSTU_BENCH = {
    "--world-sizes": [8],
    "--more-world-sizes": [16],
    "--width": 1024,
    "--sweep-widths": [],
    "--sweep-world-size": 8,
    "--layers": 8,
    "--samples-per-rank": 32,
    "--sweep-factors": [1, 4, 16],
    "--max-fixed-share": 0.1,
    "--max-length": 4096,
    "--alpha": 1.2,
    "--repeats": 3,
    "--deadline-s": 90,
    "--attention": "auto",  # on the jagged batch itself on CUDA (varlen_attn), not padded buckets
}
HSTU_STEP_S = 240
BALANCER_STEP_S = 600  # one command's limit: the balancer bench runs alone in its command's last minutes
HSTU_BENCH_SHORT = {
    "--world-sizes": [2],
    "--more-world-sizes": [4],
    "--width": 32,
    "--sweep-widths": [16, 32],
    "--sweep-world-size": 2,
    "--layers": 1,
    "--samples-per-rank": 4,
    "--sweep-factors": [1, 4, 16],
    "--max-fixed-share": 0.1,
    "--max-length": 64,
    "--alpha": 1.2,
    "--repeats": 1,
    "--deadline-s": 60,
    "--attention": "auto",  # bucketed on a CPU
}
# The same flags at tiny sizes (`--short-bench`, the kit's CPU test).
BALANCER_BENCH_SHORT = {
    "--samples": [64],
    "--parts": [4],
    "--budget": 0.02,
    "--world-size": [2],
    "--steps": 3,
    "--repeats": 1,
    "--exchange-world-size": [2],
    "--measured-world-size": [2, 4],
    "--measured-batch-size": 4,
    "--measured-max-length": 32,
    "--measured-width": 8,
    "--measured-repeats": 1,
    "--cap-world-size": 4,
    "--sweep-factors": [1, 4, 16],
    "--max-fixed-share": 0.1,
}
# `python -m embnb.bench routing` on the GPU (issue 70, item 5: notebook 01 at scale): one row-wise table
# of 20 M rows x 128 fp32 (9.5 GiB; 1.19 GiB per rank at W = 8), the frequency (Zipf 1.05), strided
# (stride 8) and hashed streams under continuous, roundrobin and feistel_roundrobin; per case the
# busiest rank's acceptance check at 2,048, 8,192 and 32,768 bags of 16 ids per rank (fixed share of
# its lookups at most 20%), then every rank at the chosen batch in 3 interleaved rounds: does the
# busiest rank's time follow its ids, its distinct rows, or neither? GPU time: at about 5.5 ns per id
# plus 0.45 ms per TBE call (the committed H200 steptime runs), the kernels of all 9 cases take a few
# seconds (the largest call: the frequency stream's rank 0 under continuous, 3.9 M ids, about 20 ms);
# the step is host-bound: each case draws 4.6 M ids over its three batches, lays them out and selects
# each rank's (15-25 s a case on the 2-core CPU machine, estimated 5-8 s on the GPU host's 16 cores),
# about 1-1.5 minutes in all; the bench starts no case after 150 s and writes its JSON after each, the
# step is cut at 240 s. Memory: the 8 ranks' TBEs at once (9.5 GiB) with their inputs and pooled
# gradients at 32,768 bags per rank (128 MiB each), under 12 GiB.
ROUTING_BENCH = {
    "--rows": 20_000_000,
    "--dim": 128,
    "--world-size": 8,
    "--zipf-alpha": 1.05,
    "--stride": 8,
    "--bag-size": 16,
    "--batch-size": 2048,
    "--sweep-factors": [1, 4, 16],
    "--max-fixed-share": 0.2,
    "--repeats": 3,
    "--deadline-s": 150,
}
ROUTING_STEP_S = 240
# The same flags at tiny sizes (about 10 s on the 2-core CPU machine).
ROUTING_BENCH_SHORT = {
    **ROUTING_BENCH,
    "--rows": 4096,
    "--dim": 16,
    "--world-size": 4,
    "--bag-size": 8,
    "--batch-size": 16,
    "--repeats": 1,
    "--deadline-s": 60,
}


# A GPU window, in the order of issue 70's plan (docs/testing.md, "The next GPU window"): the cheap
# checks never rerun on a GPU since their fixes (the CUDA tests, among them a CUDA op's error on bad
# data; the calibrate step's KeyError), then notebook 03's plans (steptime, uncapped and in the UVM
# regime), then the balancing benches (notebook 04's question: HSTU, then the balancer), then the
# notebooks and the rest. A lease is 15 minutes and one command at most 10, so a window is two or
# three commands within 30 s of each other (the machine and FBGEMM's unpacked store stay), each
# naming its groups (`--only cheap plans`, then `--only balancing`); every group carries the FBGEMM
# step and the build (the native library is built afresh by each command).
GROUPS = {
    "cheap": ["fbgemm-cuda", "build", "cuda-tests-*", "bench-calibrate"],
    "plans": ["fbgemm-cuda", "build", "bench-steptime*"],
    "balancing": ["fbgemm-cuda", "build", "bench-hstu", "bench-balancer"],
    "routing": ["fbgemm-cuda", "build", "bench-routing"],
    "notebooks": ["fbgemm-cuda", "build", "notebook-*", "bench-bucketize", "tests"],
}
GROUP_ORDER = list(GROUPS)  # the planned order of a window


def expand_groups(only: list[str] | None) -> list[str] | None:
    """`--only`'s step names and patterns, with GROUPS' names replaced by their steps."""
    if only is None:
        return None
    return list(dict.fromkeys(step for name in only for step in GROUPS.get(name, [name])))


def bench_flags(options: dict[str, object]) -> list[str]:
    """A bench's command-line flags from {flag: value or list of values}."""
    flags = []
    for flag, value in options.items():
        flags += [flag, *(str(v) for v in (value if isinstance(value, list) else [value]))]
    return flags


# The tests that exercise CUDA (parity of the native kernels, native KK,
# the launcher on GPU backends); CPU-only suites are `make test`'s job.
KIT_TESTS = [
    "tests/cuda/test_native.py",
    "tests/cuda/test_hstu.py",
    "tests/balancing/test_partition.py",
    "tests/test_dist.py",
    "tests/steptime/test_tbe_cuda.py",
    "tests/balancing/test_shuffle_cuda.py",
    "tests/rowwise/test_sharders_cuda.py",
]
# the benches the kit runs; their JSON files go to benchmarks/results
BENCHES = (
    "bucketize",
    "steptime",
    "steptime_capped",
    "steptime_scale",
    "calibrate",
    "hstu",
    "balancer",
    "routing",
)
REQUIRE_GPU = "EMBNB_REQUIRE_GPU"  # tests/conftest.py: a CUDA test that cannot run fails
# The build step: load (build) the library, say whether it has CUDA kernels,
# and fail where a GPU is visible but it has none.
BUILD_CHECK = """
import json, sys, torch
from embnb.cuda import loader
native = loader.load()
json.dump({"library": str(native.library), "cuda": bool(native.cuda)}, open(sys.argv[1], "w"))
print(native.library, "cuda" if native.cuda else "cpu only")
if torch.cuda.is_available() and not native.cuda:
    sys.exit("a GPU is visible but the library was built without CUDA kernels")
"""


def junit_counts(*junit_xmls: pathlib.Path) -> dict[str, int]:
    """run / passed / skipped / failed of pytest JUnit reports together (a missing one counts nothing)."""
    import xml.etree.ElementTree as ElementTree

    total = {"tests": 0, "skipped": 0, "failures": 0, "errors": 0}
    for junit_xml in junit_xmls:
        if not junit_xml.exists():
            continue
        for suite in ElementTree.parse(junit_xml).getroot().iter("testsuite"):
            for key in total:
                total[key] += int(suite.get(key, 0))
    failed = total["failures"] + total["errors"]
    run = total["tests"] - total["skipped"]
    return {"run": run, "passed": run - failed, "skipped": total["skipped"], "failed": failed}


def cuda_problems(gpu_visible: bool, build: dict, cuda_tests: dict[str, int]) -> list[str]:
    """Why a kit run on a GPU machine did not prove the CUDA paths; empty
    when it did, and always empty without a GPU (the CPU test of the kit)."""
    if not gpu_visible:
        return []
    problems = []
    if not build.get("cuda"):
        problems.append("the library has no CUDA kernels")
    if cuda_tests["run"] == 0:
        problems.append("no CUDA test ran")
    if cuda_tests["skipped"]:
        problems.append(f"{cuda_tests['skipped']} CUDA tests were skipped")
    if cuda_tests["failed"]:
        problems.append(f"{cuda_tests['failed']} CUDA tests failed")
    return problems


def kit_pins() -> list[str]:
    """`name==version` of every wheel the GPU machine lacks (scripts/gpu_kit.txt)."""
    lines = KIT_REQUIREMENTS.read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def kit_size(kit: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in kit.glob("*.whl"))


def cp312_download(dest: pathlib.Path) -> list[str]:
    """`pip download`'s command (a pin to append) for the GPU machine's
    wheels: cp312 manylinux x86-64 or pure Python, no dependencies, into `dest`."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
    command += [
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--dest",
        str(dest),
    ]
    command += [x for abi in ("cp312", "abi3", "none") for x in ("--abi", abi)]
    return command + [x for tag in PLATFORMS for x in ("--platform", tag)]


def gather(kit: pathlib.Path) -> int:
    """Download cp312 manylinux x86-64 wheels of every kit pin (never torch)."""
    pins = kit_pins()
    if any(pin.split("==")[0].lower() == "torch" for pin in pins):
        raise SystemExit("gpu kit: torch must not be in scripts/gpu_kit.txt (the GPU machine has its own)")
    kit.mkdir(parents=True, exist_ok=True)
    for old in kit.glob("*.whl"):
        old.unlink()
    download = cp312_download(kit)
    for pin in pins:
        if subprocess.run([*download, pin], capture_output=True).returncode == 0:
            continue
        # Some pure-Python packages publish only an sdist (iopath): build
        # their wheel here; it is py3-none-any, so it installs there too.
        wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps"]
        built = subprocess.run([*wheel, "--wheel-dir", str(kit), pin], capture_output=True, text=True)
        if built.returncode != 0:
            raise SystemExit(
                f"gpu kit: no cp312 x86-64 wheel of {pin}, and building one failed:\n{built.stderr}"
            )
        stem = pin.split("==")[0].replace("-", "_")
        if not any(w.name.endswith("-none-any.whl") for w in kit.glob(f"{stem}-*.whl")):
            raise SystemExit(f"gpu kit: {pin} built a platform wheel here; it would not install there")
    return check_size(kit)


def check_size(kit: pathlib.Path) -> int:
    """0 if the kit's wheels fit in MAX_KIT_BYTES, else 1 (with the largest named)."""
    size = kit_size(kit)
    wheels = sorted(kit.glob("*.whl"), key=lambda p: -p.stat().st_size)
    print(f"gpu kit: {len(wheels)} wheels, {size / 2**20:.1f} MiB in {kit}")
    if size <= MAX_KIT_BYTES:
        return 0
    largest = ", ".join(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in wheels[:5])
    limit = MAX_KIT_BYTES >> 20
    print(
        f"gpu kit: {size / 2**20:.1f} MiB is over the {limit} MiB limit; largest: {largest}", file=sys.stderr
    )
    return 1


class Steps:
    """Runs the kit's steps, each recorded with its outcome and time."""

    def __init__(
        self,
        out: pathlib.Path,
        env: dict[str, str],
        deadline_s: float | None = None,
        only: list[str] | None = None,
    ):
        self.out, self.env, self.records, self.only = out, env, [], expand_groups(only)
        # A lent GPU is held for minutes: past the deadline a step is skipped
        # (recorded, so the run fails) and kit.json is still written.
        self.deadline = None if deadline_s is None else time.perf_counter() + deadline_s

    def run(
        self, name: str, command: list[str], timeout_s: int = 1800, ok_codes: tuple[int, ...] = (0,)
    ) -> bool:
        if self.only is not None and not any(fnmatch.fnmatch(name, pattern) for pattern in self.only):
            return True  # a rerun of named steps (`--only`): the others are not run nor recorded
        start = time.perf_counter()
        if self.deadline is not None:
            timeout_s = min(timeout_s, self.deadline - start)
        log = self.out / f"{name}.log"
        with log.open("w") as sink:
            try:
                if timeout_s < 1:
                    raise subprocess.TimeoutExpired(command, 0)
                done = subprocess.run(
                    command, cwd=ROOT, env=self.env, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s
                )
                code = done.returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        seconds = time.perf_counter() - start
        ok = code in ok_codes
        self.records.append(
            {
                "step": name,
                "command": command,
                "returncode": code,
                "ok": ok,
                "seconds": seconds,
                "log": log.name,
            }
        )
        # kit.json is written at the end: this record survives a command killed before it
        (self.out / "steps.json").write_text(json.dumps(self.records, indent=2) + "\n")
        print(f"gpu kit: {name}: {'ok' if ok else f'FAILED ({code})'} in {seconds:.1f} s", flush=True)
        return ok


def install(kit: pathlib.Path, target: pathlib.Path, skip: tuple[str, ...] = ()) -> None:
    """The kit's wheels into `target`, but those whose names start with one of `skip`."""
    wheels = sorted(str(p) for p in kit.glob("*.whl") if not p.name.startswith(skip))
    if not wheels:
        raise SystemExit(
            f"gpu kit: no wheels in {kit}; run `python scripts/gpu_kit.py gather` where pip works"
        )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            *wheels,
        ],
        check=True,
    )


def environment(
    target: pathlib.Path, jupyter: pathlib.Path, fbgemm_site: str | None = None
) -> dict[str, str]:
    """The kit's environment: the wheels (and FBGEMM's CUDA package where it
    came) and the repository on the path, a `python3` kernel for papermill
    that is this Python."""
    env = dict(os.environ)
    paths = [str(ROOT), *([fbgemm_site] if fbgemm_site else []), str(target), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(paths).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(target / "bin"), env.get("PATH", "")])
    kernel = jupyter / "kernels" / "python3"
    kernel.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (embnb GPU kit)",
        "language": "python",
        "env": {"PYTHONPATH": env["PYTHONPATH"]},
    }
    (kernel / "kernel.json").write_text(json.dumps(spec))
    env["JUPYTER_PATH"] = str(jupyter)
    env["PYTHONHASHSEED"] = env.get("PYTHONHASHSEED", "0")
    return env


def gpu_arch_list() -> str | None:
    """TORCH_CUDA_ARCH_LIST of the local GPUs (e.g. "9.0"), or None."""
    import torch

    if not torch.cuda.is_available():
        return None
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{major}.{minor}" for major, minor in caps)


def run_benches_and_notebooks(steps: Steps, device: str, out: pathlib.Path, short_bench: bool) -> None:
    """The benches in the window's planned order (GROUPS): the calibration (a cheap check), notebook
    03's plans (steptime, then at a capped HBM), the balancing benches (HSTU, then the balancer); then
    every notebook with NOTEBOOK_PARAMETERS and the bucketize bench, on `device`. Each step has its own
    limit and writes its own files, so a failed or cut step loses no other step's results."""
    python = sys.executable
    calibrate = [python, "-m", "embnb.bench", "calibrate", "--device", device, "--out", str(out)]
    steps.run(
        "bench-calibrate",
        calibrate + bench_flags(CALIBRATE_BENCH_SHORT if short_bench else CALIBRATE_BENCH),
        timeout_s=CALIBRATE_STEP_S,
    )
    # Each rank's step with FBGEMM's TBEs, notebook 03's plans: first at production scale, from plans
    # made beforehand (steptime_scale-*.json), then planned there at the committed runs' sizes.
    steptime = [python, "-m", "embnb.bench", "steptime", "--device", device, "--out", str(out)]
    scale = STEPTIME_SCALE_BENCH_SHORT if short_bench else STEPTIME_SCALE_BENCH
    steps.run("bench-steptime-scale", steptime + bench_flags(scale), STEPTIME_SCALE_STEP_S)
    steps.run(
        "bench-steptime", steptime + bench_flags(STEPTIME_BENCH_SHORT if short_bench else STEPTIME_BENCH)
    )
    # The same at a capped HBM (UVM caching on a GPU): steptime_capped-*.json.
    uvm_sizes = {**STEPTIME_BENCH_SHORT, "--hbm-gib": 1.0} if short_bench else STEPTIME_UVM_BENCH
    steps.run("bench-steptime-uvm", steptime + bench_flags(uvm_sizes))
    # The balancer at recsys-examples' shape, before the balancer bench (which a deadline cuts first).
    hstu = [python, "-m", "embnb.bench", "hstu", "--device", device, "--out", str(out)]
    steps.run("bench-hstu", hstu + bench_flags(HSTU_BENCH_SHORT if short_bench else HSTU_BENCH), HSTU_STEP_S)
    balancer = [python, "-m", "embnb.bench", "balancer", "--device", device, "--out", str(out)]
    sizes = BALANCER_BENCH_SHORT if short_bench else BALANCER_BENCH
    steps.run("bench-balancer", balancer + bench_flags(sizes), timeout_s=BALANCER_STEP_S)
    # Notebook 01's routings at scale (issue 70, item 5), after the balancing group.
    routing = [python, "-m", "embnb.bench", "routing", "--device", device, "--out", str(out)]
    sizes = ROUTING_BENCH_SHORT if short_bench else ROUTING_BENCH
    steps.run("bench-routing", routing + bench_flags(sizes), timeout_s=ROUTING_STEP_S)
    for name, parameters in NOTEBOOK_PARAMETERS.items():
        pairs = [x for k, v in {**parameters, "device": device}.items() for x in ("-p", k, json.dumps(v))]
        notebook = f"notebooks/{name}.ipynb"
        steps.run(
            f"notebook-{name}",
            [python, "-m", "embnb.harness", "run", notebook, "--out", str(out / "notebooks"), *pairs],
        )
    bench = [python, "-m", "embnb.bench", "bucketize", "--device", device, "--out", str(out)]
    steps.run(
        "bench-bucketize",
        bench
        + (
            ["--sizes", "1e5", "--world-sizes", "8", "--repeats", "3"]
            if short_bench
            else ["--dist-types", "continuous,roundrobin,hash_roundrobin"]
        ),
    )


FBGEMM_PROBE = """
import json, fbgemm_gpu, torch
from embnb.steptime.kernels import fbgemm_cuda_available
print(json.dumps({"path": fbgemm_gpu.__file__, "cuda_kernels": fbgemm_cuda_available()}))
"""


def fbgemm_build(env: dict[str, str]) -> dict | None:
    """Which fbgemm_gpu the kit ran with, and whether its CUDA kernels ran here."""
    probe = subprocess.run([sys.executable, "-c", FBGEMM_PROBE], env=env, capture_output=True, text=True)
    lines = probe.stdout.strip().splitlines()
    return json.loads(lines[-1]) if probe.returncode == 0 and lines else {"error": probe.stderr[-500:]}


def summarize(steps: Steps, device: str, out: pathlib.Path, short_bench: bool) -> int:
    """Write OUT/kit.json, print the outcome; 0 if every step passed and,
    where a GPU is visible, CUDA was proven (`cuda_problems`)."""
    import torch

    gpu_visible = device == "cuda"
    build = json.loads((out / "build.json").read_text()) if (out / "build.json").exists() else {}
    cuda_tests = junit_counts(*sorted(out.glob("cuda-tests-*.xml")))
    problems = cuda_problems(gpu_visible, build, cuda_tests)
    summary = {
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if gpu_visible else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "short_bench": short_bench,
        "cuda_kernels": build.get("cuda"),
        "fbgemm": fbgemm_build(steps.env),
        "cuda_tests": cuda_tests,
        "other_tests": junit_counts(out / "tests.xml"),
        "notebook_device": device,
        "bench_results": sorted(p.name for p in out.glob("*.json") if p.name.split("-")[0] in BENCHES),
        "cuda_problems": problems,
        "steps": steps.records,
    }
    (out / "kit.json").write_text(json.dumps(summary, indent=2) + "\n")
    failed = [r["step"] for r in steps.records if not r["ok"]]
    print(
        f"gpu kit: {len(steps.records) - len(failed)} of {len(steps.records)} steps passed; "
        f"results in {out}" + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    for problem in problems:
        print(f"gpu kit: CUDA not proven: {problem}", file=sys.stderr)
    return 1 if failed or problems else 0


def run(
    kit: pathlib.Path,
    out: pathlib.Path,
    short_bench: bool,
    deadline_s: float | None = None,
    only: list[str] | None = None,
    fbgemm_parts: pathlib.Path | None = None,
    fbgemm_store: pathlib.Path = DEFAULT_FBGEMM_STORE,
) -> int:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = pathlib.Path(tempfile.mkdtemp(prefix="embnb-gpu-kit-"))
    try:
        steps = Steps(out, dict(os.environ), deadline_s, only)
        python = sys.executable
        fbgemm_site = None
        if fbgemm_parts is not None:  # FBGEMM's CUDA build in place of the kit's fbgemm-gpu-cpu
            receive = [
                python,
                str(ROOT / "scripts" / "fbgemm_cuda.py"),
                "receive",
                "--parts",
                str(fbgemm_parts),
            ]
            steps.run("fbgemm-cuda", [*receive, "--store", str(fbgemm_store)])
            complete = fbgemm_store / "site" / ".complete"
            fbgemm_site = str(complete.parent) if complete.exists() else None
        install(kit, work / "site", skip=("fbgemm_gpu_cpu-",) if fbgemm_site else ())
        env = environment(work / "site", work / "jupyter", fbgemm_site)
        arch = gpu_arch_list()
        if arch:
            env["TORCH_CUDA_ARCH_LIST"] = arch
        env["EMBNB_EXT_DIR"] = str(work / "ext")  # a fresh build for this machine
        steps.env = env
        if device == "cuda":
            env[REQUIRE_GPU] = "1"
        steps.run("build", [python, "-c", BUILD_CHECK, str(out / "build.json")])
        pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        for test_file in KIT_TESTS:  # a process each: a crash in one file loses no other file's results
            stem = pathlib.Path(test_file).stem
            junit = f"--junitxml={out / f'cuda-tests-{stem}.xml'}"
            # pytest exits 5 where a file has no CUDA test: nothing was selected, nothing failed
            steps.run(f"cuda-tests-{stem}", [*pytest, "-m", "cuda", junit, test_file], ok_codes=(0, 5))
        run_benches_and_notebooks(steps, device, out, short_bench)
        # CPU-only (CI runs them too): last, so a deadline cuts them first.
        steps.run("tests", [*pytest, "-m", "not cuda", f"--junitxml={out / 'tests.xml'}", *KIT_TESTS])
        return summarize(steps, device, out, short_bench)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/gpu_kit.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gather_cmd = sub.add_parser("gather", help="download the kit's wheels (needs a package registry)")
    gather_cmd.add_argument("--kit", type=pathlib.Path, default=DEFAULT_KIT)
    run_cmd = sub.add_parser("run", help="install the kit and run every CUDA path (on the GPU machine)")
    run_cmd.add_argument("--kit", type=pathlib.Path, default=DEFAULT_KIT)
    run_cmd.add_argument("--out", type=pathlib.Path, required=True, help="results folder")
    run_cmd.add_argument(
        "--short-bench",
        action="store_true",
        help="the benches at tiny sizes (the kit's CPU test): bucketize at one size, the *_SHORT sizes",
    )
    run_cmd.add_argument(
        "--deadline-s",
        type=float,
        help="seconds from the first step after which every step still to run is cut (recorded as a timeout)",
    )
    run_cmd.add_argument(
        "--only",
        nargs="+",
        metavar="STEP",
        help="run only these steps (names as in kit.json, shell-style patterns, or a group: "
        + ", ".join(f"{k} = {' '.join(v)}" for k, v in GROUPS.items())
        + ")",
    )
    run_cmd.add_argument(
        "--fbgemm-cuda",
        type=pathlib.Path,
        metavar="PARTS",
        help="the parts of FBGEMM's CUDA build (scripts/fbgemm_cuda.py pack), used instead of fbgemm-gpu-cpu",
    )
    run_cmd.add_argument("--fbgemm-store", type=pathlib.Path, default=DEFAULT_FBGEMM_STORE)
    args = parser.parse_args(argv)
    if args.command == "gather":
        return gather(args.kit)
    return run(
        args.kit, args.out, args.short_bench, args.deadline_s, args.only, args.fbgemm_cuda, args.fbgemm_store
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the benchmarks share: their result files, the --out option, quiet
torchrec logs and how a spread prints; timing itself lives in embnb.timing."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import pathlib
import platform
import statistics
import subprocess
from importlib import metadata
from typing import Any

from embnb.timing import machine_name

# Relative: under the current directory, so an installed wheel writes where it runs.
RESULTS_DIR = pathlib.Path("benchmarks") / "results"


def stack_versions() -> dict[str, str | None]:
    """Python, torch, fbgemm (CPU or CUDA build) and torchrec versions here; None where absent."""

    def version(*names: str) -> str | None:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "fbgemm_gpu": version("fbgemm-gpu-cpu", "fbgemm-gpu"),
        "torchrec": version("torchrec"),
    }


def source_commit() -> str | None:
    """The git commit of the embnb source that runs (suffixed `-dirty` with uncommitted changes);
    None outside a git checkout (an installed wheel)."""
    source = pathlib.Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=source, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def write_results(name: str, payload: dict[str, Any], out_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Write `payload` (plus date, machine, the stack's versions and the source commit) to
    RESULTS_DIR/NAME-DATE-MACHINE.json."""
    out_dir = pathlib.Path(out_dir or RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    machine = payload.setdefault("machine", machine_name())
    payload.setdefault("date", stamp)
    payload.setdefault("stack", stack_versions())
    payload.setdefault("commit", source_commit())
    slug = "".join(c if c.isalnum() else "-" for c in machine.lower()).strip("-")
    path = out_dir / f"{name}-{stamp}-{slug}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def spread(runs: list[float], digits: int) -> str:
    """The median of `runs` and their range, in seconds."""
    median = statistics.median(runs)
    return f"{median:.{digits}f} s ({min(runs):.{digits}f}-{max(runs):.{digits}f}, {len(runs)} runs)"


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """--out: where write_results puts the JSON."""
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help="results folder (default: ./benchmarks/results under the current directory)",
    )


def quiet_torchrec_logs() -> None:
    """Errors only: torchrec's planner logs every proposal and warns for each
    data-parallel table; torch.fx's deprecation log, here and on the ranks a
    bench launches (every KeyedJaggedTensor triggers it)."""
    from embnb.lab.logs import quiet_torch_fx

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    quiet_torch_fx()


def tbe_device(device: str) -> str:
    """`--device` of a bench that runs FBGEMM's TBEs, resolved ("auto": cuda where a GPU is); a
    ValueError says why it cannot run there (no GPU, or an fbgemm_gpu without CUDA kernels)."""
    from embnb.devices import resolve_device
    from embnb.steptime.kernels import fbgemm_cuda_available

    resolved = resolve_device(device)
    if resolved == "cuda" and not fbgemm_cuda_available():
        raise ValueError(
            "device 'cuda': this fbgemm_gpu has no CUDA kernels (the fbgemm-gpu-cpu build); "
            "the TBEs need the fbgemm-gpu CUDA wheel"
        )
    return resolved

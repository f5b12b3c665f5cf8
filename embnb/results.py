"""The benches' results files, written and read in one place.

`python -m embnb.bench NAME` writes NAME-DATE-MACHINE.json (`write_results`)
with the date, the machine, the stack it ran on (Python, torch, fbgemm,
torchrec) and the source commit; the notebooks, the GPU kit and
scripts/performance_page.py read them back with `load_runs`. Plain JSON in,
plain dicts out: nothing here imports torch, pandas or torchrec.

    runs = load_runs("calibrate")           # the committed ones, oldest first
    newest = runs[-1].data["heldout"]
"""

from __future__ import annotations

import datetime
import json
import pathlib
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from embnb.timing import machine_name

__all__ = [
    "COMMITTED_RESULTS",
    "RESULTS_DIR",
    "Run",
    "load_runs",
    "source_commit",
    "stack_versions",
    "write_results",
]

# Where a bench writes: relative, under the current directory, so an installed wheel writes where it runs.
RESULTS_DIR = pathlib.Path("benchmarks") / "results"
# The committed results of this checkout, which the notebooks read back (there are none outside a checkout).
COMMITTED_RESULTS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "results"


@dataclass(frozen=True)
class Run:
    """One results file: its path, the benchmark that wrote it, its date
    (YYYY-MM-DD, UTC), its machine (`embnb.timing.machine_name`, e.g.
    "NVIDIA H200" or "x86_64 x2 cores") and its whole payload."""

    path: pathlib.Path
    benchmark: str
    date: str
    machine: str
    data: dict[str, Any]

    @property
    def name(self) -> str:
        """The file's name, e.g. calibrate-2026-11-29-x86-64-x2-cores.json."""
        return self.path.name


def load_runs(benchmark: str | None = None, results_dir: str | pathlib.Path | None = None) -> list[Run]:
    """Every results file of `benchmark` (None: of every bench) in `results_dir`
    (default: the committed ones, COMMITTED_RESULTS), oldest first (by date, then
    file name). A file's benchmark is its "benchmark" key, else its name's first
    part. Raises ValueError naming a file that lacks "date" or "machine", and
    FileNotFoundError for a `results_dir` that does not exist."""
    folder = pathlib.Path(COMMITTED_RESULTS if results_dir is None else results_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"results_dir {str(folder)!r} is not a folder of results files")
    runs = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if "date" not in data or "machine" not in data:
            raise ValueError(
                f"{path.name}: a results file needs 'date' and 'machine', got keys {sorted(data)}"
            )
        name = data.get("benchmark") or path.name.split("-")[0]
        if benchmark is None or name == benchmark:
            runs.append(Run(path, name, data["date"], data["machine"], data))
    return sorted(runs, key=lambda run: (run.date, run.name))


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


def write_results(
    name: str, payload: dict[str, Any], out_dir: str | pathlib.Path | None = None
) -> pathlib.Path:
    """Write `payload` (plus date, machine, the stack's versions and the source commit, where it
    does not set them) to OUT_DIR/NAME-DATE-MACHINE.json (default OUT_DIR: RESULTS_DIR) and return
    the path; `load_runs` reads it back."""
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

"""embnb as a user installs it: the wheel, in a fresh virtual environment
holding only what its core and `planner` extra declare, runs docs/planner.md's
DynamicProgrammingProposer example. Every declared requirement is installed
at the version this environment has (the wheels are in pip's cache or the
local index), and that version must satisfy the declared range."""

import contextlib
import email
import fcntl
import hashlib
import importlib.metadata as metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement
from readme_blocks import planner_example

REPO = pathlib.Path(__file__).resolve().parent.parent
CACHE = pathlib.Path.home() / ".cache" / "embnb"
NOTEBOOK_PACKAGES = {"pandas", "matplotlib", "ipywidgets"}  # embnb.lab's, never the library's
FBGEMM_BUILDS = ("fbgemm-gpu", "fbgemm-gpu-cpu")  # torchrec asks for the first; either provides fbgemm_gpu


def run(*command, cwd=None, timeout=600) -> str:
    # only what is installed; bytecode is written (where the environment turned it off), so a
    # later run imports torch and torchrec from the reused venv's caches rather than their sources
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def declared(wheel: pathlib.Path, extra: str) -> list[Requirement]:
    """The wheel's requirements for its core and `extra`."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.message_from_string(archive.read(name).decode())
    requirements = [Requirement(r) for r in message.get_all("Requires-Dist")]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": extra})]


def pinned_here(requirement: Requirement) -> str:
    version = metadata.version(requirement.name)
    assert requirement.specifier.contains(version, prereleases=True), (str(requirement), version)
    return f"{requirement.name}=={version}"


def installed_fbgemm() -> str:
    for name in FBGEMM_BUILDS:
        try:
            return f"{name}=={metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    pytest.fail("no fbgemm build installed here")


@pytest.mark.skipif(
    "+cpu" not in metadata.version("torch"),
    reason="needs a CPU torch here (the pinned stack): a CUDA torch's nvidia wheels are gigabytes",
)
def test_the_wheel_alone_runs_the_docs_planner_example(tmp_path):
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path, REPO)
    (wheel,) = tmp_path.glob("embnb-*.whl")
    requirements = declared(wheel, "planner")
    names = {r.name for r in requirements}
    assert {"torch", "torchrec"} <= names and not names & NOTEBOOK_PACKAGES, names
    torchrec = next(r for r in requirements if r.name == "torchrec")
    # torchrec's own requirements, with the fbgemm build installed here for its fbgemm-gpu
    torchrec_needs = [Requirement(r) for r in metadata.requires("torchrec")]
    torchrec_needs = [r for r in torchrec_needs if r.marker is None and r.name not in FBGEMM_BUILDS]

    others = [pinned_here(r) for r in [*requirements, *torchrec_needs] if r.name != "torchrec"]
    needs = sorted([*others, installed_fbgemm(), pinned_here(torchrec)])
    with dependencies_venv(needs) as venv:  # the declared requirements, installed once per set
        python = venv / "bin" / "python"
        # the wheel over whatever embnb an earlier run left; nothing else is installed here
        run(
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "--disable-pip-version-check",
            "--no-deps",
            "--force-reinstall",
            wheel,
        )
        run_the_example(python, venv, tmp_path)


@contextlib.contextmanager
def dependencies_venv(needs: list[str]):
    """A virtual environment holding exactly `needs` (name==version), kept under ~/.cache/embnb
    and reused while the set is the same: installing torch is most of this test's minute. Locked,
    so two runs of the suite share it one after the other."""
    key = hashlib.sha256("\n".join([sys.version, *needs]).encode()).hexdigest()[:16]
    venv = CACHE / f"wheel-test-venv-{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"wheel-test-venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            run(sys.executable, "-m", "venv", venv)
            python = venv / "bin" / "python"
            # --no-compile: byte-compiling torch's thousands of modules is most of an install
            pip = [python, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
            run(*pip, *[n for n in needs if not n.startswith("torchrec==")])
            run(*pip, "--no-deps", *[n for n in needs if n.startswith("torchrec==")])
            (venv / ".complete").write_text("\n".join(needs) + "\n")
        # what the venv holds is the set asked for, nothing more (an earlier run's embnb aside)
        held = run(venv / "bin" / "python", "-m", "pip", "list", "--format=freeze", "--exclude", "embnb")
        assert holds_only(held, needs), held
        yield venv


def holds_only(freeze: str, needs: list[str]) -> bool:
    """pip's freeze output names every one of `needs` and none of the notebooks' packages."""
    installed = {line.split("==")[0].lower().replace("_", "-") for line in freeze.split() if "==" in line}
    wanted = {n.split("==")[0].lower().replace("_", "-") for n in needs}
    return wanted <= installed and not installed & NOTEBOOK_PACKAGES


def run_the_example(python: pathlib.Path, venv: pathlib.Path, tmp_path: pathlib.Path) -> None:
    script = tmp_path / "planner_example.py"
    script.write_text(planner_example())
    # the example as a script, in the process that says where its embnb comes from
    where, out = run(
        python,
        "-c",
        "import embnb, runpy; print(embnb.__file__); runpy.run_path('planner_example.py', "
        "run_name='__main__')",
        cwd=tmp_path,
    ).split("\n", 1)
    assert where.startswith(str(venv)), where
    assert re.search(r"^300 tables planned in [\d.]+ s; rating [\d.]+ ms$", out, flags=re.M), out

"""embnb as a user installs it: the wheel, in a fresh virtual environment
holding only what its core and `planner` extra declare, runs docs/planner.md's
DynamicProgrammingProposer example. Every declared requirement is installed
at the version this environment has (the wheels are in pip's cache or the
local index), and that version must satisfy the declared range."""

import email
import importlib.metadata as metadata
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement
from readme_blocks import planner_example

REPO = pathlib.Path(__file__).resolve().parent.parent
FBGEMM_BUILDS = ("fbgemm-gpu", "fbgemm-gpu-cpu")  # torchrec asks for the first; either provides fbgemm_gpu


def run(*command, cwd=None, timeout=600) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what is installed
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
    assert {"torch", "torchrec"} <= names and not names & {"pandas", "matplotlib", "ipywidgets"}, names
    torchrec = next(r for r in requirements if r.name == "torchrec")
    # torchrec's own requirements, with the fbgemm build installed here for its fbgemm-gpu
    torchrec_needs = [Requirement(r) for r in metadata.requires("torchrec")]
    torchrec_needs = [r for r in torchrec_needs if r.marker is None and r.name not in FBGEMM_BUILDS]

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    # --no-compile: byte-compiling torch's thousands of modules is most of an install
    pip = [python, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
    others = [pinned_here(r) for r in [*requirements, *torchrec_needs] if r.name != "torchrec"]
    run(*pip, *others, installed_fbgemm())
    run(*pip, "--no-deps", pinned_here(torchrec), wheel)

    script = tmp_path / "planner_example.py"
    script.write_text(planner_example())
    where = run(python, "-c", "import embnb; print(embnb.__file__)", cwd=tmp_path)
    assert where.startswith(str(venv)), where
    out = run(python, script, cwd=tmp_path)
    assert re.search(r"^300 tables planned in [\d.]+ s; rating [\d.]+ ms$", out, flags=re.M), out

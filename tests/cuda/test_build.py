"""No build inside plan(): the planner loads the native extension only where
`python -m embnb.cuda build` built it, and otherwise warns once, naming the
command, and plans with its Python versions (the same plan). The build
command says what is missing when the host has no compiler, and processes
building at once share one build under a file lock."""

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

from embnb.cuda import __main__ as build_command
from embnb.cuda import loader
from embnb.planner import create_planner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PLAN = """
import json, warnings
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from embnb.cuda import loader
from embnb.planner import create_planner
tables = [
    EmbeddingBagConfig(
        name=f"t{i}", feature_names=[f"f{i}"], num_embeddings=10 ** (2 + i % 3), embedding_dim=8
    )
    for i in range(6)
]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    planner = create_planner("cpu", 8, world_size=2, progress=False)
    plan = planner.plan(EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
                        [EmbeddingBagCollectionSharder()])
print(json.dumps(dict(
    warnings=[str(w.message) for w in caught if str(w.message).startswith("embnb")],
    rating=planner.rating,
    plan=sorted([name, s.sharding_type, s.ranks] for name, s in plan.plan[""].items()),
    loaded=loader._loaded is not None,
)))
"""


def _tables():
    return [
        EmbeddingBagConfig(
            name=f"t{i}", feature_names=[f"f{i}"], num_embeddings=10 ** (2 + i % 3), embedding_dim=8
        )
        for i in range(6)
    ]


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_plan_compiles_nothing_says_how_to_build_once_and_plans_the_same(tmp_path):
    native = loader.load()  # built by `make setup` (or here, once)
    empty = tmp_path / "ext"
    done = _python(PLAN, EMBNB_EXT_DIR=str(empty), CXX="/nonexistent/c++")
    assert done.returncode == 0, done.stderr
    assert "compiling" not in done.stderr
    assert not empty.exists() or not list(empty.rglob("*.so")), "plan() built the extension"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["loaded"] is False
    assert len(report["warnings"]) == 1, report["warnings"]
    assert "python -m embnb.cuda build" in report["warnings"][0]
    assert "is not built" in report["warnings"][0]
    # the same plan, planned here with the native library loaded
    planner = create_planner("cpu", 8, world_size=2, progress=False)
    module = EmbeddingBagCollection(tables=_tables(), device=torch.device("meta"))
    plan = planner.plan(module, [EmbeddingBagCollectionSharder()])
    assert loader._loaded == native
    assert report["plan"] == sorted([name, s.sharding_type, s.ranks] for name, s in plan.plan[""].items())
    assert report["rating"] == pytest.approx(planner.rating, rel=1e-9)


def test_the_build_command_loads_the_build_and_rejects_other_commands(capsys):
    assert build_command.main(["build"]) == 0
    assert str(loader.load().library) in capsys.readouterr().out
    assert build_command.main(["bild"]) == 2
    assert "usage: python -m embnb.cuda build (got bild)" in capsys.readouterr().err
    assert build_command.main([]) == 2
    assert "(got no command)" in capsys.readouterr().err


def test_a_missing_compiler_is_a_clear_message_and_builds_nothing(tmp_path):
    empty = tmp_path / "ext"
    done = subprocess.run(
        [sys.executable, "-m", "embnb.cuda", "build"],
        cwd=REPO,
        env={**os.environ, "EMBNB_EXT_DIR": str(empty), "CXX": "/nonexistent/g++"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "no C++ compiler: CXX=/nonexistent/g++ is not found on PATH" in done.stderr
    assert "apt-get install g++" in done.stderr and "python -m embnb.cuda build" in done.stderr
    assert "compiling" not in done.stderr
    assert not empty.exists() or not list(empty.rglob("*.so"))


def test_a_process_waits_for_the_one_building_then_loads_its_library():
    native = loader.load()
    with loader.build_lock(native.library.parent, exclusive=True):  # as a rank that is building
        job = subprocess.Popen(
            [sys.executable, "-m", "embnb.cuda", "build"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = []
        for line in job.stderr:  # ends at EOF should it exit without waiting
            lines.append(line)
            if "waiting for another process building" in line:
                break
        assert any(str(native.library.parent) in line for line in lines), lines
        assert job.poll() is None  # it cannot take the lock we hold
    rest = []
    reader = threading.Thread(target=lambda: rest.append(job.stderr.read()))
    reader.start()
    out = job.stdout.read()
    assert job.wait(timeout=300) == 0, "".join(lines) + "".join(rest)
    reader.join()
    assert "native extension ready" in out and str(native.library) in out
    assert "compiling" not in "".join(rest)  # it loaded what was built


def test_processes_loading_a_built_library_do_not_wait_on_each_other():
    """A built library is loaded under the shared lock: ranks starting together each load it at
    once (under the exclusive lock they queued, each printing that it waited for a build)."""
    native = loader.load()
    with loader.build_lock(native.library.parent, exclusive=False):  # as a rank that is loading
        done = subprocess.run(
            [sys.executable, "-m", "embnb.cuda", "build"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,  # under the old exclusive lock it waited for us: a TimeoutExpired
        )
    assert done.returncode == 0, done.stderr
    assert "native extension ready" in done.stdout
    assert "waiting for another process" not in done.stderr

"""The library a torchrec user imports: each subpackage's `__init__` lists the
names a user imports (one export policy), importing them loads nothing of
the notebook layer (pandas, matplotlib, ipywidgets, `embnb.lab`, the
planner's studies), and no library module imports `embnb.lab`."""

import ast
import importlib
import json
import pathlib
import pkgutil
import subprocess
import sys

import pytest

import embnb
import embnb.lab

PACKAGE = pathlib.Path(embnb.__file__).parent
LIBRARY = ("rowwise", "columnwise", "planner", "balancing")
# What a notebook layer holds; none of it may sit in a library subpackage.
NOTEBOOK_ROLES = {
    "core",
    "explore",
    "figures",
    "experiment",
    "experiments",
    "study",
    "plots",
    "widgets",
    "cases",
    "comparison",
    "reference",
    "results",
    "brute_force",
    "ablation",
    "pitfall",
    "explain",
    "models",
}
# Besides the lab itself, only the bench CLI may import the lab.
MAY_IMPORT_LAB = ("lab", "bench")
HEAVY = ("pandas", "matplotlib", "ipywidgets", "seaborn", "IPython")

LIBRARY_IMPORTS = [
    "from embnb.planner import DynamicProgrammingProposer, create_planner",
    "from embnb.rowwise import bucketize, owner_rank",
    "from embnb.balancing import balance, BalancedShuffle",
    "from embnb.columnwise import cw_permute_indices, shard_cw",
]


def _notebook_layer(module: str) -> bool:
    return module == "embnb.lab" or module.startswith("embnb.lab.")


@pytest.mark.parametrize("subpackage", LIBRARY)
def test_each_init_lists_library_names_only(subpackage):
    package = importlib.import_module(f"embnb.{subpackage}")
    assert package.__all__ and len(package.__all__) == len(set(package.__all__))
    for name in package.__all__:
        home = getattr(package, name).__module__ if callable(getattr(package, name)) else None
        if home is not None:
            assert not _notebook_layer(home), f"{subpackage}.{name} comes from {home}"


@pytest.mark.parametrize("subpackage", LIBRARY)
def test_the_notebook_layer_lives_in_the_lab(subpackage):
    library = {info.name for info in pkgutil.iter_modules([str(PACKAGE / subpackage)])}
    lab = {info.name for info in pkgutil.iter_modules([str(PACKAGE / "lab" / subpackage)])}
    assert not library & NOTEBOOK_ROLES, sorted(library & NOTEBOOK_ROLES)
    assert lab & NOTEBOOK_ROLES and not library & lab, sorted(library & lab)
    for module in lab:  # importable by their own name
        importlib.import_module(f"embnb.lab.{subpackage}.{module}")


def _embnb_imports(path: pathlib.Path, root: pathlib.Path = PACKAGE.parent) -> set[str]:
    """Every embnb module a file under `root` names in an import, at any depth
    (function bodies too), relative imports resolved against its package."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in names if name == "embnb" or name.startswith("embnb.")}


def test_imports_are_read_from_source(tmp_path):
    """The oracle of the next test on cases written for it: it must see each form."""
    path = tmp_path / "embnb" / "lab" / "probe.py"
    path.parent.mkdir(parents=True)
    forms = ["import embnb.lab.rowwise", "from embnb import lab", "def f():", " from .balancing import plots"]
    path.write_text("\n".join(forms) + "\n")
    found = _embnb_imports(path, root=tmp_path)
    assert {"embnb.lab.rowwise", "embnb.lab", "embnb.lab.balancing.plots"} <= found


def test_no_library_module_imports_the_lab():
    importers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        top = path.relative_to(PACKAGE).parts[0]
        if top in MAY_IMPORT_LAB:
            continue
        lab = [n for n in _embnb_imports(path) if n == "embnb.lab" or n.startswith("embnb.lab.")]
        importers += [f"{path.relative_to(PACKAGE.parent)} imports {n}" for n in sorted(lab)]
    assert importers == []
    assert pathlib.Path(embnb.lab.__file__).parent == PACKAGE / "lab"  # the walk covered the lab's parent


# The library's dependencies, imported once in a parent that forks a child per
# statement: each child starts from them (a fresh interpreter would import
# torch and torchrec again, seconds each), and nothing of embnb is loaded yet.
DEPENDENCIES = "import torch, numpy, fbgemm_gpu, torchrec, torchrec.distributed.planner"
FORKED = """
import json, os, sys
for statement in STATEMENTS:
    pid = os.fork()
    if pid == 0:
        exec(statement)
        print(json.dumps(REPORT()), flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0, (statement, status)
"""


def _forked_reports(prelude: str, report: str, statements: list[str]) -> list:
    """`report()` (defined in `report`) after each statement, each run in a child
    forked from one process that ran `prelude`."""
    code = f"{prelude}\n{report}\nREPORT = report\nSTATEMENTS = {statements!r}\n{FORKED}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == len(statements), out.stdout
    return [json.loads(line) for line in lines]


LOADED = f"""
def report():
    return sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m.startswith('embnb.'))
"""


def test_library_imports_load_no_notebook_layer():
    # the last statement is the oracle seeing the notebook layer and a heavy module where they load
    statements = [*LIBRARY_IMPORTS, "import embnb.lab.plotting"]
    *reports, oracle = _forked_reports(f"import sys\n{DEPENDENCIES}", LOADED, statements)
    assert "embnb.lab" in oracle and "matplotlib" in oracle, oracle
    for statement, loaded in zip(LIBRARY_IMPORTS, reports, strict=True):
        heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
        notebook = [m for m in loaded if _notebook_layer(m)]
        assert not heavy and not notebook, (statement, heavy, notebook)
        assert any(m.startswith("embnb.") for m in loaded), statement  # the check saw the imports


# Every logger's settings, printed as JSON. The library's dependencies are
# imported before the first snapshot; a logger a third party creates later
# is its own (only those that existed before, and embnb's, are compared).
LOGGER_STATE = """
import json, logging
def state():
    loggers = {"": logging.getLogger(), **logging.root.manager.loggerDict}
    return {name: [lg.level, len(lg.handlers), lg.propagate, lg.disabled]
            for name, lg in loggers.items() if isinstance(lg, logging.Logger)}
"""


LOGGER_CHANGES = """
def report():
    after = state()
    return {n: s for n, s in after.items()
            if (n in before or n.startswith('embnb')) and before.get(n, [0, 0, True, False]) != s}
"""


def _logger_changes(*statements: str) -> list[dict]:
    return _forked_reports(
        f"{LOGGER_STATE}\n{DEPENDENCIES}\nbefore = state()", LOGGER_CHANGES, list(statements)
    )


def test_importing_embnb_changes_no_logger():
    library = [f"embnb.{name}" for name in LIBRARY]
    tops = [info.name for info in pkgutil.iter_modules(embnb.__path__, "embnb.") if not info.ispkg]
    statement = f"import embnb, {', '.join(library + tops)}"
    # the second statement is the check seeing a change where there is one
    changes, quieted = _logger_changes(
        statement, "from embnb.lab.logs import quiet_torch_fx; quiet_torch_fx()"
    )
    assert changes == {}
    assert list(quieted) == ["torch.fx._symbolic_trace"], quieted


def test_the_placement_maths_needs_no_torchrec():
    code = "import sys, embnb.columnwise.placement; print(any(m.startswith('torchrec') for m in sys.modules))"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )

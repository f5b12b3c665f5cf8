"""The library a torchrec user imports: each subpackage's `__init__` lists the
names a user imports (one export policy), and importing them loads nothing of
the notebook layer (pandas, matplotlib, ipywidgets, the studies)."""

import importlib
import json
import subprocess
import sys

import pytest

# The notebook layer: modules a notebook or the bench imports by their own name.
NOTEBOOK_LAYER = {
    "rowwise": {"aliasing", "kv_experiment", "kernel_timing", "plots", "widgets", "reference"},
    "columnwise": {"traffic", "cases", "experiment", "plots", "widgets"},
    "planner": {
        "models",
        "brute_force",
        "study",
        "pitfall",
        "ablation",
        "explain",
        "results",
        "plots",
        "widgets",
    },
    "balancing": {"experiment", "plots", "widgets", "reference"},
}
HEAVY = ("pandas", "matplotlib", "ipywidgets", "seaborn", "IPython")

LIBRARY_IMPORTS = [
    "from embnb.planner import DynamicProgrammingProposer, create_planner",
    "from embnb.rowwise import bucketize, owner_rank",
    "from embnb.balancing import balance, BalancedShuffle",
    "from embnb.columnwise import cw_permute_indices, shard_cw",
]


@pytest.mark.parametrize("subpackage", sorted(NOTEBOOK_LAYER))
def test_each_init_lists_library_names_only(subpackage):
    package = importlib.import_module(f"embnb.{subpackage}")
    assert package.__all__ and len(package.__all__) == len(set(package.__all__))
    for name in package.__all__:
        home = getattr(package, name).__module__ if callable(getattr(package, name)) else None
        if home is not None and home.startswith("embnb."):
            module = home.rsplit(".", 1)[1]
            assert module not in NOTEBOOK_LAYER[subpackage], f"{subpackage}.{name} comes from {home}"
    for module in NOTEBOOK_LAYER[subpackage]:  # importable by their own name
        importlib.import_module(f"embnb.{subpackage}.{module}")


def _loaded_after(statement: str) -> dict:
    code = (
        f"import sys, json\n{statement}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{HEAVY!r} or m.startswith('embnb.'))))"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_library_imports_load_no_notebook_layer():
    running = {statement: _loaded_after(statement) for statement in LIBRARY_IMPORTS}
    for statement, process in running.items():
        out, _ = process.communicate(timeout=120)
        assert process.returncode == 0, statement
        loaded = json.loads(out)
        heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
        notebook = [
            m
            for m in loaded
            if m.count(".") == 2 and m.split(".")[2] in NOTEBOOK_LAYER.get(m.split(".")[1], ())
        ]
        assert not heavy and not notebook, (statement, heavy, notebook)
        assert any(m.startswith("embnb.") for m in loaded), statement  # the check saw the imports


def test_the_placement_maths_needs_no_torchrec():
    code = "import sys, embnb.columnwise.placement; print(any(m.startswith('torchrec') for m in sys.modules))"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )

"""Every notebook under papermill with interactive=True: the explorer cell
runs its widget (built and drawn once by the package) and no cell errors.
The explorers' controls are driven in each subpackage's widget tests."""

import nbformat
import pytest

from embnb import harness

SMALL = {  # the smallest runs that still touch every section
    "01_modulo_aliasing": {
        "num_keys": 20_000,
        "world_sizes": [4],
        "kv_world_size": 2,
        "kv_keys_per_rank": 64,
        "embedding_dim": 4,
        "reshard_world_size": 3,
        "kernel_sizes": [10_000],
        "kernel_repeats": 1,
    },
    "02_cw_permute_indices": {},
    "03_dp_planner": {
        "num_tables": 6,
        "world_size": 2,
        "budget_fractions": [1.0],
        "quality_instances": 1,
        "timeout_s": 10,
    },
    "04_balancer_overlap": {
        "world_size": 2,
        "batch_size": 4,
        "max_length": 32,
        "steps": 3,
        "repeats": 2,
        "embedding_dim": 8,
        "ffn_dim": 16,
        "sample_counts": [256],
        "part_counts": [4],
        "seeds": [0],
        "exchange_world_sizes": [2],
        "bytes_world_sizes": [2, 4],
    },
}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.mark.parametrize("name", list(SMALL))
def test_notebook_runs_with_its_explorer(tmp_path, name):
    params = {**SMALL[name], "device": "cpu", "interactive": True}
    harness.run_notebook(harness.NOTEBOOKS_DIR / f"{name}.ipynb", tmp_path, params, cell_timeout_s=300)
    executed = nbformat.read(str(tmp_path / f"{name}.ipynb"), as_version=4)
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    views = [o for o in outputs if WIDGET_VIEW in o.get("data", {})]
    assert views, f"{name}: the interactive run displayed no widget"

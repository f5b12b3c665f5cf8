"""Each notebook runs once under papermill, with interactive=True: its tests
assert both its results JSON and the explorer its last section displays."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re

import nbformat
import pytest

from embnb import harness

# fbgemm-gpu 1.6.0 (the min stack) logs at every import, in the kernel and in
# each rank, that its own compatibility table has no entry for 1.6.0: a fact
# about that wheel, printed before any embnb code runs; nothing else is excused.
FBGEMM_NO_COMPAT_ENTRY = re.compile(
    r"WARNING:root:\s*(\x1b\[33m)?\s*_fbgemm_torch_compat_table has no entry for 1\.6\.0 of FBGEMM;"
    r"\s*cannot determine compatibility with PyTorch [^\s]+\s*(\x1b\[0m)?\s*"
)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@dataclasses.dataclass
class Executed:
    name: str
    results: dict
    out: pathlib.Path
    notebook: nbformat.NotebookNode

    def widgets_shown_by(self, code: str) -> int:
        """How many widgets the first code cell containing `code` displayed."""
        cell = next(c for c in self.notebook.cells if c.cell_type == "code" and code in c.source)
        return sum(WIDGET_VIEW in o.get("data", {}) for o in cell.outputs)

    def figures(self) -> list[pathlib.Path]:
        return sorted(self.out.glob(f"{self.name}_fig*.png"))


@pytest.fixture(scope="module")
def execute(tmp_path_factory):
    """execute(name, parameters): one papermill run of notebooks/NAME.ipynb
    on CPU with interactive=True; a cell that raises fails the run."""

    def run(name: str, parameters: dict) -> Executed:
        out = tmp_path_factory.mktemp(name)
        params = {"device": "cpu", **parameters, "interactive": True}
        notebook = harness.NOTEBOOKS_DIR / f"{name}.ipynb"
        torch_logs = os.environ.get("TORCH_LOGS")
        results = harness.run_notebook(notebook, out, params, cell_timeout_s=300)
        # the notebook quiets its own logs; the runner changes nothing here
        assert os.environ.get("TORCH_LOGS") == torch_logs
        executed = nbformat.read(str(out / f"{name}.ipynb"), as_version=4)
        # A reader sees stderr as a red box (JupyterLab): warnings and native
        # logs are caught or fixed, never shown (the browser test checks it too).
        stderr = [
            (index, text)
            for index, cell in enumerate(executed.cells)
            for output in cell.get("outputs", [])
            if output.get("name") == "stderr"
            if (text := FBGEMM_NO_COMPAT_ENTRY.sub("", "".join(output.get("text", "")))).strip()
        ]
        assert not stderr, f"{name}: cells wrote to stderr: {stderr}"[:3000]
        return Executed(name, results, out, executed)

    return run

"""Execute notebooks headless with papermill, and check the committed ones.

`run_notebook` is what `make run` and the tests use: it executes one notebook
with parameters, saves the executed copy, its figures as PNG and its results
JSON under an output folder, and returns the results. `notebook_problems`
lists what breaks the notebook conventions (docs/architecture.md, "Notebook conventions").

    python -m embnb.harness run [NOTEBOOK ...] [--out build/notebooks]
    python -m embnb.harness check [NOTEBOOK ...]
    python -m embnb.harness strip NOTEBOOK ...
"""

from __future__ import annotations

import ast
import base64
import json
import os
import pathlib
import queue
import re
import sys
import tempfile
import time
from typing import Any

import nbformat
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import Type

__all__ = ["run_notebook", "notebook_problems", "strip_outputs", "list_notebooks", "NotebookError"]

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository: embnb/harness/__init__.py
NOTEBOOKS_DIR = ROOT / "notebooks"
REQUIRED_PARAMETERS = ("device", "interactive", "results_path")


class NotebookError(RuntimeError):
    """A notebook failed to execute or did not write its results JSON."""


def list_notebooks(directory: pathlib.Path = NOTEBOOKS_DIR) -> list[pathlib.Path]:
    """The teaching notebooks (`NN_name.ipynb`) and their appendices (`NNa_name.ipynb`), each
    appendix after its teaching notebook."""
    return sorted([*directory.glob("[0-9][0-9]_*.ipynb"), *directory.glob("[0-9][0-9]a_*.ipynb")])


def run_notebook(
    path: str | pathlib.Path,
    out_dir: str | pathlib.Path,
    parameters: dict[str, Any] | None = None,
    cell_timeout_s: int = 600,
    cwd: str | pathlib.Path | None = None,
) -> dict[str, Any]:
    """Execute `path` with papermill into `out_dir` and return its results JSON.

    Writes `out_dir/NAME.ipynb` (executed), `NAME.json` (results) and `NAME_figNN.png` (each PNG
    shown). Parameters default to `interactive=False` and `results_path` in `out_dir`; the working
    directory to the notebook's folder. Raises FileNotFoundError for a missing notebook, NotebookError
    for a failed cell or a missing results JSON.
    """
    import papermill

    _prefer_this_environment_kernel()
    # the kernel inherits a fixed string-hash seed: set orders (torchrec's tie-breaks) repeat run to run
    os.environ.setdefault("PYTHONHASHSEED", "0")
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"notebook {str(path)!r} does not exist")
    out_dir = pathlib.Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / f"{path.stem}.json"
    results_path.unlink(missing_ok=True)  # a stale file must not pass for this run's
    params = {"interactive": False, "results_path": str(results_path), **(parameters or {})}
    executed = out_dir / path.name
    sockets = tempfile.TemporaryDirectory(prefix="embnb-kernel-")
    try:
        papermill.execute_notebook(
            str(path),
            str(executed),
            parameters=params,
            kernel_name="python3",
            cwd=str(cwd or path.parent),
            execution_timeout=cell_timeout_s,
            progress_bar=False,
            log_output=False,
            config=_kernel_config(sockets.name),
        )
    except papermill.PapermillExecutionError as exc:
        raise NotebookError(
            f"{path.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}\n"
            f"executed copy with the traceback: {executed}"
        ) from exc
    finally:
        sockets.cleanup()
        if executed.exists():
            _save_figures(executed, out_dir)
    results_file = pathlib.Path(params["results_path"])
    if not results_file.is_file():
        raise NotebookError(f"{path.name} ran but wrote no results JSON at {results_file}")
    return json.loads(results_file.read_text())


def _kernel_config(socket_dir: str):
    # Unix sockets in a private folder, not TCP on localhost: ipykernel then does not warn that its
    # traffic is unencrypted; the client reads the kernel's replies through `PolledChannel`s.
    from traitlets.config import Config

    manager = {
        "transport": "ipc",
        "ip": os.path.join(socket_dir, "kernel"),
        "client_factory": PolledKernelClient,
    }
    return Config({"KernelManager": manager})


POLL_S = 1.0


class PolledChannel(AsyncZMQSocketChannel):
    """A kernel channel whose waits look at the socket at least every POLL_S
    seconds. Seen here under load: a widget cell's execute_reply sat unread
    for the whole 300 s cell timeout while the kernel was idle, and was read
    at the timeout's last look: the socket's wake-up had been missed. Looking
    again each second bounds such a miss to a second."""

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_S if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await super().get_msg(timeout=min(POLL_S, left))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise


class PolledKernelClient(AsyncKernelClient):
    """nbclient's kernel client, with its shell and iopub replies read through `PolledChannel`."""

    shell_channel_class = Type(PolledChannel)
    iopub_channel_class = Type(PolledChannel)


def _prefer_this_environment_kernel() -> None:
    # A "python3" kernelspec in the user's ~/.local/share/jupyter would win
    # over this environment's; JUPYTER_PATH is searched before it.
    env_path = str(pathlib.Path(sys.prefix) / "share" / "jupyter")
    parts = os.environ.get("JUPYTER_PATH", "").split(os.pathsep)
    if env_path not in parts:
        os.environ["JUPYTER_PATH"] = os.pathsep.join([env_path, *filter(None, parts)])


KEY_FIGURE_TAG = "key-figure"  # the cell whose first image is the notebook's key figure


def _save_figures(executed: pathlib.Path, out_dir: pathlib.Path) -> None:
    """Every image as NAME_figNN.png, and the key figure also as NAME_key.png:
    the first image of the cell tagged `KEY_FIGURE_TAG`, else the first one."""
    notebook = nbformat.read(executed, as_version=4)
    count, key = 0, None
    for cell in notebook.cells:
        tagged = KEY_FIGURE_TAG in cell.get("metadata", {}).get("tags", [])
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            if png:
                count += 1
                data = base64.b64decode(png)
                (out_dir / f"{executed.stem}_fig{count:02d}.png").write_bytes(data)
                if key is None or (tagged and not key[0]):
                    key = (tagged, data)
    if key:
        (out_dir / f"{executed.stem}_key.png").write_bytes(key[1])


def notebook_problems(path: str | pathlib.Path) -> list[str]:
    """What breaks the committed-notebook conventions; empty when clean."""
    notebook = nbformat.read(str(path), as_version=4)
    problems = []
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    if any(c.get("outputs") for c in code_cells):
        problems.append("has outputs (run `python -m embnb.harness strip`)")
    if any(c.get("execution_count") for c in code_cells):
        problems.append("has execution counts")
    if "widgets" in notebook.metadata:
        problems.append("has saved widget state in its metadata")
    kernelspec = notebook.metadata.get("kernelspec", {})
    if not kernelspec.get("language"):
        problems.append("kernelspec has no language (papermill needs one)")
    tagged = [c for c in code_cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        problems.append(f"has {len(tagged)} cells tagged 'parameters', needs exactly 1")
    else:
        problems += _parameter_problems(tagged[0].source)
    problems += _import_problems("\n".join(c.source for c in code_cells))
    return problems


_EMBNB_IMPORT = re.compile(
    r"^\s*from (embnb[\w.]*) import (.+)$|^\s*import (embnb[\w.]*)(?: as (\w+))?", re.M
)


def _import_problems(code: str) -> list[str]:
    """Notebooks call the package's public API: never the bench CLI, never a
    private name (an `_x` imported from embnb or read off an embnb module)."""
    problems, module_names = [], []
    for match in _EMBNB_IMPORT.finditer(code):
        module, names, plain, alias = match.groups()
        module = module or plain
        if module.startswith("embnb.bench") or (module == "embnb" and "bench" in (names or "")):
            problems.append(f"imports the benchmark CLI ({match.group(0).strip()}); use the package")
        imported = [n.split(" as ")[-1].strip(" ()") for n in (names or "").split(",") if n.strip()]
        problems += [f"imports the private name {n!r} from {module}" for n in imported if n.startswith("_")]
        module_names += imported or [alias or plain]
    for name in module_names:
        for private in sorted(set(re.findall(rf"\b{re.escape(name)}\.(_\w+)", code))):
            problems.append(f"reads the private name {name}.{private}")
    return problems


def _parameter_problems(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"parameters cell does not parse: {exc}"]
    problems, names = [], set()
    lines = source.splitlines()
    for node in tree.body:
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            else (node.target if isinstance(node, ast.AnnAssign) else None)
        )
        if not isinstance(target, ast.Name) or node.value is None:
            problems.append(f"parameters line {node.lineno} is not a plain `name = literal`")
            continue
        try:
            ast.literal_eval(node.value)
        except ValueError:
            problems.append(f"parameter {target.id!r} is not a literal")
        if "#" not in lines[node.end_lineno - 1]:
            problems.append(f"parameter {target.id!r} has no comment")
        names.add(target.id)
    problems += [f"parameters cell lacks {name!r}" for name in REQUIRED_PARAMETERS if name not in names]
    # papermill's own reading (`papermill --help-notebook`, its unknown-parameter warning) skips a
    # line holding a second `=`, in a comment too
    unread = sorted(names - _papermill_names(source))
    problems += [f"papermill cannot read parameter {name!r} (a second '=' on its line?)" for name in unread]
    return problems


def _papermill_names(source: str) -> set[str]:
    import logging

    from papermill.translators import PythonTranslator

    papermill_log = logging.getLogger("papermill.translators")
    level, papermill_log.disabled = papermill_log.disabled, True  # its warning is the problem named
    try:
        return {p.name for p in PythonTranslator.inspect(nbformat.v4.new_code_cell(source))}
    finally:
        papermill_log.disabled = level


def strip_outputs(path: str | pathlib.Path) -> None:
    """Remove outputs, execution counts and widget state, in place."""
    notebook = nbformat.read(str(path), as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, str(path))

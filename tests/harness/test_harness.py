"""The notebook harness: real papermill runs of notebooks the tests write."""

import json
import re
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from embnb import harness

PARAMETERS = """device = "auto"  # "auto", "cpu" or "cuda"
interactive = True  # False in CI: no widgets
results_path = "results.json"  # where the last cell writes its numbers
num_items = 3  # how many items to sum
"""

BODY = [
    "import json, os\nimport matplotlib.pyplot as plt",
    "total = sum(range(num_items))\nfig, ax = plt.subplots()\nax.plot(range(num_items))\nplt.show()",
    # The launcher must work from inside a Jupyter kernel.
    "from embnb.dist import launch, check_collectives\nranks = launch(check_collectives, 2, backend='gloo')",
    "with open(results_path, 'w') as f:\n"
    "    json.dump({'total': total, 'interactive': interactive, 'cwd': os.getcwd(),\n"
    "               'all_reduce': [r['all_reduce'] for r in ranks],\n"
    "               'summary': f'total={total}'}, f)",
]


def _write_notebook(path, parameters=PARAMETERS, body=BODY, tags=("parameters",), language="python"):
    cells = [new_markdown_cell("# A test notebook")]
    cells.append(new_code_cell(parameters, metadata={"tags": list(tags)}))
    cells += [new_code_cell(src) for src in body]
    notebook = new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": language}
    if not language:
        del notebook.metadata["kernelspec"]["language"]
    nbformat.write(notebook, str(path))
    return path


def test_run_notebook_injects_parameters_and_returns_results(tmp_path):
    (tmp_path / "src").mkdir()
    nb = _write_notebook(tmp_path / "src" / "01_demo.ipynb")
    out = tmp_path / "out"
    results = harness.run_notebook(nb, out, {"num_items": 5})
    assert results["total"] == sum(range(5))
    assert results["interactive"] is False
    assert results["cwd"] == str(nb.parent)
    assert results["all_reduce"] == [3.0, 3.0]
    assert json.loads((out / "01_demo.json").read_text()) == results
    executed = nbformat.read(str(out / "01_demo.ipynb"), as_version=4)
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in executed.cells)
    pngs = sorted(out.glob("01_demo_fig*.png"))
    assert [p.name for p in pngs] == ["01_demo_fig01.png"]
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_failing_cell_is_reported_with_the_error(tmp_path):
    nb = _write_notebook(tmp_path / "bad.ipynb", body=["x = 1", "raise ValueError('num_items too big')"])
    with pytest.raises(harness.NotebookError, match="ValueError: num_items too big"):
        harness.run_notebook(nb, tmp_path / "out")
    assert (tmp_path / "out" / "bad.ipynb").is_file()  # kept for reading the traceback


def test_notebook_without_results_json_fails(tmp_path):
    nb = _write_notebook(tmp_path / "quiet.ipynb", body=["x = 1"])
    with pytest.raises(harness.NotebookError, match="wrote no results JSON"):
        harness.run_notebook(nb, tmp_path / "out")


def test_cell_timeout_stops_a_stuck_cell(tmp_path):
    nb = _write_notebook(tmp_path / "slow.ipynb", body=["import time\ntime.sleep(120)"])
    with pytest.raises(Exception, match="(?i)timed? ?out"):
        harness.run_notebook(nb, tmp_path / "out", cell_timeout_s=5)


def test_clean_notebook_has_no_problems(tmp_path):
    assert harness.notebook_problems(_write_notebook(tmp_path / "ok.ipynb")) == []


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"tags": ()}, "has 0 cells tagged 'parameters'"),
        ({"language": ""}, "kernelspec has no language"),
        ({"parameters": PARAMETERS + "seed = int('3')  # derived\n"}, "parameter 'seed' is not a literal"),
        ({"parameters": PARAMETERS + "size = 4\n"}, "parameter 'size' has no comment"),
        ({"parameters": PARAMETERS + "print(1)  # side effect\n"}, "is not a plain `name = literal`"),
        ({"parameters": "device = 'cpu'  # d\n"}, "parameters cell lacks 'interactive'"),
        (
            {"parameters": PARAMETERS + "widths = [32]  # at f = 4d\n"},
            "papermill cannot read parameter 'widths'",
        ),
    ],
)
def test_convention_breaks_are_named(tmp_path, change, problem):
    nb = _write_notebook(tmp_path / "x.ipynb", **change)
    assert any(problem in p for p in harness.notebook_problems(nb)), harness.notebook_problems(nb)


@pytest.mark.parametrize(
    "cell, problem",
    [
        ("from embnb.bench import bucketize", "imports the benchmark CLI"),
        ("import embnb.bench.results as t", "imports the benchmark CLI"),
        ("from embnb import bench", "imports the benchmark CLI"),
        ("from embnb.dist import _visible_gpus", "imports the private name '_visible_gpus' from embnb.dist"),
        (
            "from embnb.balancing import partition\nprint(partition._warned)",
            "reads the private name partition._warned",
        ),
        ("import embnb.dist as d\nd._kill_all([])", "reads the private name d._kill_all"),
    ],
)
def test_notebooks_use_only_the_public_package(tmp_path, cell, problem):
    nb = _write_notebook(tmp_path / "x.ipynb", body=[*BODY, cell])
    assert any(problem in p for p in harness.notebook_problems(nb)), harness.notebook_problems(nb)


def test_outputs_and_widget_state_are_found_and_stripped(tmp_path):
    nb = _write_notebook(tmp_path / "x.ipynb")
    notebook = nbformat.read(str(nb), as_version=4)
    notebook.cells[2].outputs = [nbformat.v4.new_output("stream", text="hi")]
    notebook.cells[2].execution_count = 4
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    nbformat.write(notebook, str(nb))
    problems = harness.notebook_problems(nb)
    assert {"has outputs", "has execution counts", "has saved widget state"} <= {
        p.split(" (")[0].split(" in")[0] for p in problems
    }
    harness.strip_outputs(nb)
    assert harness.notebook_problems(nb) == []


def test_two_parameter_cells_are_refused(tmp_path):
    nb = _write_notebook(tmp_path / "x.ipynb")
    notebook = nbformat.read(str(nb), as_version=4)
    notebook.cells.append(new_code_cell("a = 1  # x", metadata={"tags": ["parameters"]}))
    nbformat.write(notebook, str(nb))
    assert "has 2 cells tagged 'parameters', needs exactly 1" in harness.notebook_problems(nb)


@pytest.mark.parametrize("notebook", harness.list_notebooks(), ids=lambda p: p.name)
def test_committed_notebook_follows_the_conventions(notebook):
    assert harness.notebook_problems(notebook) == []


def test_command_line_run_prints_one_summary_line_per_notebook(tmp_path):
    import subprocess
    import sys

    nb = _write_notebook(tmp_path / "02_cli.ipynb")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "embnb.harness",
            "run",
            str(nb),
            "--out",
            str(tmp_path / "out"),
            "-p",
            "num_items",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # no warning lines: ipykernel warns about TCP transport unless the harness uses IPC
    assert "WARNING" not in out.stderr and "encryption" not in out.stderr, out.stderr[-2000:]
    line = next(row for row in out.stdout.splitlines() if row.startswith("02_cli"))
    assert line.endswith(f"total={sum(range(4))}")
    assert json.loads((tmp_path / "out" / "02_cli.json").read_text())["total"] == 6
    # the report: an index linking each notebook's HTML, with its summary line
    index = (tmp_path / "out" / "index.html").read_text()
    assert 'href="02_cli.html"' in index and f"total={sum(range(4))}" in index
    page = (tmp_path / "out" / "02_cli.html").read_text()
    # the executed copy: injected parameters and the figure embedded
    text = re.sub(r"<[^>]+>", "", page)
    assert "num_items = 4" in text and "data:image/png;base64," in page


def test_command_line_check_fails_on_a_dirty_notebook(tmp_path):
    import subprocess
    import sys

    nb = _write_notebook(tmp_path / "x.ipynb", tags=())
    out = subprocess.run(
        [sys.executable, "-m", "embnb.harness", "check", str(nb)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "has 0 cells tagged 'parameters'" in out.stdout


def test_the_kernel_client_reads_replies_through_the_polled_channel(tmp_path):
    from jupyter_client.manager import AsyncKernelManager  # what nbclient runs a notebook with

    manager = AsyncKernelManager(config=harness._kernel_config(str(tmp_path)))
    client = manager.client()
    assert isinstance(client, harness.PolledKernelClient)
    assert type(client.shell_channel) is harness.PolledChannel
    assert type(client.iopub_channel) is harness.PolledChannel


def test_the_polled_channel_waits_its_whole_timeout_and_returns_a_late_message(monkeypatch):
    """Over a real zmq socket pair: a wait of 2.5 s looks several times
    (POLL_S 0.5 s here), returns a message sent after 1.2 s, and with
    nothing sent raises Empty only once its whole timeout has passed."""
    import asyncio
    import queue
    import time

    import zmq
    import zmq.asyncio
    from jupyter_client.session import Session

    monkeypatch.setattr(harness, "POLL_S", 0.5)
    context = zmq.asyncio.Context()
    reader, writer = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    reader.bind("inproc://polled")
    writer.connect("inproc://polled")
    session = Session()
    channel = harness.PolledChannel(reader, session)

    async def late_message() -> dict:
        async def send_later():
            await asyncio.sleep(1.2)
            session.send(writer, "status", {"execution_state": "idle"})

        sender = asyncio.ensure_future(send_later())
        message = await channel.get_msg(timeout=2.5)
        await sender
        return message

    async def nothing() -> float:
        start = time.monotonic()
        with pytest.raises(queue.Empty):
            await channel.get_msg(timeout=1.6)
        return time.monotonic() - start

    try:
        assert asyncio.run(late_message())["content"] == {"execution_state": "idle"}
        assert asyncio.run(nothing()) >= 1.6  # not the first slice's 0.5 s
    finally:
        reader.close(linger=0)
        writer.close(linger=0)
        context.term()


def test_reading_notebooks_builds_no_iri_parser_and_still_validates():
    import jsonschema

    import embnb.lab  # noqa: F401 (marks rfc3987_syntax absent)

    assert sys.modules["rfc3987_syntax"] is None  # jsonschema's IRI formats go unchecked: none is used
    for path in harness.list_notebooks():
        nbformat.validate(nbformat.read(path, as_version=4))
    # the format checker still works for the formats it keeps
    checker = jsonschema.FormatChecker()
    assert checker.conforms("2026-11-27", "date") and not checker.conforms("2026-13-40", "date")


def test_a_summary_given_as_data_prints_on_one_line():
    """A notebook's summary as a dict: its pairs in order, floats to 3 significant digits, nested
    dicts in braces; a sentence as it is."""
    from embnb.harness.__main__ import summary_line

    summary = {
        "device": "cpu",
        "gap": 0.0088445,
        "ci": {"low": -54.216, "high": 71.5},
        "ok": True,
        "n": [1, 2.25],
    }
    assert (
        summary_line(summary)
        == "device: cpu; gap: 0.00884; ci: {low -54.2, high 71.5}; ok: True; n: [1, 2.25]"
    )
    assert summary_line("W = 8: none told apart") == "W = 8: none told apart"

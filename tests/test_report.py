"""embnb.report: make run's index page, with and without nbconvert."""

import sys

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from embnb.report import ReportEntry, write_report


def _executed(path):
    cell = new_code_cell("print(6 * 7)", execution_count=1)
    cell.outputs = [new_output("stream", name="stdout", text="42\n")]
    nbformat.write(new_notebook(cells=[cell]), str(path))


def test_index_links_each_rendered_notebook_with_its_summary_and_time(tmp_path):
    _executed(tmp_path / "01_a.ipynb")
    index = write_report(
        tmp_path, [ReportEntry("01_a", 12.34, "x <= 3"), ReportEntry("02_b", 1.0, "FAILED: boom", ok=False)]
    )
    text = index.read_text()
    assert 'href="01_a.html"' in text and "12.3 s" in text and "x &lt;= 3" in text
    assert "FAILED</b> FAILED: boom" in text and 'href="02_b' not in text  # no executed copy, no link
    assert "42" in (tmp_path / "01_a.html").read_text()


def test_without_nbconvert_the_index_links_the_executed_notebooks(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nbconvert", None)  # as on the GPU machine: not installed
    _executed(tmp_path / "01_a.ipynb")
    text = write_report(tmp_path, [ReportEntry("01_a", 2.0, "ok")]).read_text()
    assert 'href="01_a.ipynb"' in text and "nbconvert is not installed" in text
    assert not (tmp_path / "01_a.html").exists()

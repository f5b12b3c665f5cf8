"""embnb.harness.report: make run's index page, with and without nbconvert."""

import sys

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from embnb.harness.report import ReportEntry, write_report


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
    assert "FAILED</b> <p class='headline'>FAILED: boom</p>" in text
    assert 'href="02_b' not in text  # no executed copy, no link
    assert "42" in (tmp_path / "01_a.html").read_text()


def test_without_nbconvert_the_index_links_the_executed_notebooks(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nbconvert", None)  # as on the GPU machine: not installed
    _executed(tmp_path / "01_a.ipynb")
    text = write_report(tmp_path, [ReportEntry("01_a", 2.0, "ok")]).read_text()
    assert 'href="01_a.ipynb"' in text and "nbconvert is not installed" in text
    assert not (tmp_path / "01_a.html").exists()


def test_each_row_shows_the_key_figure_linking_to_its_page_a_headline_and_the_rest_folded(tmp_path):
    _executed(tmp_path / "01_a.ipynb")
    summary = "stride 12 on 8 ranks: 4.00; hashed 1.01; hot keys 3.5"
    text = write_report(tmp_path, [ReportEntry("01_a", 1.0, summary, figure="01_a_key.png")]).read_text()
    assert '<a href="01_a.html"><img src="01_a_key.png"' in text
    assert "<p class='headline'>stride 12 on 8 ranks: 4.00</p>" in text
    assert "<details><summary>full summary</summary>hashed 1.01; hot keys 3.5</details>" in text


def test_the_key_figure_is_the_tagged_cells_first_image_else_the_first_image(tmp_path):
    import base64

    from embnb import harness

    def image_cell(payload, tags=()):
        cell = new_code_cell("plot()", execution_count=1)
        cell.metadata["tags"] = list(tags)
        data = {"image/png": base64.b64encode(payload).decode()}
        cell.outputs = [new_output("display_data", data=data)]
        return cell

    for name, tags, key in (("tagged", ("key-figure",), b"second"), ("plain", (), b"first")):
        path = tmp_path / f"{name}.ipynb"
        nbformat.write(new_notebook(cells=[image_cell(b"first"), image_cell(b"second", tags)]), str(path))
        harness._save_figures(path, tmp_path)
        assert (tmp_path / f"{name}_key.png").read_bytes() == key
        assert (tmp_path / f"{name}_fig02.png").read_bytes() == b"second"


def test_every_notebook_tags_exactly_one_cell_that_draws_its_key_figure():
    from embnb import harness

    for path in harness.list_notebooks():
        nb = nbformat.read(str(path), as_version=4)
        tagged = [c for c in nb.cells if "key-figure" in c.metadata.get("tags", [])]
        assert len(tagged) == 1 and "display(" in tagged[0].source, path.name

"""The browsable report of a `make run`: each executed notebook rendered to HTML (nbconvert) and an
index page linking them, per notebook its key figure as a thumbnail, the summary's first clause, the
run time and the rest of the summary folded under it.

    write_report(out_dir, [ReportEntry("01_modulo_aliasing", 17.2, "strided W=8: ...")])
"""

from __future__ import annotations

import html
import pathlib
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["ReportEntry", "write_report"]


@dataclass(frozen=True)
class ReportEntry:
    name: str  # notebook stem; its executed copy is out_dir/NAME.ipynb
    seconds: float
    summary: str  # the results JSON's summary line, or why the run failed
    ok: bool = True
    figure: str | None = None  # the key figure's file name in out_dir, if any

    @property
    def headline(self) -> str:
        """The summary's first clause: one finding, the rest is folded."""
        return self.summary.split("; ", 1)[0]


def _render(executed: pathlib.Path, exporter: Any) -> pathlib.Path | None:
    """executed/NAME.ipynb -> NAME.html beside it; the executed copy itself without an `exporter`
    (nbconvert is missing: the GPU kit has none); None when there is no executed copy."""
    if not executed.is_file() or exporter is None:
        return executed if executed.is_file() else None
    import nbformat

    body, _ = exporter.from_notebook_node(nbformat.read(str(executed), as_version=4))
    page = executed.with_suffix(".html")
    page.write_text(body, encoding="utf-8")
    return page


def write_report(out_dir: str | pathlib.Path, entries: list[ReportEntry]) -> pathlib.Path:
    """Render every entry's executed notebook and write out_dir/index.html
    (without nbconvert, the index links the executed notebooks themselves)."""
    out_dir = pathlib.Path(out_dir)
    rows, note = [], ""
    try:
        from nbconvert import HTMLExporter

        exporter = HTMLExporter()
    except ImportError:
        exporter = None
        note = "<p>nbconvert is not installed here: the notebooks are linked as executed .ipynb files.</p>"
    for entry in entries:
        page = _render(out_dir / f"{entry.name}.ipynb", exporter)
        name = html.escape(entry.name)
        link = f'<a href="{html.escape(page.name)}">{name}</a>' if page else name
        status = "" if entry.ok else '<b class="failed">FAILED</b> '
        thumb = ""
        if entry.figure:
            image = f'<img src="{html.escape(entry.figure)}" alt="{name}: key figure" width="320">'
            thumb = f'<a href="{html.escape(page.name)}">{image}</a>' if page else image
        rest = entry.summary[len(entry.headline) :].lstrip("; ")
        folded = f"<details><summary>full summary</summary>{html.escape(rest)}</details>" if rest else ""
        rows.append(
            f"<tr><td>{link}<br>{thumb}</td><td class='num'>{entry.seconds:.1f} s</td>"
            f"<td>{status}<p class='headline'>{html.escape(entry.headline)}</p>{folded}</td></tr>"
        )
    index = out_dir / "index.html"
    index.write_text(
        f"""<!doctype html>
<html><head><meta charset="utf-8"><title>embnb notebooks</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
td, th {{ padding: 0.3em 0.8em; text-align: left; vertical-align: top; border-bottom: 1px solid #ddd; }}
.num {{ text-align: right; white-space: nowrap; }}
.failed {{ color: #b00; }}
.headline {{ margin: 0 0 0.4em 0; font-weight: bold; }}
details {{ color: #444; font-size: 0.9em; }}
</style></head><body>
<h1>embnb notebooks</h1>
<p>Executed {html.escape(time.strftime("%Y-%m-%d %H:%M"))} by <code>make run</code>.</p>{note}
<table><tr><th>notebook and its key figure</th><th>time</th><th>headline</th></tr>
{chr(10).join(rows)}
</table></body></html>
""",
        encoding="utf-8",
    )
    return index

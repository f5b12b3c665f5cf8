"""`python -m embnb.harness run|check|strip [NOTEBOOK ...]`: `make run`, `make check-notebooks` and
`make strip-notebooks` (the package's docstring)."""

from __future__ import annotations

import pathlib
import sys
import time
from typing import Any

from embnb.harness import ROOT, list_notebooks, notebook_problems, run_notebook, strip_outputs


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m embnb.harness")
    parser.add_argument("command", choices=["run", "check", "strip"])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "notebooks")
    parser.add_argument(
        "-p",
        "--param",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="a parameter for every notebook (VALUE: YAML, as papermill -p)",
    )
    opts = parser.parse_args(argv)
    notebooks = opts.notebooks or list_notebooks()
    if not notebooks:
        print("no notebooks yet under notebooks/")
        return 0
    if opts.command == "strip":
        for nb in notebooks:
            strip_outputs(nb)
        return 0
    if opts.command == "check":
        bad = {nb: notebook_problems(nb) for nb in notebooks}
        for nb, problems in bad.items():
            print(f"{nb}: {'; '.join(problems) or 'ok'}")
        return 1 if any(bad.values()) else 0
    import yaml

    from embnb.harness.report import ReportEntry, write_report

    params = {name: yaml.safe_load(value) for name, value in opts.param}
    entries = []
    for nb in notebooks:
        start = time.perf_counter()
        try:
            results = run_notebook(nb, opts.out, params)
            line, ok = summary_line(results.get("summary", "(no summary in results JSON)")), True
        except Exception as exc:  # report and go on with the next notebook
            line, ok = f"FAILED: {str(exc).splitlines()[0]}", False
        seconds = time.perf_counter() - start
        figure = f"{nb.stem}_key.png" if (opts.out / f"{nb.stem}_key.png").is_file() else None
        entries.append(ReportEntry(nb.stem, seconds, line, ok, figure))
        print(f"{nb.stem:<28} {seconds:7.1f} s  {line}", flush=True)
    print(f"outputs in {opts.out}; report: {write_report(opts.out, entries)}")
    return 0 if all(e.ok for e in entries) else 1


def summary_line(summary: Any) -> str:
    """A notebook's summary on one line: a dict (its headline numbers as data) as `key: value`
    pairs, nested dicts in braces, floats to 3 significant digits; anything else as `str`."""
    if isinstance(summary, dict):
        return "; ".join(f"{key}: {_short(value)}" for key, value in summary.items())
    return str(summary)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} {_short(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(item) for item in value) + "]"
    return str(value)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

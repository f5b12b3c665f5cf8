"""`python -m embnb.harness run|check|strip [NOTEBOOK ...]`: `make run`, `make check-notebooks` and
`make strip-notebooks` (the package's docstring)."""

from __future__ import annotations

import pathlib
import sys
import time

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
            summary = results.get("summary", "(no summary in results JSON)")
            if isinstance(summary, dict):  # a notebook's headline numbers as data
                summary = "; ".join(f"{key}: {value}" for key, value in summary.items())
            line, ok = str(summary), True
        except Exception as exc:  # report and go on with the next notebook
            line, ok = f"FAILED: {str(exc).splitlines()[0]}", False
        seconds = time.perf_counter() - start
        figure = f"{nb.stem}_key.png" if (opts.out / f"{nb.stem}_key.png").is_file() else None
        entries.append(ReportEntry(nb.stem, seconds, line, ok, figure))
        print(f"{nb.stem:<28} {seconds:7.1f} s  {line}", flush=True)
    print(f"outputs in {opts.out}; report: {write_report(opts.out, entries)}")
    return 0 if all(e.ok for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

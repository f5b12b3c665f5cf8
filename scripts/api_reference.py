"""Write docs/api.md, the API reference, from the docstrings of what each
technique's subpackage exports (its `__all__`).

    .venv/bin/python scripts/api_reference.py           # rewrite docs/api.md
    .venv/bin/python scripts/api_reference.py --check   # exit 1 if the page differs

tests/test_docs.py regenerates the page and fails on any difference, so the
reference never drifts from the code. Signatures are shown as written in the
source (the modules use postponed annotations), docstrings as they are.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import pathlib
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"
COMMAND = "python scripts/api_reference.py"
MODULES = ("embnb.planner", "embnb.rowwise", "embnb.columnwise", "embnb.balancing", "embnb.steptime")
SHORT_VALUE = 100  # constants whose repr is longer are shown by type only


def render() -> str:
    lines = [
        "# API reference",
        "",
        f"Generated from the docstrings by `{COMMAND}`; do not edit by hand. What each",
        "subpackage exports (its `__all__`), in that order. Guides: [planner.md](planner.md),",
        "[sharders.md](sharders.md), the README's examples.",
        "",
    ]
    lines += [f"- [`{name}`](#{name.replace('.', '')})" for name in MODULES]
    for module_name in MODULES:
        module = _import(module_name)
        lines += ["", f"## {module_name}", "", _first_paragraph(inspect.getdoc(module) or "")]
        for name in module.__all__:
            lines += _entry(name, getattr(module, name))
    return "\n".join(lines) + "\n"


def _import(name: str):
    with warnings.catch_warnings():  # torchrec's and fbgemm's import-time notices
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def _entry(name: str, obj) -> list[str]:
    if inspect.isclass(obj):
        return _class(name, obj)
    if callable(obj):
        return ["", f"### `{name}{_signature(obj)}`", "", *_doc(obj)]
    shown = repr(obj)
    value = f" = {shown}" if len(shown) <= SHORT_VALUE else f": {type(obj).__name__}"
    return ["", f"### `{name}{value}`"]


def _class(name: str, cls: type) -> list[str]:
    kind = "dataclass" if dataclasses.is_dataclass(cls) else "class"
    bases = [b for b in cls.__bases__ if b is not object]
    based = f" ({', '.join(f'{b.__module__}.{b.__qualname__}' for b in bases)})" if bases else ""
    signature = _signature(cls) if "__init__" in vars(cls) or dataclasses.is_dataclass(cls) else ""
    lines = ["", f"### {kind} `{name}{signature}`{based}", "", *_doc(cls)]
    for member, value in vars(cls).items():  # its own public members, in source order
        if member.startswith("_") or not getattr(value, "__doc__", None):
            continue
        if isinstance(value, property):
            lines += ["", f"#### `{name}.{member}` (property)", "", *_doc(value.fget)]
        elif inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod)):
            function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            lines += ["", f"#### `{name}.{member}{_signature(function)}`", "", *_doc(function)]
    return lines


def _signature(obj) -> str:
    """The signature with its annotations as written (not quoted)."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a text signature
        return "(...)"
    parameters = [p.replace(annotation=_written(p.annotation)) for p in signature.parameters.values()]
    return str(
        signature.replace(parameters=parameters, return_annotation=_written(signature.return_annotation))
    )


def _written(annotation):
    return annotation if annotation is inspect.Signature.empty else _Written(annotation)


class _Written:
    """An annotation shown as its source text: inspect shows a non-type by its repr."""

    def __init__(self, annotation) -> None:
        self.text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)

    def __repr__(self) -> str:
        return self.text


def _doc(obj) -> list[str]:
    doc = inspect.getdoc(obj)
    return ["```text", doc, "```"] if doc else ["(no docstring)"]


def _first_paragraph(doc: str) -> str:
    return doc.split("\n\n")[0].replace("\n", " ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md differs")
    args = parser.parse_args()
    page = render()
    if args.check:
        if PAGE.read_text() != page:
            print(f"docs/api.md differs from the docstrings: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

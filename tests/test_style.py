"""One formatter and linter (ruff, configured in pyproject.toml) for the
package, tests and notebooks: `make test` fails on any violation."""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    beside = pathlib.Path(sys.executable).parent / "ruff"
    if beside.exists():
        return [str(beside)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.fail("ruff is not installed: run `make setup` (it is pinned in requirements.txt)")


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_finds_nothing(command):
    out = subprocess.run([*_ruff(), *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, (
        f"ruff {' '.join(command)}: fix with `ruff check --fix . && ruff format .`\n"
        + (out.stdout + out.stderr)[-4000:]
    )


def test_the_formatter_is_never_turned_off():
    """One formatter: no statement of the package, its tests or its scripts is packed by hand under
    a `fmt: skip` or `fmt: off` comment (ruff would then keep it as written, and line counts would
    hide it)."""
    turned_off = re.compile(r"#\s*fmt:\s*(skip|off)\b")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("embnb", "tests", "scripts")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if turned_off.search(line)
    ]
    assert found == []


def test_no_public_signature_carries_a_test_hook():
    """Faults are injected by the tests (tests/ranks.py), never through a
    parameter of the library's public functions, classes or methods."""
    import importlib
    import inspect
    import pkgutil

    import embnb

    hooks = []
    for info in pkgutil.walk_packages(embnb.__path__, "embnb."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.startswith("_") or getattr(value, "__module__", None) != info.name:
                continue
            members = [value]
            if inspect.isclass(value):
                methods = {n: m for n, m in vars(value).items() if n == "__init__" or n[0] != "_"}
                members += [m for m in methods.values() if callable(m)]
            for member in members:
                try:
                    parameters = inspect.signature(member).parameters
                except (TypeError, ValueError):  # a builtin without a signature
                    continue
                hooks += [f"{info.name}.{name}({p})" for p in parameters if "fail" in p or "fault" in p]
    assert hooks == []

"""One formatter and linter (ruff, configured in pyproject.toml) for the
package, tests and notebooks: `make test` fails on any violation."""

import pathlib
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

"""The pins agree everywhere, and this environment's stack (STACK=pinned or
min, as `make test` exports it) loads."""

import os
import pathlib
import re
import subprocess

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _pins(lines):
    return dict(
        re.match(r"^\s*-?\s*([A-Za-z0-9_.\-]+)==(\S+)", line).groups()
        for line in lines
        if re.match(r"^\s*-?\s*[A-Za-z0-9_.\-]+==", line)
    )


STACK = os.environ.get("STACK", "pinned")


def _setup_script_pins(stack="pinned"):
    script = (ROOT / "scripts" / "setup_env.sh").read_text()
    return dict(re.findall(rf'^{stack.upper()}_\w+_PIN="([A-Za-z0-9_.\-]+)==([^"]+)"', script, re.M))


def test_the_range_has_three_stacks_with_matching_fbgemm_and_torch():
    pinned, minimum, top = (_setup_script_pins(stack) for stack in ("pinned", "min", "top"))
    assert set(pinned) == set(minimum) == set(top) == {"torch", "fbgemm-gpu-cpu", "fbgemm-gpu", "torchrec"}
    assert (pinned["torch"], pinned["fbgemm-gpu-cpu"]) == ("2.13.0", "1.8.0")
    assert (minimum["torch"], minimum["fbgemm-gpu-cpu"]) == ("2.11.0", "1.6.0")
    assert (top["torch"], top["fbgemm-gpu-cpu"], top["torchrec"]) == ("2.14.1", "1.9.0", "1.9.2")
    readme = (ROOT / "README.md").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    for stack in (pinned, minimum, top):  # the README and pyproject state the same range
        assert f"torch {stack['torch']}" in readme and f"torchrec {stack['torchrec']}" in readme
    assert '"torch>=2.11,<2.15"' in pyproject and pyproject.count('"torchrec>=1.6.1,<1.10"') == 2
    assert "make test STACK=top" in (ROOT / ".ci" / "run").read_text()


def test_environment_yml_has_the_same_pins():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    expected = _pins((ROOT / "requirements.txt").read_text().splitlines())
    script = _setup_script_pins()
    expected |= {name: script[name] for name in ("torch", "fbgemm-gpu-cpu")}
    assert _pins(pip_section) == expected


def test_installed_versions_match_the_pins():
    from importlib.metadata import version

    pins = _pins((ROOT / "requirements.txt").read_text().splitlines()) | _setup_script_pins(STACK)
    pins.pop("fbgemm-gpu" if _installed("fbgemm-gpu-cpu") else "fbgemm-gpu-cpu")
    for name, pin in pins.items():
        assert version(name).split("+")[0] == pin, name


def _installed(name):
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(name)
        return True
    except PackageNotFoundError:
        return False


def test_stack_loads_with_the_fbgemm_ops():
    import fbgemm_gpu  # noqa: F401  registers torch.ops.fbgemm
    import torch
    import torchrec  # noqa: F401

    assert hasattr(torch.ops.fbgemm, "block_bucketize_sparse_features")


def test_setup_is_a_fast_no_op_when_nothing_changed():
    env = {**os.environ, "STACK": STACK}
    out = subprocess.run(
        ["bash", "scripts/setup_env.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "building" not in out.stdout
    # it still makes sure the native extension is built (a cache hit: loaded, not compiled)
    assert "embnb: native extension ready" in out.stdout, out.stderr
    assert "compiling" not in out.stderr


def test_setup_and_the_readme_name_the_one_build_command():
    script = (ROOT / "scripts" / "setup_env.sh").read_text()
    assert '"$VENV/bin/python" -m embnb.cuda build' in script
    readme = (ROOT / "README.md").read_text()
    assert "`make setup` builds them" in readme and "`python -m embnb.cuda build`" in readme


def test_setup_rejects_an_unknown_fbgemm_variant():
    out = subprocess.run(
        ["bash", "scripts/setup_env.sh", "rocm"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "EMBNB_FBGEMM='rocm' is not one of auto, cpu, cuda" in out.stderr


def test_empty_test_selection_fails_with_a_clear_message():
    out = subprocess.run(
        ["bash", "scripts/run_tests.sh", "-k", "no_test_has_this_name_xyz", "tests/test_environment.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "EMBNB_TEST_WORKERS": "0"},  # workers would only import and collect twice more
    )
    assert out.returncode == 1
    assert "pytest collected no tests (exit 5)" in out.stderr


def test_setup_rejects_an_unknown_stack():
    out = subprocess.run(
        ["bash", "scripts/setup_env.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "STACK": "max"},
    )
    assert out.returncode == 2
    assert "STACK='max' is not one of pinned, min, top" in out.stderr


def test_the_slowest_files_the_suite_starts_with_exist():
    from conftest import SLOWEST_FILES, TESTS_DIR

    assert len(set(SLOWEST_FILES)) == len(SLOWEST_FILES)
    assert [name for name in SLOWEST_FILES if not (TESTS_DIR / name).is_file()] == []

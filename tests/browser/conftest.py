"""A real JupyterLab (from this environment, 127.0.0.1, a free port, no
token) and headless chromium driven by Playwright, for tests/browser.

The lab is stopped at the end whatever happens (a failure, a timeout,
Ctrl-C, SIGTERM or SIGHUP): its kernels are shut down through the REST API,
then the server and anything left in its process group are terminated (and
killed if they linger), then any kernel still alive with its ranks: jupyter
starts each kernel in a session of its own, out of the server's group."""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

import pytest

LAB_START_TIMEOUT_S = 90
# JupyterLab settings for the test: render every cell (windowing would leave
# cells outside the viewport out of the page) and fetch no news.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
}


@dataclass(frozen=True)
class Lab:
    url: str
    root: pathlib.Path  # the folder JupyterLab serves; notebooks go here
    log: pathlib.Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, method: str = "GET") -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
        return response.read()


def shutdown_kernels(url: str, wait_s: float = 20) -> list[str]:
    """Shut down every kernel of the lab at `url` (they outlive their tabs);
    returns the ids of kernels still listed after `wait_s`."""
    try:
        for kernel in json.loads(_get(f"{url}/api/kernels")):
            _get(f"{url}/api/kernels/{kernel['id']}", method="DELETE")
        deadline = time.monotonic() + wait_s
        while kernels := [k["id"] for k in json.loads(_get(f"{url}/api/kernels"))]:
            if time.monotonic() > deadline:
                return kernels
            time.sleep(0.5)
        return []
    except OSError as error:  # an HTTP 403 is an OSError too: never hide it
        return [f"(the lab did not answer: {error})"]


def _kernel_pids(runtime_dir: pathlib.Path) -> list[int]:
    """The lab's kernels: processes whose command line names a connection
    file in this lab's own (temporary) runtime folder."""
    needle = str(runtime_dir).encode()
    pids = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def _kill_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _stop(proc: subprocess.Popen, url: str, runtime_dir: pathlib.Path) -> None:
    kernels = _kernel_pids(runtime_dir)  # each leads a session (and process group) of its own
    if proc.poll() is None:
        shutdown_kernels(url, wait_s=10)  # by name first: the server stops them cleanly
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            if not _kill_group(proc.pid, sig):
                break
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
    # Kernels the server could not stop, with the ranks they spawned (same group).
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in kernels + _kernel_pids(runtime_dir) if _kill_group(pid, sig)]
        if not alive:
            break
        time.sleep(3)


def _interrupt(signum, frame):
    # SIGTERM (a CI job cancelled, `timeout`) and SIGHUP would end Python
    # without running fixture teardowns or atexit: raise instead, like Ctrl-C.
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Lab:
    base = tmp_path_factory.mktemp("lab")
    root, settings, log = base / "notebooks", base / "settings", base / "lab.log"
    root.mkdir()
    for relative, values in LAB_SETTINGS.items():
        path = settings / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "PYTHONHASHSEED": "0",
    }
    command = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--IdentityProvider.token=",
        "--ServerApp.password=",
        # No token, so no XSRF cookie for the REST calls that stop kernels; a
        # loopback-only test server with no token guards nothing with it.
        "--ServerApp.disable_check_xsrf=True",
        f"--ServerApp.root_dir={root}",
    ]
    if os.geteuid() == 0:  # CI containers run as root; JupyterLab refuses that unless told
        command.append("--ServerApp.allow_root=True")
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    atexit.register(_stop, proc, url, base / "runtime")  # also after an interrupted session
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        deadline = time.monotonic() + LAB_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                _get(f"{url}/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"JupyterLab did not answer in {LAB_START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
                    )
                time.sleep(0.5)
        yield Lab(url, root, log)
    finally:
        _stop(proc, url, base / "runtime")
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    executable = os.environ.get("EMBNB_CHROMIUM")
    if not executable:
        pytest.fail("EMBNB_CHROMIUM is not set: run the browser tests with `make test-browser`")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    # Let the `page` fixture know whether the test failed, to keep evidence.
    report = yield
    if report.when == "call":
        item.failed_call = report.failed
    return report

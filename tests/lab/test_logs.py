"""embnb.lab.logs: the notebooks quiet torch.fx's deprecation log themselves,
in their kernel and in the ranks they launch afterwards."""

import os
import pathlib
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent.parent
NOISE = "is_fx_tracing will return"
# A fresh process, as a notebook kernel is: maybe quiet, then call is_fx_tracing
# here and on two ranks launched after it (as torchrec does for every KJT).
PROGRAM = """
import sys
sys.path.insert(0, {tests!r})
import ranks
from torch.fx._symbolic_trace import is_fx_tracing
from embnb.dist import launch
from embnb.lab.logs import quiet_torch_fx
if {quiet}:
    quiet_torch_fx()
print(is_fx_tracing(), launch(ranks.call_is_fx_tracing, 2, device="cpu"))
"""


def _run(quiet: bool) -> subprocess.CompletedProcess:
    code = PROGRAM.format(tests=str(TESTS), quiet=quiet)
    # as a fresh kernel starts: without the TORCH_LOGS an earlier quiet_torch_fx
    # in this pytest process (the harness calls it) left in os.environ
    env = {name: value for name, value in os.environ.items() if name != "TORCH_LOGS"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def test_quiet_torch_fx_quiets_this_process_and_the_ranks_it_launches():
    quiet, loud = _run(quiet=True), _run(quiet=False)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "False [False, False]", quiet.stderr[-2000:]
    assert NOISE not in quiet.stderr
    # without it the noise is real: once in this process and once on each rank
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert loud.stderr.count(NOISE) == 3, loud.stderr[-2000:]


def test_quiet_torch_fx_keeps_the_users_torch_logs(monkeypatch):
    from embnb.lab.logs import FX_LOGGER, quiet_torch_fx

    monkeypatch.setenv("TORCH_LOGS", "+dynamo")
    quiet_torch_fx()
    quiet_torch_fx()  # twice: one entry
    assert os.environ["TORCH_LOGS"] == f"+dynamo,-{FX_LOGGER}"

#!/usr/bin/env bash
# Runs pytest in .venv. Exit code 5 means pytest collected nothing: a typo in a
# -k expression or a broken tests/ folder, never a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
# One worker per core (EMBNB_TEST_WORKERS overrides; 0 runs in this process).
# --dist loadfile keeps a file's tests on one worker: a notebook's tests share
# its one papermill run (a module fixture), and a file's multi-rank cases
# share one launch. Files are handed out in collection order
# (--no-loadscope-reorder), which tests/conftest.py starts with the slowest. (loadgroup would spread tests more finely, but
# pytest-xdist 3.8 marks a group by renaming item._nodeid, which pytest 9 no
# longer reads: its groups split.)
# OpenMP threads that wait for work sleep rather than spin: with a worker per
# core, spinning threads of one process take the cores another needs (small
# tensor ops ran 10-20x slower on the 2-core machine under the suite's load).
# The tests time nothing they assert; `make run` keeps OpenMP's default.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
"${VENV:-.venv}/bin/python" -m pytest -n "${EMBNB_TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder "$@"
rc=$?
if [[ $rc == 5 ]]; then
  echo "make test: pytest collected no tests (exit 5); check PYTEST_ARGS='$*' and tests/" >&2
  exit 1
fi
exit $rc

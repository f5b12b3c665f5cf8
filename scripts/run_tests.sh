#!/usr/bin/env bash
# Runs pytest in .venv. Exit code 5 means pytest collected nothing: a typo in a
# -k expression or a broken tests/ folder, never a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
# One worker per core (EMBNB_TEST_WORKERS overrides; 0 runs in this process).
# --dist loadfile keeps a file's tests on one worker: a notebook's tests share
# its one papermill run (a module fixture), and a file's multi-rank cases
# share one launch. (loadgroup would spread tests more finely, but
# pytest-xdist 3.8 marks a group by renaming item._nodeid, which pytest 9 no
# longer reads: its groups split.)
"${VENV:-.venv}/bin/python" -m pytest -n "${EMBNB_TEST_WORKERS:-auto}" --dist loadfile "$@"
rc=$?
if [[ $rc == 5 ]]; then
  echo "make test: pytest collected no tests (exit 5); check PYTEST_ARGS='$*' and tests/" >&2
  exit 1
fi
exit $rc

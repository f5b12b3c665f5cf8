#!/usr/bin/env bash
# Runs pytest in .venv. Exit code 5 means pytest collected nothing: a typo in a
# -k expression or a broken tests/ folder, never a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
"${VENV:-.venv}/bin/python" -m pytest "$@"
rc=$?
if [[ $rc == 5 ]]; then
  echo "make test: pytest collected no tests (exit 5); check PYTEST_ARGS='$*' and tests/" >&2
  exit 1
fi
exit $rc

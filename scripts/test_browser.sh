#!/usr/bin/env bash
# `make test-browser`: the notebooks in a real JupyterLab in headless chromium.
# Needs the system chromium (Debian's package; installed here with apt-get
# when this runs as root) and Playwright for Python in .venv (pinned in
# requirements-browser.txt). Then runs tests/browser, which `make test` skips.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
chromium=${EMBNB_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [[ -z $chromium ]]; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "test-browser: installing Debian's chromium (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    chromium=$(command -v chromium)
  else
    echo "test-browser: no chromium found. Install it (Debian/Ubuntu: sudo apt-get install chromium)" >&2
    echo "  or point EMBNB_CHROMIUM at a Chromium or Chrome binary." >&2
    exit 2
  fi
fi
if ! "$venv/bin/python" -c "import playwright" 2>/dev/null; then
  echo "test-browser: installing Playwright for Python into $venv (requirements-browser.txt)"
  "$venv/bin/python" -m pip install -q -r requirements-browser.txt || {
    echo "test-browser: could not install Playwright from the package index (see above)" >&2
    exit 2
  }
fi
export EMBNB_CHROMIUM=$chromium EMBNB_BROWSER_TEST=1
exec "$venv/bin/python" -m pytest tests/browser "$@"

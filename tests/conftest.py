import os
import pathlib
import sys

# Spawned ranks import their per-rank functions from tests/ as plain modules.
TESTS_DIR = pathlib.Path(__file__).parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

# tests/browser needs chromium and Playwright: `make test-browser` runs it.
collect_ignore = [] if os.environ.get("EMBNB_BROWSER_TEST") else ["browser"]


def pytest_sessionstart(session):
    # Build the native extension once, here, rather than in several spawned
    # ranks at the same moment; without a compiler this warns and tests that
    # need it say so.
    from embnb.native import loader

    loader.try_load()

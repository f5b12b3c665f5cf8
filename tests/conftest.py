import pathlib
import sys

# Spawned ranks import their per-rank functions from tests/ as plain modules.
TESTS_DIR = pathlib.Path(__file__).parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))


def pytest_sessionstart(session):
    # Build the native extension once, here, rather than in several spawned
    # ranks at the same moment; without a compiler this warns and tests that
    # need it say so.
    from embnb.native import loader

    loader.try_load()

import pathlib
import sys

# Spawned ranks import their per-rank functions from tests/ as plain modules.
TESTS_DIR = pathlib.Path(__file__).parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

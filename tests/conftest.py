import os
import pathlib
import sys

import pytest

# Before any test module imports nbformat: see embnb/lab/__init__.py (a parser
# built on import, seconds in every pytest worker).
sys.modules.setdefault("rfc3987_syntax", None)

# Spawned ranks import their per-rank functions from tests/ as plain modules.
TESTS_DIR = pathlib.Path(__file__).parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

# tests/browser needs chromium and Playwright: `make test-browser` runs it.
collect_ignore = [] if os.environ.get("EMBNB_BROWSER_TEST") else ["browser"]


@pytest.fixture(autouse=True)
def _torch_logs_as_pytest_started():
    """A bench run in this process sets TORCH_LOGS for the ranks it launches
    (bench.timing.quiet_torchrec_logs); the next test starts without it, as
    the fresh processes some tests launch must."""
    before = os.environ.get("TORCH_LOGS")
    yield
    if before is None:
        os.environ.pop("TORCH_LOGS", None)
    else:
        os.environ["TORCH_LOGS"] = before


# Files whose tests take longest, longest first (`--durations` on the idle
# 2-core machine). They start first: `make test` hands out whole files
# (--dist loadfile, in collection order), and a long file handed out last
# would leave the other worker idle while it runs.
SLOWEST_FILES = (
    "test_bench.py",
    "test_dist.py",
    "planner/test_replica.py",
    "test_readme.py",
    "test_wheel.py",
    "test_gpu_kit.py",
    "harness/test_harness.py",
    "cuda/test_native.py",
    "notebooks/test_notebook_01.py",
    "notebooks/test_notebook_01a.py",
    "notebooks/test_notebook_04.py",
    "notebooks/test_notebook_04a.py",
    "planner/test_enumerator.py",
    "notebooks/test_notebook_03a.py",
    "notebooks/test_notebook_03.py",
    "planner/test_planner.py",
    "notebooks/test_notebook_02.py",
    "notebooks/test_notebook_02a.py",
    "test_library_api.py",
    "planner/test_search_space.py",
    "cuda/test_build.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}

    def order(item):
        path = pathlib.Path(str(item.path)).relative_to(TESTS_DIR).as_posix()
        return rank.get(path, len(rank))

    items.sort(key=order)  # stable: a file's tests, and the other files, keep their order


def pytest_sessionstart(session):
    # Build the native extension once, here, rather than in several spawned
    # ranks at the same moment; without a compiler this warns and tests that
    # need it say so.
    from embnb.cuda import loader

    loader.try_load()


# The one rule for tests that need a CUDA GPU: mark them `@pytest.mark.cuda`.
# Without a visible GPU they are skipped, except where EMBNB_REQUIRE_GPU=1
# (the GPU kit sets it on a GPU machine): there a CUDA test that cannot run
# fails, so a kit run cannot pass without running its CUDA tests.
REQUIRE_GPU = "EMBNB_REQUIRE_GPU"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cuda: needs a CUDA GPU (fails instead of skipping under EMBNB_REQUIRE_GPU=1)"
    )


def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") is None:
        return
    import torch

    if torch.cuda.is_available():
        return
    if os.environ.get(REQUIRE_GPU) == "1":
        pytest.fail(f"{REQUIRE_GPU}=1 but no CUDA GPU is visible: this CUDA test cannot run")
    pytest.skip("no CUDA GPU: CUDA tests run only where one is lent")

"""Python's cyclic garbage collector paused around allocation-heavy work."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off, then back as it was.

    Enumerating and planning allocate many objects (shards and their
    estimates, then the search's small lists and tuples), and each
    collection those allocations trigger walks every live object again, so
    the collector's cost grows with the model. What is allocated there is
    freed by reference counting or lives on; none of it forms cycles that
    need the collector."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

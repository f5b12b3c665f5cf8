"""What native code writes to file descriptor 2, caught instead of shown."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["native_stderr"]


@contextmanager
def native_stderr() -> Iterator[list[str]]:
    """Catch file descriptor 2 for the block; the yielded list holds its lines
    afterwards.

    C++ logging (FBGEMM's bounds check, Kineto's profiler) writes to the
    descriptor directly, past `sys.stderr`, so a notebook would show it as a
    stderr output. Callers decide what to pass on.

        with native_stderr() as lines:
            tbe(ids, offsets)
        lines  # -> ["[E... embedding_bounds_check_host_cpu.cpp:111] ...\\n"]
    """
    sys.stderr.flush()
    lines: list[str] = []
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines.extend(caught.read().decode(errors="replace").splitlines(True))

"""Show a function's source in a notebook, taken from the package (where the tests check it) rather than
copied into a cell: `display(show_source(lab.shard_model))`."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any

__all__ = ["show_source"]


def show_source(*functions: Callable[..., Any]) -> Any:
    """The functions' source, one after another, as a syntax-highlighted
    IPython `Code` object (plain text where it is printed)."""
    from IPython.display import Code

    if not functions:
        raise ValueError("show_source needs at least one function")
    for fn in functions:
        if not callable(fn):
            raise TypeError(f"show_source takes functions, got {type(fn).__name__}")
    text = "\n\n".join(textwrap.dedent(inspect.getsource(fn)).rstrip() for fn in functions)
    return Code(text + "\n", language="python")

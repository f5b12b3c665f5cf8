"""Argument checks with one policy for the whole package.

- A value of the wrong type raises TypeError; a value of the right type but
  outside what is allowed raises ValueError. Both name the argument, the bad
  value and what is allowed.
- bool is never an int or a number here: `True` as a world size is a bug,
  not 1.

    world_size = check_int("world_size", world_size, low=1)
    alpha = check_number("alpha", alpha, low=0, low_open=True)
    mode = check_choice("mode", mode, ("none", "sync", "overlap"))
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import torch

__all__ = ["check_int", "check_number", "check_choice", "check_int_tensor", "check_bool"]

INDEX_DTYPES = (torch.int32, torch.int64)


def _range_text(
    low: float | None, high: float | None, low_open: bool = False, high_open: bool = False
) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high}"
    return ""


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """`value` if it is an int (not a bool) in [low, high]; either bound may be None."""
    allowed = " ".join(filter(None, ["an int", _range_text(low, high)]))
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {allowed}, got {type(value).__name__} {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """`value` as a float if it is a finite real (int or float, not a bool)
    within the bounds; `low_open`/`high_open` exclude the bound itself."""
    allowed = " ".join(filter(None, ["a finite number", _range_text(low, high, low_open, high_open)]))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {allowed}, got {type(value).__name__} {value!r}")
    number = float(value)
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and (number >= high if high_open else number > high)
    if not math.isfinite(number) or too_low or too_high:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return number


def check_bool(name: str, value: Any) -> bool:
    """`value` if it is a bool (not 0/1 or a truthy object)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def check_native(name: str, value: Any) -> bool | None:
    """`value` if it is a native switch: True, False or None (not 0/1 or a string)."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(
            f"{name} must be True (native, or an error), False (the reference) or None "
            f"(native where it loads), got {type(value).__name__} {value!r}"
        )
    return value


def check_choice(name: str, value: Any, choices: Collection[Any]) -> Any:
    """`value` if it is one of `choices`; the error lists them."""
    try:
        ok = value in choices
    except TypeError:  # an unhashable value asked of a set
        ok = False
    if not ok:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(map(repr, choices))}")
    return value


def check_int_tensor(name: str, value: Any, *, dim: int | None = 1) -> torch.Tensor:
    """`value` if it is an int32/int64 tensor (of `dim` dimensions unless None)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 or int64, got {type(value).__name__}")
    if value.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {value.dtype}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(value.shape)}")
    return value

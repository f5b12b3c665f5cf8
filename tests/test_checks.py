"""embnb._checks: one policy, TypeError for a wrong type, ValueError for a wrong value."""

import math

import pytest
import torch

from embnb._checks import check_bool, check_choice, check_int, check_int_tensor, check_number


@pytest.mark.parametrize("value", [0, 1, 7, -3, 2**70])
def test_check_int_returns_ints_within_bounds_unchanged(value):
    assert check_int("n", value) == value
    assert check_int("n", value, low=value, high=value) == value


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, torch.tensor(1)])
def test_check_int_refuses_every_non_int_with_a_type_error(value):
    with pytest.raises(TypeError, match=f"n must be an int >= 1, got {type(value).__name__}"):
        check_int("n", value, low=1)


@pytest.mark.parametrize(
    "low, high, value, allowed",
    [(1, None, 0, "an int >= 1"), (None, 5, 6, "an int <= 5"), (2, 4, 5, "an int in \\[2, 4\\]")],
)
def test_check_int_names_the_bound_it_broke(low, high, value, allowed):
    with pytest.raises(ValueError, match=f"^n must be {allowed}, got {value}$"):
        check_int("n", value, low=low, high=high)


def test_check_number_accepts_ints_and_floats_and_refuses_bool_and_nan():
    assert check_number("x", 3) == 3.0 and isinstance(check_number("x", 3), float)
    assert check_number("x", 0.5, low=0, high=1, low_open=True, high_open=True) == 0.5
    with pytest.raises(TypeError, match="x must be a finite number, got bool True"):
        check_number("x", True)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="x must be a finite number"):
            check_number("x", bad)
    with pytest.raises(ValueError, match=r"x must be a finite number in \(0, 1\), got 0"):
        check_number("x", 0, low=0, high=1, low_open=True, high_open=True)
    with pytest.raises(ValueError, match=r"x must be a finite number > 0, got -1"):
        check_number("x", -1, low=0, low_open=True)


def test_check_choice_lists_what_is_allowed():
    assert check_choice("mode", "b", ("a", "b")) == "b"
    with pytest.raises(ValueError, match="mode 'c' is not one of 'a', 'b'"):
        check_choice("mode", "c", ("a", "b"))
    with pytest.raises(ValueError, match=r"mode \[1\] is not one of"):
        check_choice("mode", [1], {"a"})  # unhashable: still a ValueError


def test_check_bool_refuses_ints():
    assert check_bool("flag", False) is False
    with pytest.raises(TypeError, match="flag must be True or False, got int 1"):
        check_bool("flag", 1)


def test_check_int_tensor_checks_type_dtype_and_dim():
    keys = torch.arange(3, dtype=torch.int32)
    assert check_int_tensor("keys", keys) is keys
    with pytest.raises(TypeError, match="keys must be a torch.Tensor of int32 or int64, got list"):
        check_int_tensor("keys", [1, 2])
    with pytest.raises(TypeError, match="keys must be int32 or int64, got torch.float32"):
        check_int_tensor("keys", torch.zeros(2))
    with pytest.raises(ValueError, match=r"keys must be 1-D, got shape \(2, 2\)"):
        check_int_tensor("keys", torch.zeros(2, 2, dtype=torch.int64))
    assert check_int_tensor("keys", torch.zeros(2, 2, dtype=torch.int64), dim=None).shape == (2, 2)

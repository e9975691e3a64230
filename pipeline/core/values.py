"""Checks of option values, the one place of each (torch-free): a built-in part (a loss, a pool) and a
user's own plug-in call them on their options, and the training config on its fields.

``is_int`` / ``is_number`` say what a value is (a bool is neither: ``True`` is an int to Python,
never to an option); ``finite``, ``positive``, ``within``, ``finite_list`` and ``int_at_least``
return the checked value or raise one line naming the option (``ValueError`` unless told another
error class, e.g. ``VseError``)."""

from __future__ import annotations

import math
import numbers


def is_int(value) -> bool:
    """An integer (any ``numbers.Integral``: numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number (ints included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_int_at_least(value, low: int) -> bool:
    return is_int(value) and value >= low


def finite(value, name: str, *, error: type[Exception] = ValueError) -> float:
    """``value`` as a float; ``error`` unless it is a finite number."""
    if not is_number(value) or not math.isfinite(value):
        raise error(f"{name} must be a finite number, got {value!r}")
    return float(value)


def positive(value, name: str) -> float:
    """A finite number > 0, as a float."""
    value = finite(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def within(value, name: str, low=None, high=None) -> float:
    """A finite number in [low, high] (either bound may be None: open on that side), as a float."""
    value = finite(value, name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (f"in [{low:g}, {high:g}]" if low is not None and high is not None
                  else f">= {low:g}" if low is not None else f"<= {high:g}")
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return value


def finite_list(values, name: str, low=None, high=None) -> list[float]:
    """A list (or tuple) of finite numbers, each in [low, high] (``within``)."""
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{name} must be a list of numbers, got {values!r}")
    return [within(value, name, low, high) for value in values]


def int_at_least(value, name: str, low: int, *, or_none: bool = False):
    """An integer >= ``low`` (or None, with ``or_none``), returned as given."""
    if (or_none and value is None) or is_int_at_least(value, low):
        return value
    raise ValueError(f"{name} must be an integer >= {low}{' or null' if or_none else ''}, got {value!r}")

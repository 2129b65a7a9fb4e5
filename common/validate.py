"""Type and range checks of options, shared by the consumer's and the producer's configuration.

Each check returns the value in its plain type (an ``int`` for any integer, a ``float`` for any real number)
or raises an error that names the option, the value and what was expected:

* :class:`ConfigTypeError` (a ``ConfigError`` and a ``TypeError``) for a value of the wrong type;
* :class:`ConfigError` (a ``ValueError``) for a value of the right type out of range.

A ``bool`` is never taken for a number, although Python's ``True == 1``: ``batch_size=True`` is a mistake.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Callable, Iterable, TypeVar

from ferry.common.errors import ConfigError, ConfigTypeError

__all__ = ["integer", "number", "boolean", "text", "path", "choice", "optional"]

T = TypeVar("T")


def _range(low: float | None, high: float | None, low_open: bool = False) -> str:
    if low is not None and high is not None:
        return f"in {low:g}..{high:g}" if not low_open else f"> {low:g} and <= {high:g}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    return f"<= {high:g}" if high is not None else ""


def _expect(name: str, value: Any, expected: str) -> ConfigTypeError:
    return ConfigTypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")


def integer(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """An integer (``int`` or a numpy integer, never a bool) in ``low..high``."""
    bounds = _range(low, high)
    expected = f"an int {bounds}".rstrip()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _expect(name, value, expected)
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(f"{name} must be {expected}, got {value!r}")
    return value


def number(name: str, value: Any, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, finite: bool = True) -> float:
    """A real number (never a bool or a string); ``low_open``: strictly above ``low``."""
    bounds = _range(low, high, low_open)
    expected = f"a number {bounds}".rstrip()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _expect(name, value, expected)
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise ConfigError(f"{name} must be {expected}, got {value!r}")
    if high is not None and value > high:
        raise ConfigError(f"{name} must be {expected}, got {value!r}")
    return value


def boolean(name: str, value: Any) -> bool:
    """``True`` or ``False`` (a numpy bool too); ``1`` or ``"yes"`` are refused as ambiguous."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise _expect(name, value, "True or False")


def text(name: str, value: Any, *, nonempty: bool = True) -> str:
    if not isinstance(value, str):
        raise _expect(name, value, "a string")
    if nonempty and not value:
        raise ConfigError(f"{name} must not be empty")
    return value


def path(name: str, value: Any) -> str:
    """A file or folder name: a string or an ``os.PathLike``."""
    if not isinstance(value, (str, os.PathLike)):
        raise _expect(name, value, "a path (str or os.PathLike)")
    value = os.fspath(value)
    if not value:
        raise ConfigError(f"{name} must not be empty")
    return value


def choice(name: str, value: Any, choices: Iterable[T]) -> T:
    choices = tuple(choices)
    if not any(type(value) is type(c) and value == c for c in choices):
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def optional(check: Callable[..., T], name: str, value: Any, **bounds: Any) -> T | None:
    """``None``, or what ``check`` accepts."""
    return None if value is None else check(name, value, **bounds)

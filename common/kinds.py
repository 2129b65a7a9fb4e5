"""The kinds of option values: how each is checked in Python and written as a flag's or a variable's text.

A :class:`Kind` checks a value given in Python with :mod:`ferry.common.validate` (the error names the option,
the value and what was expected), reads the text of a command-line flag or of a ``FERRY_*`` variable, and writes
a value back as that text. :class:`ferry.common.settings.Setting` pairs a kind with a default and a doc.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Sequence

from ferry.common import compression as comp
from ferry.common import validate as check
from ferry.common.errors import ConfigError, ConfigTypeError, DatasetSpecError

__all__ = ["Kind", "Int", "Real", "Bool", "Choice", "Text", "Path", "Hook", "KeywordArgs", "Compression"]


class Kind:
    """Checks values of one type and turns them into text and back. The base takes any value as it is."""

    #: What a flag's or a variable's text must be, said in its error.
    expected = "a value"
    #: A flag that may repeat (argparse's ``append``), each occurrence one item: see :meth:`combine` and
    #: :meth:`items`, which a repeated kind implements.
    repeated = False

    def check(self, name: str, value: Any) -> Any:
        """``value`` in its plain type. Raises ConfigTypeError (a wrong type) or ConfigError, naming ``name``."""
        return value

    def parse(self, text: str) -> Any:
        """A variable's text as a value. Raises ValueError when it does not parse."""
        return text

    def format(self, value: Any) -> str:
        """The text that :meth:`parse` (or the flag) reads back as ``value``."""
        return str(value)

    def argparse(self) -> dict[str, Any]:
        """The ``add_argument`` keywords that read one flag's text."""
        return {}

    def combine(self, variable: Any, flags: list[str]) -> Any:
        """A repeated kind's value: its variable's (parsed, or None) and the texts of its flags."""
        raise NotImplementedError

    def items(self, value: Any) -> list[str]:
        """A repeated kind's flag texts that :meth:`combine` reads back as ``value``."""
        raise NotImplementedError


class Int(Kind):
    expected = "an integer"

    def __init__(self, low: int | None = None, high: int | None = None, *, expected: str = "") -> None:
        self.low, self.high = low, high
        self.expected = expected or self.expected

    def check(self, name: str, value: Any) -> int:
        return check.integer(name, value, low=self.low, high=self.high)

    def parse(self, text: str) -> int:
        return int(text)

    def argparse(self) -> dict[str, Any]:
        return {"type": int}


class Real(Kind):
    expected = "a number"

    def __init__(self, low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 finite: bool = True, expected: str = "") -> None:
        self.low, self.high, self.low_open, self.finite = low, high, low_open, finite
        self.expected = expected or self.expected

    def check(self, name: str, value: Any) -> float:
        return check.number(name, value, low=self.low, high=self.high, low_open=self.low_open, finite=self.finite)

    def parse(self, text: str) -> float:
        return float(text)

    def format(self, value: Any) -> str:
        return repr(float(value))  # reads back exactly

    def argparse(self) -> dict[str, Any]:
        return {"type": float}


class Bool(Kind):
    expected = "0 or 1"

    def check(self, name: str, value: Any) -> bool:
        return check.boolean(name, value)

    def parse(self, text: str) -> bool:
        if text not in ("0", "1"):
            raise ValueError(text)
        return text == "1"

    def format(self, value: Any) -> str:
        return "1" if value else "0"


class Choice(Kind):
    """One of ``choices``; with ``fold`` (``str.lower``, ``str.upper``) a flag or variable may use any case."""

    def __init__(self, choices: Sequence[str], *, fold: Callable[[str], str] | None = None) -> None:
        self.choices, self.fold = tuple(choices), fold
        self.expected = f"one of {', '.join(self.choices)}" + (" (any case)" if fold else "")

    def check(self, name: str, value: Any) -> Any:
        return check.choice(name, value, self.choices)

    def parse(self, text: str) -> str:
        text = self.fold(text) if self.fold else text
        if text not in self.choices:
            raise ValueError(text)
        return text

    def argparse(self) -> dict[str, Any]:
        return {"type": self.fold or str, "choices": self.choices}


class Text(Kind):
    def __init__(self, expected: str = "a string", *, nonempty: bool = True) -> None:
        self.expected, self.nonempty = expected, nonempty

    def check(self, name: str, value: Any) -> str:
        return check.text(name, value, nonempty=self.nonempty)


class Path(Kind):
    expected = "a file name"

    def check(self, name: str, value: Any) -> str:
        return check.path(name, value)


class Hook(Kind):
    """A function run on the producer: a callable (passed to a forked or spawned producer by pickle), or its
    ``package.module:callable`` spec, the only form a command line (and a producer started by spec) takes."""

    expected = "package.module:callable"

    def check(self, name: str, value: Any) -> Any:
        if callable(value):
            return value
        if not isinstance(value, str):
            raise ConfigTypeError(f"{name} must be a callable or a 'package.module:function' spec, got {value!r} "
                                  f"({type(value).__name__})")
        if ":" not in value:
            raise ConfigError(f"{name} must look like package.module:callable, got {value!r}")
        return value

    def format(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ConfigError(f"a command line takes a 'package.module:function' spec, not the callable {value!r}")
        return value


class KeywordArgs(Kind):
    """Keyword arguments (of a dataset spec, or of a hook): ``--FLAG KEY=VALUE`` repeated, VALUE parsed as JSON when
    it parses, else taken as a string; a JSON object in the variable."""

    expected, repeated = "a JSON object", True

    def __init__(self, what: str) -> None:
        self.what = what  # "dataset argument", "collate argument" ...: named in errors

    def check(self, name: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
            raise ConfigTypeError(f"{name} must be a dict of keyword arguments, got {value!r}")
        return dict(value)

    def parse(self, text: str) -> dict[str, Any]:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError(text)
        return value

    def combine(self, variable: Any, flags: list[str]) -> dict[str, Any]:
        """The flags add to (and override keys of) the variable.

        Raises:
            DatasetSpecError: a flag that is not KEY=VALUE.
        """
        return {**(variable or {}), **parse_keyword_args(flags, self.what)}

    def items(self, value: Any) -> list[str]:
        try:
            return [f"{key}={json.dumps(item)}" for key, item in value.items()]
        except (TypeError, ValueError) as exc:
            raise ConfigTypeError(f"{self.what}s on a command line must be JSON values ({exc}); a dataset spec's "
                                  "arguments travel to its producers that way") from None


def parse_keyword_args(pairs: Iterable[str], what: str = "dataset argument") -> dict[str, Any]:
    """Parse ``key=value`` strings; values are JSON when they parse, else plain strings.

    Raises:
        DatasetSpecError: a string that is not ``key=value``; the message names ``what`` it is.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise DatasetSpecError(f"{what} {pair!r} must look like key=value")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


class Compression(Kind):
    """``"auto"``, ``"lz4"``, ``"zstd"``, ``"none"`` or None; a codec named explicitly needs its library here."""

    expected = f"one of {', '.join(comp.MODES)}"

    def check(self, name: str, value: Any) -> Any:
        comp.require(comp.check_mode(name, value))  # a missing library: an error naming its package
        return value

    def parse(self, text: str) -> str:
        if text.lower() not in comp.MODES:
            raise ValueError(text)
        return text.lower()

    def argparse(self) -> dict[str, Any]:
        return {"type": str.lower, "choices": comp.MODES}

"""A RemoteLoader's options are read-only once it is built: the running threads would never see a change.

Each public option of the loader is an :class:`Option` attribute of its class: it reads the loader's resolved
options (``loader._options``, a frozen :class:`~ferry.consumer.options.resolve.LoaderOptions`), so nothing is
copied, and assigning or deleting it raises :class:`~ferry.common.errors.ConfigError` naming the option, instead
of silently doing nothing. Private attributes (a leading underscore) are the loader's running state.
"""

from __future__ import annotations

from typing import Any, Callable

from ferry.common.errors import ConfigError

__all__ = ["Option"]


class Option:
    """A read-only attribute: ``read(loader)``, by default the resolved option of the attribute's name."""

    def __init__(self, read: Callable[[Any], Any] | None = None) -> None:
        self._read = read
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.__doc__ = f"``{name}`` as resolved when the loader was built (read-only; see the class docstring)."

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return self._read(obj) if self._read is not None else getattr(obj._options, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        raise ConfigError(f"RemoteLoader.{self.name} cannot be changed after the loader is built (the running "
                          f"threads would never see it); build a new RemoteLoader with {self.name}={value!r}")

    def __delete__(self, obj: Any) -> None:
        raise ConfigError(f"RemoteLoader.{self.name} cannot be deleted")

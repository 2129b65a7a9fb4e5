"""A RemoteLoader's options are read-only once it is built: the running threads would never see a change.

:class:`ReadOnlyOptions` is the base class that enforces it. :meth:`ReadOnlyOptions._freeze` marks every
public attribute set so far; from then on assigning or deleting one raises
:class:`~ferry.common.errors.ConfigError` naming the option, instead of silently doing nothing. Private
attributes (a leading underscore) stay writable: they are the loader's running state.
"""

from __future__ import annotations

from typing import Any

from ferry.common.errors import ConfigError


class ReadOnlyOptions:
    """Public attributes set before :meth:`_freeze` cannot be assigned or deleted afterwards."""

    def _freeze(self) -> None:
        """From here on the options are read-only: assigning one would silently do nothing."""
        self._read_only = frozenset(name for name in vars(self) if not name.startswith("_"))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__.get("_read_only", ()):
            raise ConfigError(f"RemoteLoader.{name} cannot be changed after the loader is built (the running "
                              f"threads would never see it); build a new RemoteLoader with {name}={value!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self.__dict__.get("_read_only", ()):
            raise ConfigError(f"RemoteLoader.{name} cannot be deleted")
        object.__delattr__(self, name)

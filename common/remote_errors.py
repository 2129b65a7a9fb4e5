"""A sample's exception crosses the wire by name, without pickle, and comes back as its own type where it can
(docs/ARCHITECTURE.md#failure-handling).

The producer names the exception's class and its bases down to ``Exception``, most derived first, each as
``module:qualname`` (:func:`exception_classes`), in the optional ``exc_classes`` of a FAIL record. The
consumer (:func:`typed_remote_error`) raises the first class of that list it can rebuild, as a class made
for it once and cached: ``(Original, RemoteSampleError)``, which holds Ferry's message (the sample, the
producer, the remote traceback) and its attributes. ``except KeyError`` and ``except RemoteSampleError`` both
catch it, as DataLoader's ``ExceptionWrapper`` re-raises a worker's KeyError as a KeyError.

A class is rebuilt only when all of these hold; otherwise the next one of the list (a base) is tried, and
when none is left the error is a plain :class:`~ferry.common.errors.RemoteSampleError`, as before:

* its module is ``builtins`` or already imported here (``sys.modules``): a module that a peer names is never
  imported, and names are looked up in ``vars()`` only, never through a module's ``__getattr__``;
* it is an ``Exception`` (never ``KeyboardInterrupt`` or ``SystemExit``), not ``StopIteration`` (which would end
  the training loop quietly), and not a ``RemoteSampleError`` already;
* a subclass of it can be made, and its constructor accepts the message alone: a ``UnicodeDecodeError``
  (five arguments) comes back as a ``ValueError``, a class whose ``__init__`` needs a path and a code as its
  nearest base that does not.

``str()`` of a rebuilt error is Ferry's message whatever the class's own ``__str__`` would do (KeyError quotes
its argument); it pickles back to the same rebuilt class (by its list of names, not by pickling the class).
"""

from __future__ import annotations

import builtins
import re
import sys
import types
from typing import Any

from ferry.common.constants import MAX_CLASS_PATH, MAX_EXC_CLASSES
from ferry.common.errors import RemoteSampleError

__all__ = ["class_path", "exception_classes", "typed_remote_error"]

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PATH = re.compile(rf"({_NAME}(?:\.{_NAME})*):({_NAME}(?:\.{_NAME})*)")
#: Classes never rebuilt: raising them in the trainer would change its control flow, not report an error.
_NEVER = (StopIteration, StopAsyncIteration, RemoteSampleError)
#: A spawned process runs the training script as ``__mp_main__``; the trainer has it as ``__main__``.
_MODULE_ALIASES = {"__mp_main__": "__main__"}


def class_path(cls: type) -> str:
    """``module:qualname`` of a class: ``builtins:KeyError``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def exception_classes(exc: BaseException) -> list[str]:
    """The class of ``exc`` and its bases down to (not including) ``Exception``, most derived first, as
    ``module:qualname``: what a FAIL record's ``exc_classes`` carries."""
    names = []
    for cls in type(exc).__mro__:
        if cls in (Exception, BaseException, object) or len(names) == MAX_EXC_CLASSES:
            break
        path = class_path(cls)
        if len(path) <= MAX_CLASS_PATH:
            names.append(path)
    return names


def typed_remote_error(classes: list[str] | tuple[str, ...], **fields: Any) -> RemoteSampleError:
    """The error a sample's FAIL record raises: of the first class in ``classes`` that can be rebuilt (see the
    module docstring), else a plain RemoteSampleError. ``fields`` are RemoteSampleError's keywords."""
    fields["exc_classes"] = tuple(classes)
    for path in classes:
        cls = _loaded_class(path)
        if cls is None:
            continue
        error = _build(cls, fields)
        if error is not None:
            return error
    return RemoteSampleError(**fields)


def _loaded_class(path: str) -> type | None:
    """The exception class ``path`` names, if it is already loaded here and may be rebuilt; never imports."""
    match = _PATH.fullmatch(path) if isinstance(path, str) and len(path) <= MAX_CLASS_PATH else None
    if match is None:
        return None
    module_name, qualname = match.groups()
    module_name = _MODULE_ALIASES.get(module_name, module_name)
    module = builtins if module_name == "builtins" else sys.modules.get(module_name)
    if module is None:
        return None
    found: Any = module
    for part in qualname.split("."):
        try:
            found = vars(found).get(part)
        except TypeError:  # no __dict__
            return None
        if found is None:
            return None
    if not (isinstance(found, type) and issubclass(found, Exception)) or issubclass(found, _NEVER):
        return None
    return found


class _Rebuilt(RemoteSampleError):
    """The RemoteSampleError half of a rebuilt error. Its constructor is the original class's; this one only
    takes what that class's ``super().__init__(...)`` passes on, as ``Exception`` would."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        Exception.__init__(self, *args)

    def __str__(self) -> str:  # Ferry's message, whatever the original class's __str__ would make of it
        return self._ferry_text


#: original class -> the class made for it (None: it cannot be made); filled by the io thread, read anywhere
_MADE: dict[type, type | None] = {}


def _made_for(cls: type) -> type | None:
    if cls not in _MADE:
        try:
            made = types.new_class(cls.__name__, (cls, _Rebuilt), exec_body=lambda ns: ns.update({
                "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                "__str__": _Rebuilt.__str__, "__reduce__": _reduce,
            }))
        except Exception:  # layout or MRO conflicts, a metaclass or __init_subclass__ that refuses
            made = None
        _MADE.setdefault(cls, made)  # setdefault: one class per original, even if two threads raced here
    return _MADE[cls]


def _build(cls: type, fields: dict[str, Any]) -> RemoteSampleError | None:
    made = _made_for(cls)
    if made is None:
        return None
    context = RemoteSampleError(**fields)  # Ferry's attributes and message, as a plain error has them
    try:
        error = made.__new__(made, str(context))
        cls.__init__(error, str(context))  # the original constructor, with the message alone
        vars(error).update(vars(context))
    except Exception:  # its constructor needs more than a message, or refuses this one
        return None
    return error


def _reduce(self: RemoteSampleError) -> tuple[Any, ...]:
    return (_unpickle, (self.exc_classes, self.fields()))


def _unpickle(classes: tuple[str, ...], fields: dict[str, Any]) -> RemoteSampleError:
    return typed_remote_error(classes, **fields)

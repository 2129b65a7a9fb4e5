"""Batch types beyond plain dict / list / tuple: how their classes are named on the wire and rebuilt.

A batch tree may hold, besides plain containers and leaves (docs/ARCHITECTURE.md#batch-codec):

* **namedtuples** (``PackedSequence`` is one): their class's ``module:qualname`` and fields travel; the receiver
  uses its own class if it has it (:func:`namedtuple_class`; the training script's own, ``__main__``, also under the
  name a producer imported the script as: ``__mp_main__``, or ``train`` for ``--dataset train:Samples``), else a
  namedtuple made on the spot;
* **typed containers**: a dict, list or tuple subclass (what ``default_collate`` keeps), or a dataclass (a dict
  of its fields). The plain container travels with its class's name; the receiver rebuilds that class only if
  it is already imported there and has the same shape (:func:`typed_class`), else keeps the plain container;
* **registered types**: any class given to :func:`register_batch_type` on both sides: its ``to_tree(obj)``
  travels, and the receiver's ``from_tree(tree)`` (of the same registration name) rebuilds it after staging,
  with tensors in place of arrays (:class:`Registered` holds it until then).

Nothing is imported on a peer's word: a class is found in ``sys.modules`` only, through ``vars()`` (never a
module's ``__getattr__``). Nothing of a class's own code runs to rebuild it from a peer's tree: a namedtuple is
made with ``tuple.__new__``, a typed container with its builtin base's ``__new__`` and methods (a class whose
layout is not its base's own, OrderedDict say, only where listed in :data:`_BUILDERS`), a dataclass with
``object.__new__`` and its fields set one by one. Only a registered ``from_tree`` (the receiver's own
registration) runs user code.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import threading
from typing import Any, Callable

import numpy as np

from ferry.common.errors import ConfigError, ProtocolError

__all__ = [
    "MAX_CLASS_NAME", "class_name", "check_class_name", "find_class", "namedtuple_class", "typed_view",
    "typed_class", "rebuild", "BatchType", "Registered", "register_batch_type", "registered_type", "registration",
    "REGISTER_CALL",
]

#: The longest ``module:qualname`` a tree may name.
MAX_CLASS_NAME = 256
#: How the docs and error messages name the registration call.
REGISTER_CALL = "ferry.register_batch_type(cls, to_tree, from_tree)"
#: A spawned process runs the training script as ``__mp_main__``; the trainer has it as ``__main__``.
_MODULE_ALIASES = {"__mp_main__": "__main__"}
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not a builtin one


def class_name(cls: type) -> str:
    """``module:qualname`` of ``cls``, the training script's module named ``__main__`` on both sides."""
    module = _MODULE_ALIASES.get(cls.__module__, cls.__module__)
    return f"{module}:{cls.__qualname__}"


def check_class_name(name: Any, what: str, path: str) -> tuple[str, str]:
    """``(module, qualname)`` of a class name a tree gives for the ``what`` at ``path``.

    Raises:
        ProtocolError: not a str ``module:qualname`` of at most MAX_CLASS_NAME characters.
    """
    if not isinstance(name, str) or not 0 < len(name) <= MAX_CLASS_NAME or name.count(":") != 1:
        raise ProtocolError(f"{what} at {path} has a bad class name {name!r}")
    module, qualname = name.split(":")
    return _MODULE_ALIASES.get(module, module), qualname


def find_class(name: str, what: str = "class", path: str = "batch") -> type | None:
    """The class ``name`` (``module:qualname``) names, if its module is already imported here; never imports.

    Raises:
        ProtocolError: ``name`` is not of the form ``module:qualname`` or is too long.
    """
    module_name, qualname = check_class_name(name, what, path)
    found: Any = sys.modules.get(module_name) or _main_named(module_name)
    for part in qualname.split("."):
        if found is None or not part.isidentifier():
            return None
        try:
            found = vars(found).get(part)
        except TypeError:  # no __dict__
            return None
    return found if isinstance(found, type) else None


def _main_named(module_name: str) -> Any:
    """The training script's module (``__main__``) where ``module_name`` is the name a producer imported that script
    under (a producer started with ``--dataset train:Samples`` for ``python train.py`` has it as ``train``; ``python
    -m pkg.train`` as ``pkg.train``), so that the trainer's own class comes back, not a look-alike. Nothing is
    imported: only the script's own spec name, or the stem of its file for a script run by path."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return main if spec.name == module_name else None
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and "." not in module_name and os.path.splitext(os.path.basename(path))[0] == module_name:
        return main
    return None


_made_namedtuples: dict[tuple[str, tuple[str, ...]], type] = {}


def namedtuple_class(name: Any, fields: Any, count: int, path: str) -> type:
    """The namedtuple class a ``"n"`` node names: the receiver's own if its module is imported and its fields
    match, else one made with that name and those fields (cached; nothing is imported on a peer's word).

    Raises:
        ProtocolError: a bad name, or fields that are not ``count`` distinct public identifiers.
    """
    check_class_name(name, "namedtuple", path)
    if (not isinstance(fields, list) or len(fields) != count
            or not all(isinstance(f, str) and f.isidentifier() and not f.startswith("_") for f in fields)
            or len(set(fields)) != len(fields)):
        raise ProtocolError(f"namedtuple at {path} has bad fields {fields!r}")
    cls = find_class(name, "namedtuple", path)
    if cls is not None and issubclass(cls, tuple) and getattr(cls, "_fields", None) == tuple(fields):
        return cls
    key = (name, tuple(fields))
    if key not in _made_namedtuples:
        if len(_made_namedtuples) >= 256:  # a peer cannot grow this without bound
            _made_namedtuples.clear()
        short = name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        _made_namedtuples[key] = collections.namedtuple(short if short.isidentifier() else "Sample", fields)
    return _made_namedtuples[key]


# --- typed containers ------------------------------------------------------------------------------------------
#: Classes of the standard library whose layout is not their base's own (dict.update would bypass what they keep
#: beside it), rebuilt through their own constructor: trusted code of this interpreter, not a peer's choice.
_BUILDERS: dict[type, Callable[[Any], Any]] = {
    collections.OrderedDict: collections.OrderedDict,
    collections.defaultdict: lambda items: collections.defaultdict(None, items),
}


def typed_view(obj: Any) -> tuple[type | None, Any] | None:
    """``(class, plain container)`` for a dict / list / tuple subclass instance (not a namedtuple) or a dataclass
    instance (a dict of its fields), else None. The class is None where no receiver could rebuild it (a builtin
    subclass such as ``torch.Size``, see :func:`typed_class`): the plain container travels alone. Plain dicts,
    lists and tuples are not typed."""
    cls = type(obj)
    if isinstance(obj, (dict, list, tuple)):
        base = dict if isinstance(obj, dict) else list if isinstance(obj, list) else tuple
        return (cls if cls in _BUILDERS or _own_layout(cls, base) else None), base(obj)
    if hasattr(cls, "__dataclass_fields__") and not isinstance(obj, type):  # dataclasses.is_dataclass, cheaper
        return cls, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return None


def _own_layout(cls: type, base: type) -> bool:
    """Every class of ``cls``'s hierarchy is ``base``, ``object`` or made by a class statement: instances are
    ``base``'s own layout, so ``base``'s ``__new__`` and methods make a whole one."""
    return all(c in (base, object) or c.__flags__ & _HEAPTYPE for c in cls.__mro__)


def typed_class(name: str, inner: Any, path: str) -> type | None:
    """The class a ``"c"`` node names, if it is imported here and fits ``inner`` (the decoded plain container):
    a dict / list / tuple subclass of that container's kind, or a dataclass whose fields are ``inner``'s keys.
    None: keep ``inner`` as it is.

    Raises:
        ProtocolError: a malformed name.
    """
    cls = find_class(name, "typed container", path)
    if cls is None:
        return None
    base = type(inner)
    if cls in _BUILDERS:
        return cls if issubclass(cls, base) else None
    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
        return cls if base is dict and list(inner) == names and _own_layout(cls, object) else None
    if base is tuple and hasattr(cls, "_fields"):  # a namedtuple travels as "n", never as "c"
        return None
    return cls if issubclass(cls, base) and _own_layout(cls, base) else None


def rebuild(cls: type, inner: Any) -> Any:
    """An instance of ``cls`` (from :func:`typed_class`, or a producer's own class) holding ``inner``'s items
    (a dataclass: ``inner``'s values as its fields), made without running ``cls``'s own code."""
    builder = _BUILDERS.get(cls)
    if builder is not None:
        return builder(inner)
    if dataclasses.is_dataclass(cls):
        obj = object.__new__(cls)
        for key, value in inner.items():
            object.__setattr__(obj, key, value)
        return obj
    if issubclass(cls, dict):
        obj = dict.__new__(cls)
        dict.update(obj, inner)
        return obj
    if issubclass(cls, list):
        obj = list.__new__(cls)
        list.extend(obj, inner)
        return obj
    return tuple.__new__(cls, inner)


# --- registered types ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BatchType:
    """A registration: ``cls`` travels as ``to_tree(obj)`` under ``name`` and comes back as ``from_tree(tree)``."""

    cls: type
    name: str
    to_tree: Callable[[Any], Any]
    from_tree: Callable[[Any], Any]


class Registered:
    """A decoded registered-type node: its registration and its tree, rebuilt by ``from_tree`` once staging has
    made tensors of the tree's arrays (:func:`ferry.common.tree.map_tree`)."""

    __slots__ = ("entry", "tree")

    def __init__(self, entry: BatchType, tree: Any) -> None:
        self.entry, self.tree = entry, tree

    def __repr__(self) -> str:
        return f"Registered({self.entry.name})"


#: Classes the codec sends itself, which a registration must not take over.
_OWN_TYPES = frozenset([dict, list, tuple, object, type(None), bool, int, float, str, bytes, np.ndarray, np.str_,
                        np.bytes_])
_lock = threading.Lock()
_by_class: dict[type, BatchType] = {}
_by_name: dict[str, BatchType] = {}


def register_batch_type(cls: type, to_tree: Callable[[Any], Any], from_tree: Callable[[Any], Any], *,
                        name: str | None = None) -> None:
    """Let instances of ``cls`` travel in batches: a producer sends ``to_tree(obj)`` (a tree of dicts, lists,
    tuples, arrays or tensors, numbers and strings), and the training process gives the loop
    ``from_tree(tree)``, with tensors (on ``device``, where the loader has one) in place of the tree's arrays.

    Call it on both sides, with the same ``name`` (default ``module:qualname`` of ``cls``): in the module that
    defines ``cls`` is simplest, since producers import it for the collate_fn that makes such batches and the
    training script imports it to use them. Over the network this is the only way a class of your own travels
    (nothing is pickled); between a training script and its local producers an unregistered class is pickled,
    as DataLoader does. Registering the same class again replaces its functions.

    Raises:
        ConfigError: ``cls`` is not a class or one Ferry sends itself (dict, list, tuple, numbers, strings, numpy
            arrays, torch tensors), a function is not callable, or ``name`` is taken by another class or is not of
            the form ``module:qualname``.
    """
    if not isinstance(cls, type):
        raise ConfigError(f"register_batch_type: {cls!r} is not a class")
    if cls in _OWN_TYPES or (cls.__module__ == "torch" and cls.__name__ == "Tensor"):
        raise ConfigError(f"register_batch_type: Ferry sends {cls.__qualname__} itself; register a class of your own")
    for what, fn in (("to_tree", to_tree), ("from_tree", from_tree)):
        if not callable(fn):
            raise ConfigError(f"register_batch_type({cls.__qualname__}): {what} {fn!r} is not callable")
    name = class_name(cls) if name is None else name
    if not isinstance(name, str) or not 0 < len(name) <= MAX_CLASS_NAME or name.count(":") != 1:
        raise ConfigError(f"register_batch_type({cls.__qualname__}): name {name!r} is not 'module:qualname' "
                          f"of at most {MAX_CLASS_NAME} characters")
    with _lock:
        taken = _by_name.get(name)
        if taken is not None and taken.cls is not cls:
            raise ConfigError(f"register_batch_type({cls.__qualname__}): the name {name!r} is registered for "
                              f"{class_name(taken.cls)}")
        old = _by_class.pop(cls, None)
        if old is not None:
            _by_name.pop(old.name, None)
        entry = BatchType(cls, name, to_tree, from_tree)
        _by_class[cls], _by_name[name] = entry, entry


def registered_type(obj: Any) -> BatchType | None:
    """The registration of ``obj``'s exact class, or None."""
    return _by_class.get(type(obj)) if _by_class else None


def registration(name: str) -> BatchType | None:
    """The registration named ``name`` in this process, or None."""
    return _by_name.get(name)

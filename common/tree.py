"""The one walker of batch trees: nests of ``dict`` / ``list`` / ``tuple`` with anything else as leaves.

:func:`fold_tree` is the primitive (post-order: leaves first, then the container that holds them);
:func:`map_tree` rebuilds a tree with a function applied to its leaves, :func:`iter_leaves` lists them.
The codec's encoder, ``tree_signature`` and ``tree_nbytes`` (:mod:`ferry.common.codec`) are folds.

Besides plain containers and namedtuples a tree may hold the batch types of :mod:`ferry.common.batch_types`:
a *typed container* (a dict / list / tuple subclass, a dataclass) is a node of kind ``"c"`` over one child,
its plain container; a *registered type* is a node of kind ``"r"`` over one child, its ``to_tree``. Both keep
their parent's path, so a path still reads ``batch['x'][0]``.

Module-level recursion, not recursive closures: a closure that calls itself is a reference cycle, and it
would keep a batch's buffers (and shared-memory slot) alive until the garbage collector ran.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from ferry.common.batch_types import Registered, rebuild, registered_type, typed_view
from ferry.common.errors import BatchTypeError, ProtocolError

__all__ = ["fold_tree", "map_tree", "iter_leaves", "path_text"]

#: Leaf classes seen in almost every batch, which the walk need not examine further.
_PLAIN_LEAVES = frozenset([np.ndarray, str, bytes, int, float, bool, type(None)])

#: ``leaf(value, path)`` -> the leaf's result.
Leaf = Callable[[Any, Any], Any]
#: ``node(kind, keys, results, path)`` -> the container's result; ``kind`` is "d", "l", "t", "n", "c" or "r" (dict,
#: list, tuple, namedtuple, typed container, registered type), ``keys`` the dict's keys, the namedtuple's or typed
#: container's class, or the registration (:class:`~ferry.common.batch_types.BatchType`) of a registered type
#: (None for a list or a tuple), ``results`` its children's results in order (one for "c" and "r").
Node = Callable[[str, "list | None", list, Any], Any]


def fold_tree(tree: Any, leaf: Leaf, node: Node, path: str | None = None, max_depth: int | None = None,
              is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """Fold ``tree`` bottom-up through ``leaf`` and ``node``.

    ``path`` names the root (say ``"batch"``); each child's path is then passed as a ``(parent, key)`` pair,
    which :func:`path_text` turns into ``batch['x'][0]``. Without a root every path is None.

    ``is_leaf(container)`` may declare a dict, list or tuple a leaf (say, a list of collated strings).

    Raises:
        ProtocolError: the tree nests deeper than ``max_depth`` levels.
    """
    return _fold(tree, leaf, node, path, max_depth if max_depth is not None else -1, 0, is_leaf)


def _fold(tree: Any, leaf: Leaf, node: Node, path: Any, max_depth: int, depth: int,
          is_leaf: Callable[[Any], bool] | None = None) -> Any:
    if depth > max_depth >= 0:
        raise ProtocolError(f"{path_text(path) if path is not None else 'batch'} nests deeper than {max_depth} levels")
    cls = type(tree)
    if cls in _PLAIN_LEAVES:  # the common leaves, at once: no class of theirs is a container or registered
        return leaf(tree, path)
    if is_leaf is not None and isinstance(tree, (dict, list, tuple)) and is_leaf(tree):
        return leaf(tree, path)
    if cls is dict:
        keys = list(tree)
        if path is None:
            values = [_fold(tree[k], leaf, node, None, max_depth, depth + 1, is_leaf) for k in keys]
        else:
            values = [_fold(tree[k], leaf, node, (path, repr(k)), max_depth, depth + 1, is_leaf) for k in keys]
        return node("d", keys, values, path)
    if cls is list or cls is tuple:
        if path is None:
            values = [_fold(v, leaf, node, None, max_depth, depth + 1, is_leaf) for v in tree]
        else:
            values = [_fold(v, leaf, node, (path, i), max_depth, depth + 1, is_leaf) for i, v in enumerate(tree)]
        return node("l" if cls is list else "t", None, values, path)
    if cls is Registered:  # a decoded registered type, before staging rebuilt it
        return node("r", tree.entry, [_fold(tree.tree, leaf, node, path, max_depth, depth + 1, is_leaf)], path)
    entry = registered_type(tree)
    if entry is not None:
        inner = entry.to_tree(tree)
        return node("r", entry, [_fold(inner, leaf, node, path, max_depth, depth + 1, is_leaf)], path)
    if isinstance(tree, tuple) and hasattr(cls, "_fields"):  # a namedtuple keeps its class and fields
        if path is None:
            values = [_fold(v, leaf, node, None, max_depth, depth + 1, is_leaf) for v in tree]
        else:
            values = [_fold(v, leaf, node, (path, f), max_depth, depth + 1, is_leaf) for f, v in zip(cls._fields, tree)]
        return node("n", cls, values, path)
    typed = typed_view(tree)
    if typed is None:
        return leaf(tree, path)
    if typed[0] is None:  # a class no receiver could rebuild: its plain container
        return _fold(typed[1], leaf, node, path, max_depth, depth, is_leaf)
    return node("c", typed[0], [_fold(typed[1], leaf, node, path, max_depth, depth + 1, is_leaf)], path)


def path_text(path: Any) -> str:
    """The readable form of a path a fold passed: ``batch['x'][0]``. (A fold passes paths as cheap nested
    pairs and leaves formatting to the error message that needs one.)"""
    parts = []
    while isinstance(path, tuple):
        path, key = path
        parts.append(f"[{key}]")
    return str(path) + "".join(reversed(parts))


def _rebuild(kind: str, keys: list | None, values: list, path: str | None) -> Any:
    if kind == "d":
        return dict(zip(keys, values))  # type: ignore[arg-type]
    if kind == "n":  # tuple.__new__: the fields as they are, whatever the class's own __new__ checks
        return tuple.__new__(keys, values)  # type: ignore[arg-type]
    if kind == "c":
        return rebuild(keys, values[0])  # type: ignore[arg-type]
    if kind == "r":
        try:
            return keys.from_tree(values[0])  # type: ignore[union-attr]
        except Exception as exc:  # the user's code: this batch's error, not the staging thread's end
            raise BatchTypeError(f"from_tree of the registered type {keys.name!r} raised "  # type: ignore[union-attr]
                                 f"{type(exc).__name__}: {exc}") from exc
    return values if kind == "l" else tuple(values)


def map_tree(fn: Callable[[Any], Any], tree: Any) -> Any:
    """The same nest of dict / list / tuple (and namedtuples, typed containers, of the same classes), with
    ``fn(leaf)`` in place of every leaf; a registered type comes back as its ``from_tree`` of the mapped tree.

    Raises:
        BatchTypeError: a registered type's ``from_tree`` raised (the original is the cause).
    """
    return _fold(tree, lambda value, path: fn(value), _rebuild, None, -1, 0)


def iter_leaves(tree: Any) -> Iterator[Any]:
    """Every leaf of ``tree``, in order (dicts in key order)."""
    leaves: list[Any] = []
    _fold(tree, lambda value, path: leaves.append(value), _ignore, None, -1, 0)
    return iter(leaves)


def _ignore(kind: str, keys: list | None, values: list, path: str | None) -> None:
    return None

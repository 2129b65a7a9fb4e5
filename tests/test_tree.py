"""The one batch-tree walker: fold, map and leaves over dict / list / tuple, paths, depth bound."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from ferry.common.errors import ProtocolError
from ferry.common.tree import fold_tree, iter_leaves, map_tree, path_text

TREE = {"x": [1, (2, 3)], "y": {"z": 4}, 5: "s"}


def test_map_tree_keeps_containers_and_keys_and_maps_every_leaf():
    out = map_tree(lambda v: v * 10, TREE)
    assert out == {"x": [10, (20, 30)], "y": {"z": 40}, 5: "s" * 10}
    assert isinstance(out["x"], list) and isinstance(out["x"][1], tuple)
    assert list(out) == ["x", "y", 5]  # key order kept
    assert map_tree(str, 7) == "7"  # a bare leaf is a tree


def test_iter_leaves_in_order():
    assert list(iter_leaves(TREE)) == [1, 2, 3, 4, "s"]
    assert list(iter_leaves([])) == [] and list(iter_leaves({"a": {}})) == []


def test_fold_sees_kinds_keys_and_paths():
    seen = []

    def leaf(value, path):
        seen.append(path_text(path))
        return value

    def node(kind, keys, values, path):
        return (kind, keys, values)

    assert fold_tree({"a": [1, (2,)]}, leaf, node, "batch") == ("d", ["a"], [("l", None, [1, ("t", None, [2])])])
    assert seen == ["batch['a'][0]", "batch['a'][1][0]"]
    seen.clear()
    fold_tree({"a": [1]}, lambda v, p: seen.append(p), node)
    assert seen == [None]  # no root name: no paths at all


def test_is_leaf_stops_the_walk():
    strings = lambda n: isinstance(n, list) and all(isinstance(v, str) for v in n)  # noqa: E731
    out = fold_tree({"names": ["a", "b"], "n": [1]}, lambda v, p: ("leaf", v), lambda k, keys, vals, p: vals,
                    is_leaf=strings)
    assert out == [("leaf", ["a", "b"]), [("leaf", 1)]]


def test_depth_bound_names_the_path():
    deep = [1]
    for _ in range(5):
        deep = [deep]
    fold_tree(deep, lambda v, p: v, lambda *a: None, max_depth=6)
    with pytest.raises(ProtocolError, match=r"batch\[0\]\[0\]\[0\]\[0\]\[0\] nests deeper than 4 levels"):
        fold_tree(deep, lambda v, p: v, lambda *a: None, path="batch", max_depth=4)
    with pytest.raises(ProtocolError, match="^batch nests deeper than 4 levels"):
        fold_tree(deep, lambda v, p: v, lambda *a: None, max_depth=4)


def test_walking_keeps_no_reference_to_the_leaves():
    """No reference cycle: once the walk is done and its result dropped, a batch's buffers are freed at once."""
    array = np.zeros(1000)
    ref = weakref.ref(array)
    gc.disable()
    try:
        out = map_tree(lambda v: v, {"a": [array]})
        list(iter_leaves(out))
        del out, array
        assert ref() is None
    finally:
        gc.enable()

"""Producer collation gives default_collate's types, in numpy."""

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from ferry.producer.loading.collate import CollateError, collate
from tests.datasets import DictDataset

from .helpers import assert_tree_equal


def to_torch(tree):
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(tree)
    if isinstance(tree, dict):
        return {k: to_torch(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [to_torch(v) for v in tree]
    if isinstance(tree, tuple):
        values = [to_torch(v) for v in tree]
        return type(tree)(*values) if hasattr(type(tree), "_fields") else tuple(values)  # namedtuples stay
    return tree


@pytest.mark.parametrize(
    "samples",
    [
        [(np.ones(3, np.float32), 1), (np.zeros(3, np.float32), 2)],
        [[1.5, True], [2.5, False]],
        [np.float32(1.0), np.float32(2.0)],
        [np.int16(3), np.int16(4)],
        [{"a": [1, 2], "b": "x"}, {"a": [3, 4], "b": "y"}],
        [DictDataset()[i] for i in range(4)],
        [(np.ones((2, 2), np.uint8), (3, 4.0)), (np.zeros((2, 2), np.uint8), (5, 6.0))],
    ],
)
def test_matches_default_collate(samples):
    assert_tree_equal(to_torch(collate(samples)), default_collate(samples))


def test_tuple_samples_collate_into_a_list_like_default_collate():
    out = collate([(np.ones(2), 1), (np.ones(2), 2)])
    assert isinstance(out, list) and out[1].dtype == np.int64


def test_mismatched_shapes_name_the_item():
    with pytest.raises(CollateError, match=r"sample\[0\]: batch item 1"):
        collate([(np.ones(2), 1), (np.ones(3), 2)])


def test_none_cannot_be_collated():
    with pytest.raises(CollateError, match="NoneType"):
        collate([None, None])

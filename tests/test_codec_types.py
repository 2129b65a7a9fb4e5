"""Codec units for namedtuples and bfloat16: round trips, large (chunked) leaves, and hostile specs."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from ferry.common.codec import Chunked, decode_tree, encode_tree, tree_signature
from ferry.common.errors import ProtocolError
from ferry.consumer.core import Delivery
from ferry.consumer.staging.tensors import CpuStager

from .random_datasets import Point


def _stage(tree):
    delivery = Delivery(run=1, seq=0, tree=tree, nbytes=0)
    CpuStager(pin_memory=False).stage(delivery)
    return delivery.tree


def _round_trip(tree, chunk_bytes=None):
    spec, frames = encode_tree(tree, chunk_bytes=chunk_bytes)
    return decode_tree(spec, [bytearray(f) for f in frames])  # writable, as received frames are


def test_a_namedtuple_of_an_imported_class_comes_back_as_that_class():
    got = _round_trip(Point(np.arange(4, dtype=np.float32), np.int64(3)))
    assert type(got) is Point and got.image.tolist() == [0, 1, 2, 3] and int(got.label) == 3


def test_a_namedtuple_of_a_class_the_receiver_lacks_keeps_its_name_and_fields():
    spec = {"t": "n", "c": "not_imported_anywhere.models:Sample", "k": ["x", "y"], "v": [1, "a"]}
    got = decode_tree(spec, [])
    assert type(got).__name__ == "Sample" and got._fields == ("x", "y") and got == (1, "a")
    assert type(decode_tree(spec, [])) is type(got), "the made class is reused"


def test_a_class_whose_fields_differ_is_not_used():
    spec = {"t": "n", "c": f"{Point.__module__}:Point", "k": ["other", "names"], "v": [1, 2]}
    got = decode_tree(spec, [])
    assert type(got) is not Point and got._fields == ("other", "names")


@pytest.mark.parametrize("spec", [
    {"t": "n", "c": 3, "k": ["a"], "v": [1]},
    {"t": "n", "c": "no-colon", "k": ["a"], "v": [1]},
    {"t": "n", "c": "m:X", "k": ["a", "b"], "v": [1]},
    {"t": "n", "c": "m:X", "k": ["a", "a"], "v": [1, 2]},
    {"t": "n", "c": "m:X", "k": ["_private"], "v": [1]},
    {"t": "n", "c": "m:X", "k": ["not an identifier"], "v": [1]},
    {"t": "n", "c": "m:" + "X" * 300, "k": ["a"], "v": [1]},
    {"t": "a", "d": "<f4", "s": [1], "f": 0, "x": "bf16"},
    {"t": "a", "d": "<i2", "s": [1], "f": 0, "x": "float8"},
], ids=["name-type", "name-form", "count", "duplicate", "private", "identifier", "long", "bf16-dtype", "x-kind"])
def test_hostile_specs_are_refused(spec):
    frames = [np.zeros(1, np.float32).tobytes() if spec.get("d") == "<f4" else np.zeros(1, np.int16).tobytes()] \
        if spec["t"] == "a" else []
    with pytest.raises(ProtocolError):
        decode_tree(spec, frames)


@pytest.mark.parametrize("chunk_bytes", [None, 64], ids=["one-frame", "chunked"])
def test_bfloat16_round_trips_bit_exact(chunk_bytes):
    values = torch.linspace(-3, 3, 100).to(torch.bfloat16).reshape(4, 25)
    decoded = _round_trip([values], chunk_bytes=chunk_bytes)
    if chunk_bytes:
        assert isinstance(decoded[0], Chunked) and decoded[0].bfloat16
    staged = _stage(decoded)
    assert staged[0].dtype == torch.bfloat16 and torch.equal(staged[0], values)


def test_the_structure_check_tells_bfloat16_from_int16_and_namedtuple_from_tuple():
    bf = _round_trip(torch.zeros(2, dtype=torch.bfloat16))
    i16 = _round_trip(torch.zeros(2, dtype=torch.int16))
    assert tree_signature(bf, 2) != tree_signature(i16, 2)
    Other = collections.namedtuple("Other", ["image", "label"])
    a = _round_trip(Point(np.zeros(2), np.zeros(2)))
    b = _round_trip(Other(np.zeros(2), np.zeros(2)))
    c = _round_trip((np.zeros(2), np.zeros(2)))
    assert len({tree_signature(a, 2), tree_signature(b, 2), tree_signature(c, 2)}) == 3

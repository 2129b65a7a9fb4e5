"""The batch tree codec: round trips without copies, and strict validation of hostile specs."""

import msgpack
import numpy as np
import pytest
import torch

from ferry.common.codec import ALLOWED_DTYPES, decode_tree, encode_tree
from ferry.common.constants import MAX_TREE_DEPTH
from ferry.common.errors import ProtocolError


def roundtrip(tree):
    spec, frames = encode_tree(tree)
    spec = msgpack.unpackb(msgpack.packb(spec, use_bin_type=True), raw=False, strict_map_key=False)
    return decode_tree(spec, [bytearray(f) for f in frames])


def test_nested_tree_roundtrip_keeps_structure_dtypes_and_values():
    tree = {
        "x": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        "pair": (np.array([True, False]), [np.zeros(0, np.uint8), "s", None, 3, 2.5, b"raw"]),
        7: np.array(5, dtype=np.int16),
    }
    out = roundtrip(tree)
    assert list(out) == ["x", "pair", 7]
    assert out["x"].dtype == np.float32 and out["x"].shape == (2, 3, 4)
    np.testing.assert_array_equal(out["x"], tree["x"])
    assert isinstance(out["pair"], tuple) and isinstance(out["pair"][1], list)
    assert out["pair"][0].dtype == np.bool_
    assert out["pair"][1][0].shape == (0,)
    assert out["pair"][1][1:] == ["s", None, 3, 2.5, b"raw"]
    assert out[7].shape == () and out[7] == 5


def test_encode_is_zero_copy_and_decode_is_zero_copy():
    array = np.arange(1000, dtype=np.float64)
    spec, frames = encode_tree({"a": array})
    assert np.shares_memory(np.frombuffer(frames[0], dtype=np.uint8), array)
    buffer = bytearray(frames[0])
    out = decode_tree(spec, [buffer])
    out["a"][0] = 42.0  # writes through to the received buffer: no copy was made
    assert np.frombuffer(buffer, dtype=np.float64)[0] == 42.0


def test_torch_cpu_tensor_leaf_travels_as_its_bytes():
    out = roundtrip([torch.arange(6, dtype=torch.int32).reshape(2, 3)])
    assert out[0].dtype == np.int32 and out[0].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_non_contiguous_arrays_are_sent_correctly():
    array = np.arange(12, dtype=np.int64).reshape(3, 4).T
    np.testing.assert_array_equal(roundtrip(array), array)


@pytest.mark.parametrize("value", [np.array(["a"], dtype=object), np.array(["abc"]), {1.5: np.zeros(1)}])
def test_unencodable_values_raise_a_clear_error(value):
    with pytest.raises(ProtocolError):
        encode_tree(value)


def test_an_object_of_an_unregistered_class_names_its_class_and_the_registration_call():
    from ferry.common.errors import BatchTypeError

    class Opaque:
        pass

    with pytest.raises(BatchTypeError, match=r"Opaque \(tests.test_codec:test_.*Opaque\).*"
                                             r"ferry.register_batch_type\(cls, to_tree, from_tree\)"):
        encode_tree({"x": [Opaque()]})


def array_spec(dtype="<f4", shape=(2,), frame=0):
    return {"t": "a", "d": dtype, "s": list(shape), "f": frame}


@pytest.mark.parametrize(
    "spec, frames, reason",
    [
        (array_spec("|O"), [b"x" * 16], "not allowed"),
        (array_spec(">f4"), [b"x" * 8], "not allowed"),
        (array_spec("<f4", (3,)), [b"x" * 8], "!= frame"),
        (array_spec("<f4", (-2,)), [b"x" * 8], "bad dimension"),
        (array_spec("<f4", (1 << 60, 1 << 60)), [b"x" * 8], "!= frame"),
        (array_spec("<f4", (2,), 1), [b"x" * 8], "out of range"),
        ({"t": "l", "v": [array_spec(), array_spec()]}, [b"x" * 8], "referenced twice"),
        (array_spec(), [b"x" * 8, b"y"], "not referenced"),
        ({"t": "zz", "v": []}, [], "unknown node tag"),
        ({"t": "d", "k": ["a"], "v": []}, [], "mismatched keys"),
        ({"t": "d", "k": [[1]], "v": [1]}, [], "dict key"),
        ([1, 2], [], "unexpected list"),
        ({"t": "a", "d": "<f4", "s": "2", "f": 0}, [b"x" * 8], "bad shape"),
        ({"t": "a", "d": "<f4", "s": [True], "f": 0}, [b"x" * 4], "bad dimension"),
    ],
)
def test_decode_rejects_malformed_specs(spec, frames, reason):
    with pytest.raises(ProtocolError, match=reason):
        decode_tree(spec, frames)


def test_decode_bounds_depth_and_leaf_count():
    deep = 1
    for _ in range(MAX_TREE_DEPTH + 2):
        deep = {"t": "l", "v": [deep]}
    with pytest.raises(ProtocolError, match="deeper"):
        decode_tree(deep, [])
    with pytest.raises(ProtocolError, match="more than"):
        decode_tree({"t": "l", "v": [0] * 100_000}, [])


def test_allow_list_has_no_object_or_big_endian():
    assert "|O" not in ALLOWED_DTYPES and not any(d.startswith(">") for d in ALLOWED_DTYPES)


def test_large_leaves_travel_in_bounded_frames_and_reassemble():
    from ferry.common.codec import Chunked

    array = np.arange(10_000, dtype=np.float32).reshape(100, 100)
    spec, frames = encode_tree({"x": array, "y": np.arange(3)}, chunk_bytes=4096)
    assert len(frames) == 11 and all(len(f) <= 4096 for f in frames)
    out = decode_tree(spec, [bytearray(f) for f in frames])
    assert isinstance(out["x"], Chunked) and out["x"].nbytes == array.nbytes
    np.testing.assert_array_equal(out["x"].assemble_into(np.empty(array.nbytes, np.uint8)), array)
    np.testing.assert_array_equal(out["y"], np.arange(3))


@pytest.mark.parametrize("n, reason", [(0, "frame count"), (True, "frame count"), (99, "out of range")])
def test_chunk_counts_are_validated(n, reason):
    spec = {"t": "a", "d": "<f4", "s": [2], "f": 0, "n": n}
    with pytest.raises(ProtocolError, match=reason):
        decode_tree(spec, [b"x" * 4, b"y" * 4])


def test_chunked_sizes_must_add_up():
    spec = {"t": "a", "d": "<f4", "s": [3], "f": 0, "n": 2}
    with pytest.raises(ProtocolError, match="!= frame"):
        decode_tree(spec, [b"x" * 4, b"y" * 4])


def test_tree_signature_checks_sample_counts_and_ignores_trailing_shapes():
    from ferry.common.codec import tree_signature

    a = {"x": np.zeros((4, 3), np.float32), "names": ["a", "b", "c", "d"], "y": [np.zeros(4, np.int64)]}
    b = {"x": np.zeros((4, 7), np.float32), "names": ["e", "f", "g", "h"], "y": [np.ones(4, np.int64)]}
    assert tree_signature(a, 4) == tree_signature(b, 4)  # other trailing shapes: same dataset structure
    assert tree_signature(a, 4) != tree_signature({**a, "x": np.zeros((4, 3), np.float64)}, 4)
    with pytest.raises(ProtocolError, match="holds 4 samples, the task 5"):
        tree_signature(a, 5)
    with pytest.raises(ProtocolError, match="holds 3 strings"):
        tree_signature({"names": ["a", "b", "c"]}, 4)
    assert tree_signature(b"junk", 4) != tree_signature(a, 4)

"""The codec's bounds and corners, each at its exact edge: nesting depth, leaf and frame counts, byte
limits, chunk sizes, shared-memory slot leaves, and the helpers that measure a decoded batch."""

import msgpack
import numpy as np
import pytest
import torch

from ferry.common import compression, shm
from ferry.common.codec import Chunked, decode_tree, encode_tree, tree_nbytes, tree_signature
from ferry.common.constants import MAX_FRAMES, MAX_NDIM, MAX_TREE_DEPTH, MAX_TREE_LEAVES
from ferry.common.errors import BatchTypeError, ProtocolError

from . import batch_type_datasets as bt


def nested(levels: int, leaf=1):
    tree = leaf
    for _ in range(levels):
        tree = [tree]
    return tree


def through_msgpack(spec):
    return msgpack.unpackb(msgpack.packb(spec, use_bin_type=True), raw=False, strict_map_key=False)


@pytest.mark.parametrize("make", [lambda v: [v], lambda v: (v,), lambda v: {"k": v}], ids=["list", "tuple", "dict"])
def test_encode_accepts_the_deepest_allowed_tree_and_refuses_one_more_level(make):
    tree = 1
    for _ in range(MAX_TREE_DEPTH):
        tree = make(tree)
    spec, frames = encode_tree(tree)
    assert decode_tree(through_msgpack(spec), frames) == tree
    with pytest.raises(ProtocolError, match=f"deeper than {MAX_TREE_DEPTH}"):
        encode_tree(make(tree))


def test_decode_accepts_the_deepest_allowed_spec_and_refuses_one_more_level():
    spec = 1
    for _ in range(MAX_TREE_DEPTH):
        spec = {"t": "l", "v": [spec]}
    assert decode_tree(spec, []) == nested(MAX_TREE_DEPTH)
    with pytest.raises(ProtocolError, match="deeper"):
        decode_tree({"t": "l", "v": [spec]}, [])


def test_the_leaf_bound_counts_every_node():
    assert decode_tree({"t": "l", "v": [0] * (MAX_TREE_LEAVES - 1)}, []) == [0] * (MAX_TREE_LEAVES - 1)
    with pytest.raises(ProtocolError, match=f"more than {MAX_TREE_LEAVES} nodes"):
        decode_tree({"t": "l", "v": [0] * MAX_TREE_LEAVES}, [])


def test_the_frame_bound_is_exact_on_both_sides():
    arrays = [np.zeros(1, np.uint8) for _ in range(MAX_FRAMES)]
    spec, frames = encode_tree(arrays)
    assert len(frames) == MAX_FRAMES and len(decode_tree(spec, frames)) == MAX_FRAMES
    with pytest.raises(ProtocolError, match=f"more than {MAX_FRAMES}"):
        encode_tree(arrays + [np.zeros(1, np.uint8)])
    with pytest.raises(ProtocolError, match=f"more than {MAX_FRAMES}"):
        decode_tree(spec, frames + [b"x"])


def test_max_bytes_bounds_the_sum_of_the_frames():
    spec, frames = encode_tree([np.zeros(10, np.uint8), np.zeros(6, np.uint8)])
    assert len(decode_tree(spec, frames, max_bytes=16)) == 2
    with pytest.raises(ProtocolError, match="batch of 16 bytes exceeds the limit of 15 bytes"):
        decode_tree(spec, frames, max_bytes=15)


def test_an_array_of_exactly_chunk_bytes_travels_as_one_frame():
    spec, frames = encode_tree(np.zeros(4096, np.uint8), chunk_bytes=4096)
    assert len(frames) == 1 and "n" not in spec and spec["f"] == 0
    spec, frames = encode_tree([np.zeros(3, np.uint8), np.arange(4097, dtype=np.uint8)], chunk_bytes=4096)
    leaf = spec["v"][1]
    assert len(frames) == 3 and (leaf["f"], leaf["n"]) == (1, 2) and [len(f) for f in frames] == [3, 4096, 1]
    out = decode_tree(spec, frames)
    assert isinstance(out[1], Chunked) and out[1].nbytes == 4097 and out[1].shape == (4097,)
    np.testing.assert_array_equal(out[1].assemble_into(np.full(5000, 255, np.uint8)), np.arange(4097, dtype=np.uint8))


def test_the_last_frame_may_be_named_and_one_past_it_may_not():
    spec = {"t": "l", "v": [{"t": "a", "d": "|u1", "s": [1], "f": 0}, {"t": "a", "d": "|u1", "s": [2], "f": 1, "n": 2}]}
    out = decode_tree(spec, [b"a", b"b", b"c"])
    assert out[0].tolist() == [97] and out[1].nbytes == 2
    with pytest.raises(ProtocolError, match="out of range"):
        decode_tree({"t": "a", "d": "|u1", "s": [1], "f": -1}, [b"a"])


def test_shapes_have_a_bounded_rank_and_integer_dimensions():
    assert decode_tree({"t": "a", "d": "|u1", "s": [1] * MAX_NDIM, "f": 0}, [b"a"]).shape == (1,) * MAX_NDIM
    with pytest.raises(ProtocolError, match="bad shape"):
        decode_tree({"t": "a", "d": "|u1", "s": [1] * (MAX_NDIM + 1), "f": 0}, [b"a"])
    with pytest.raises(ProtocolError, match="bad dimension"):
        decode_tree({"t": "a", "d": "|u1", "s": [1.0], "f": 0}, [b"a"])
    with pytest.raises(ProtocolError, match="not allowed"):
        decode_tree({"t": "a", "d": 4, "s": [1], "f": 0}, [b"a"])
    out = decode_tree({"t": "a", "d": "<i4", "s": [2, 3], "f": 0}, [bytes(24)])
    assert out.shape == (2, 3) and out.dtype == np.int32


def test_containers_need_a_value_list_and_keep_their_kind():
    with pytest.raises(ProtocolError, match="no value list"):
        decode_tree({"t": "l", "v": "abc"}, [])
    with pytest.raises(ProtocolError, match="mismatched keys"):
        decode_tree({"t": "d", "k": "a", "v": [1]}, [])
    with pytest.raises(ProtocolError, match="dict key"):
        decode_tree({"t": "d", "k": [True], "v": [1]}, [])
    assert decode_tree({"t": "t", "v": [1, 2]}, []) == (1, 2)
    assert decode_tree({"t": "l", "v": [1, 2]}, []) == [1, 2]
    assert decode_tree({"t": "d", "k": ["a", 3], "v": [1, {"t": "t", "v": []}]}, []) == {"a": 1, 3: ()}


def test_encode_refuses_bool_keys_and_keeps_int_keys():
    with pytest.raises(ProtocolError, match="True"):
        encode_tree({True: 1})
    spec, _ = encode_tree({3: "x", "y": None})
    assert spec == {"t": "d", "k": [3, "y"], "v": ["x", None]}


def test_numpy_scalars_travel_as_zero_dimensional_arrays():
    spec, frames = encode_tree({"s": np.float32(1.5)})
    assert spec["v"][0]["t"] == "a" and spec["v"][0]["s"] == []
    out = decode_tree(through_msgpack(spec), frames)
    assert out["s"].shape == () and out["s"].dtype == np.float32 and out["s"] == 1.5


def test_every_allowed_dtype_round_trips():
    from ferry.common.codec import ALLOWED_DTYPES

    for dtype in sorted(ALLOWED_DTYPES):
        array = np.ones(3, dtype=np.dtype(dtype))
        spec, frames = encode_tree(array)
        assert spec["d"] == dtype
        np.testing.assert_array_equal(decode_tree(spec, frames), array)


# --- shared-memory slot leaves ---------------------------------------------------------------------------
def test_encode_places_arrays_in_a_slot_while_they_fit_and_sends_the_rest_as_frames():
    region = np.zeros(256, np.uint8)
    writer = shm.SlotWriter(region)
    tree = [np.arange(4, dtype=np.int32), np.zeros(0, np.float32), np.ones(300, np.uint8), np.arange(2, dtype=np.int64)]
    spec, frames = encode_tree(tree, slot=writer)
    first, empty, big, last = spec["v"]
    assert first["m"] == 0 and last["m"] == 64  # aligned, front to back
    assert "f" in empty and "f" in big and len(frames) == 2  # an empty array never takes room in the slot
    out = decode_tree(through_msgpack(spec), [bytes(f) for f in frames], region=region)
    for got, want in zip(out, tree):
        np.testing.assert_array_equal(got, want)
    assert np.shares_memory(out[0], region) and np.shares_memory(out[3], region)


@pytest.mark.parametrize("offset, count, ok", [(0, 4, True), (240, 4, True), (244, 4, False), (4, 64, False)])
def test_slot_leaves_must_lie_inside_the_region(offset, count, ok):
    region = np.arange(256, dtype=np.uint8)
    node = {"t": "a", "d": "<f4", "s": [count], "m": offset}
    if ok:
        out = decode_tree(node, [], region=region)
        assert out.shape == (count,) and np.shares_memory(out, region)
        assert out.view(np.uint8).tolist() == list(range(offset, offset + 4 * count))
    else:
        with pytest.raises(ProtocolError, match="overruns its slot of 256 bytes"):
            decode_tree(node, [], region=region)


def test_slot_offsets_must_be_aligned_to_the_dtype():
    region = np.zeros(64, np.uint8)
    assert decode_tree({"t": "a", "d": "|u1", "s": [1], "m": 3}, [], region=region).shape == (1,)
    with pytest.raises(ProtocolError, match="bad slot offset 3"):
        decode_tree({"t": "a", "d": "<i2", "s": [1], "m": 3}, [], region=region)
    with pytest.raises(ProtocolError, match="bad slot offset"):
        decode_tree({"t": "a", "d": "|u1", "s": [1], "m": "0"}, [], region=region)
    with pytest.raises(ProtocolError, match="bad dimension"):
        decode_tree({"t": "a", "d": "|u1", "s": [-1], "m": 0}, [], region=region)


# --- measuring a decoded batch ---------------------------------------------------------------------------
def test_tree_nbytes_adds_up_every_array_leaf():
    chunked = Chunked(np.dtype("<f4"), (2,), [b"abcd", b"efgh"])
    tree = {"a": np.zeros(3, np.int64), "b": [np.zeros(2, np.uint8), ("s", chunked)], "c": 5, "d": None}
    assert tree_nbytes(tree) == 24 + 2 + 8
    assert tree_nbytes("text") == 0 and tree_nbytes([]) == 0


def test_tree_signature_names_kinds_and_refuses_zero_dimensional_arrays():
    chunked = Chunked(np.dtype("<f4"), (2, 1), [b"abcd", b"efgh"])
    assert tree_signature((np.zeros(2, np.uint8), chunked), 2) == ("t", (("a", "|u1"), ("a", "<f4")))
    assert tree_signature([np.zeros(2, np.uint8)], 2) == ("l", (("a", "|u1"),))
    assert tree_signature([b"a", b"b"], 2) == ("s", "bytes") and tree_signature(["a", "b"], 2) == ("s", "str")
    assert tree_signature([], 2) == ("l", ()) and tree_signature(3, 2) == ("x", "int")
    with pytest.raises(ProtocolError, match=r"batch\['y'\] holds no samples, the task 2"):
        tree_signature({"y": np.array(1.0)}, 2)
    with pytest.raises(ProtocolError, match=r"batch\[0\] holds 2 samples, the task 3"):
        tree_signature([chunked], 3)


def test_errors_name_the_path_of_the_bad_node():
    spec = {"t": "d", "k": ["x"], "v": [{"t": "l", "v": [1, {"t": "zz", "v": []}]}]}
    with pytest.raises(ProtocolError, match=r"at batch\['x'\]\[1\]$"):
        decode_tree(spec, [])


def test_dict_nesting_counts_towards_the_depth_bound_on_decode():
    spec = 1
    for _ in range(MAX_TREE_DEPTH + 1):
        spec = {"t": "d", "k": ["k"], "v": [spec]}
    with pytest.raises(ProtocolError, match="deeper"):
        decode_tree(spec, [])


@pytest.mark.parametrize("index", [None, "0", 0.0])
def test_a_frame_number_that_is_not_an_int_is_refused(index):
    node = {"t": "a", "d": "|u1", "s": [1], "f": index}
    if index is None:
        del node["f"]
    with pytest.raises(ProtocolError, match="frame number"):
        decode_tree(node, [b"a"])


def test_torch_types_other_than_tensors_are_not_arrays():
    import torch

    spec, frames = encode_tree(torch.Size([2, 3]))  # a tuple whose type lives in the torch module
    assert spec == {"t": "t", "v": [2, 3]} and frames == []


def test_a_single_string_sample_has_a_signature():
    assert tree_signature(["a"], 1) == ("s", "str") and tree_signature([b"a"], 1) == ("s", "bytes")


class Checked(__import__("collections").namedtuple("Checked", ["x", "n"])):
    """A namedtuple whose own constructor refuses what it is sent (as PackedSequence's checks its fields)."""

    def __new__(cls, *args, **kwargs):
        raise AttributeError("Checked.__new__ ran on the receiver")


def test_a_namedtuple_is_rebuilt_without_running_the_class_s_own_constructor():
    sent = tuple.__new__(Checked, (np.arange(3, dtype=np.int32), 7))
    spec, frames = encode_tree(sent)
    got = decode_tree(spec, [bytes(f) for f in frames])
    assert type(got) is Checked and got.n == 7 and got.x.tolist() == [0, 1, 2]


def test_whatever_a_tree_provokes_while_decoding_is_a_protocol_error(monkeypatch):
    import ferry.common.decoder as codec

    def broken(*args):
        raise KeyError("a bug or a hostile tree")

    monkeypatch.setattr(codec, "namedtuple_class", broken)
    spec = {"t": "n", "c": "m:C", "k": ["a"], "v": [1]}
    with pytest.raises(ProtocolError, match="does not decode: KeyError"):
        decode_tree(spec, [])


def test_a_typed_containers_signature_is_its_class_over_its_plain_containers():
    signature = tree_signature(bt.CustomDict(a=np.zeros(2, np.float32)), 2)
    assert signature == ("c", "tests.batch_type_datasets:CustomDict", tree_signature({"a": np.zeros(2, np.float32)}, 2))
    assert tree_signature(bt.CustomDict(a=np.zeros(2, np.int64)), 2) != signature  # another dtype inside
    assert tree_signature({"a": np.zeros(2, np.float32)}, 2) != signature  # the plain dict is another structure


def test_a_sparse_tensor_is_refused_over_the_network_saying_how_to_send_it():
    with pytest.raises(BatchTypeError) as refused:
        encode_tree({"x": torch.eye(2).to_sparse()})
    assert str(refused.value) == (
        "a batch holds a sparse_coo tensor, which cannot travel to a consumer over the network (only strided tensors "
        "are bytes): convert it in the collate_fn (to_dense(), unbind()), or load with local producers")


@pytest.mark.parametrize("name", ["lz4", "zstd"])
def test_a_compressed_leaf_is_decoded_to_its_array(name):
    array = (np.arange(4000) % 7).astype(np.int32).reshape(-1, 4)
    raw = memoryview(array.reshape(-1).view(np.uint8))
    spec = {"t": "a", "d": array.dtype.str, "s": list(array.shape), "f": 0, "z": [[name, 0, len(raw)]]}
    got = decode_tree(spec, [compression.codec(name).compress(raw)], max_bytes=1 << 20)
    assert isinstance(got, np.ndarray) and got.dtype == array.dtype and np.array_equal(got, array)


def test_a_typed_container_of_two_trees_is_refused_as_a_typed_container():
    spec = {"t": "c", "c": "collections:OrderedDict", "v": [{"t": "l", "v": []}, {"t": "l", "v": []}]}
    with pytest.raises(ProtocolError, match=r"^typed container at batch holds 2 trees, not one$"):
        decode_tree(spec, [])

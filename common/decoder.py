"""Decoding a tree spec over received frames, validating everything a hostile peer controls (the grammar:
:mod:`ferry.common.codec`).

Decoding never copies array bytes: each array is ``np.frombuffer`` over its received frame (a leaf over several
frames is a :class:`~ferry.common.arrays.Chunked` the receiver assembles; compressed frames are decompressed here,
into one fresh array). Checked: tags, types, nesting depth, the number of nodes, dtypes (an allow-list, never
``object``), shapes (non-negative, bounded rank), that every array's ``prod(shape) * itemsize`` equals its frames'
length, and that every frame is used exactly once. Classes are found, never imported, and rebuilt without running
their code (:mod:`ferry.common.batch_types`); a pickled leaf is refused unless the caller allows it (a local
producer the consumer trusts).
"""

from __future__ import annotations

import pickle
import time
from typing import Any, Sequence

import numpy as np

from ferry.common.arrays import ALLOWED_DTYPES, SCALARS, Bfloat16Bits, Chunked
from ferry.common.batch_types import (
    REGISTER_CALL, Registered, check_class_name, namedtuple_class, rebuild, registration, typed_class,
)
from ferry.common.constants import MAX_FRAMES, MAX_NDIM, MAX_TREE_DEPTH, MAX_TREE_LEAVES
from ferry.common.errors import BatchTypeError, ProtocolError

__all__ = ["decode_tree"]

#: numpy's string scalars, as a "g" node names them
_NUMPY_STRINGS = {"str_": (np.str_, str), "bytes_": (np.bytes_, bytes)}


def decode_tree(spec: Any, frames: Sequence[Any], max_bytes: int | None = None, region: Any = None,
                compressed: list[int] | None = None, pickle_ok: bool = False) -> Any:
    """Decode a tree spec over received frames (buffers). Arrays are zero-copy views of the frames;
    a leaf that spans several frames comes back as :class:`Chunked`.

    ``max_bytes`` bounds the total length of the frames (the batch's array bytes). ``region`` is the
    task's shared-memory slot (a uint8 array), where ``"m"`` leaves are views; without one they are an error.
    ``compressed``, a list ``[wire, raw, seconds]``, is increased by the wire and raw bytes of compressed frames
    and the seconds spent decompressing them (wall time on the calling thread: the consumer's io thread, whose
    cost "auto" compression weighs). ``pickle_ok``: pickled leaves (``"p"``) are unpickled; without it they are
    refused.

    Raises:
        ProtocolError: the spec or the frames are malformed; the message says what and where.
        BatchTypeError: the tree holds a registered type that is not registered here; the message names it and
            the registration call.
    """
    if len(frames) > MAX_FRAMES:
        raise ProtocolError(f"{len(frames)} frames, more than {MAX_FRAMES}")
    total = sum(len(f) for f in frames)
    if max_bytes is not None:
        if total > max_bytes:
            raise ProtocolError(f"batch of {total} bytes exceeds the limit of {max_bytes} bytes")
    decoder = _Decoder(frames, region, max_bytes, pickle_ok)
    decoder.compressed = compressed
    try:
        tree = decoder.node(spec, 0, "batch")
    except (ProtocolError, BatchTypeError):
        raise
    except Exception as exc:  # anything else a hostile or broken tree provokes is still this batch's fault
        raise ProtocolError(f"batch tree does not decode: {type(exc).__name__}: {exc}") from None
    if not all(decoder.used):
        raise ProtocolError(f"{decoder.used.count(False)} frame(s) not referenced by the tree")
    return tree


class _Decoder:
    def __init__(self, frames: Sequence[Any], region: Any, max_bytes: int | None, pickle_ok: bool) -> None:
        self.frames, self.region, self.pickle_ok = frames, region, pickle_ok
        self.used = [False] * len(frames)
        self.leaves = 0
        self.max_bytes = max_bytes
        self.budget: Any = None  # the raw-size bound of compressed frames, made at the first one
        self.compressed: list[Any] | None = None  # [wire, raw, seconds] of compressed frames, counted if given

    def node(self, node: Any, depth: int, path: str) -> Any:
        if depth > MAX_TREE_DEPTH:
            raise ProtocolError(f"tree nests deeper than {MAX_TREE_DEPTH} at {path}")
        self.leaves += 1
        if self.leaves > MAX_TREE_LEAVES:
            raise ProtocolError(f"tree has more than {MAX_TREE_LEAVES} nodes")
        if isinstance(node, SCALARS):
            return node
        if not isinstance(node, dict):
            raise ProtocolError(f"unexpected {type(node).__name__} at {path}")
        tag = node.get("t")
        if tag == "a":
            return self._array(node, path)
        if tag == "g":
            kind, value = _NUMPY_STRINGS.get(node.get("d"), (None, None)), node.get("v")
            if kind[0] is None or not isinstance(value, kind[1]):
                raise ProtocolError(f"bad numpy string {node.get('d')!r} at {path}")
            return kind[0](value)
        if tag == "p":
            return self._pickled(node, path)
        values = node.get("v")
        if not isinstance(values, list):
            raise ProtocolError(f"container at {path} has no value list")
        if tag == "d":
            keys = node.get("k")
            if not isinstance(keys, list) or len(keys) != len(values):
                raise ProtocolError(f"dict at {path} has mismatched keys")
            out = {}
            for key, value in zip(keys, values):
                if not isinstance(key, (str, int)) or isinstance(key, bool):
                    raise ProtocolError(f"dict key of type {type(key).__name__} at {path}")
                out[key] = self.node(value, depth + 1, f"{path}[{key!r}]")
            return out
        if tag in ("l", "t"):
            items = [self.node(v, depth + 1, f"{path}[{i}]") for i, v in enumerate(values)]
            return items if tag == "l" else tuple(items)
        if tag == "n":
            cls = namedtuple_class(node.get("c"), node.get("k"), len(values), path)
            items = [self.node(v, depth + 1, f"{path}.{f}") for f, v in zip(cls._fields, values)]
            # tuple.__new__, not cls(...): a class's own __new__ (PackedSequence's checks its fields) is code a
            # peer would choose to run here; the fields are set as they were sent
            return tuple.__new__(cls, items)
        if tag in ("c", "r"):
            return self._typed(tag, node.get("c"), values, depth, path)
        raise ProtocolError(f"unknown node tag {tag!r} at {path}")

    def _typed(self, tag: str, name: Any, values: list, depth: int, path: str) -> Any:
        """A typed container (``"c"``: its class if it is here and fits, else the plain container) or a
        registered type (``"r"``: held for ``from_tree`` after staging)."""
        what = "typed container" if tag == "c" else "registered type"
        check_class_name(name, what, path)
        if len(values) != 1:
            raise ProtocolError(f"{what} at {path} holds {len(values)} trees, not one")
        if tag == "r":
            entry = registration(name)
            if entry is None:
                raise BatchTypeError(
                    f"a batch holds the registered type {name!r}, which is not registered in this process: call "
                    f"{REGISTER_CALL} here too, with the class and functions the producer registered")
            return Registered(entry, self.node(values[0], depth + 1, path))
        inner = self.node(values[0], depth + 1, path)
        if type(inner) not in (dict, list, tuple):
            raise ProtocolError(f"typed container at {path} holds a {type(inner).__name__}, not a dict/list/tuple")
        cls = typed_class(name, inner, path)
        return inner if cls is None else rebuild(cls, inner)

    def _array(self, node: dict, path: str) -> Any:
        if "z" in node:  # compressed frames (common/compression.py); never in a shared-memory slot
            array = self._compressed(node, path)
        elif "m" in node:
            array = _decode_slot_array(node, self.region, path)
        else:
            array = _decode_array(node, self.frames, self.used, path)
        if "x" in node:
            if node["x"] != "bf16" or node.get("d") != "<i2":
                raise ProtocolError(f"bad element type {node['x']!r} (dtype {node.get('d')!r}) at {path}")
            if isinstance(array, Chunked):
                array.bfloat16 = True
                return array
            return array.view(Bfloat16Bits)
        return array

    def _pickled(self, node: dict, path: str) -> Any:
        if not self.pickle_ok:
            raise ProtocolError(f"a pickled value at {path}: only the consumer's local producers may send one "
                                f"(an ipc link of the same user); a producer over the network must register the "
                                f"class ({REGISTER_CALL})")
        index, _ = _frame_range({"f": node.get("f")}, self.frames, self.used, path)
        return pickle.loads(self.frames[index])

    def _compressed(self, node: dict, path: str) -> Any:
        from ferry.common.compression import Budget, decode_leaf

        if "m" in node:
            raise ProtocolError(f"array at {path} is both compressed and in a shared-memory slot")
        np_dtype, shape, _ = _dtype_and_shape(node, path)
        index, count = _frame_range(node, self.frames, self.used, path)
        if self.budget is None:
            self.budget = Budget(self.max_bytes, used=sum(len(f) for f in self.frames))
        leaf = decode_leaf(np_dtype, tuple(shape), self.frames[index : index + count], node["z"], path, self.budget)
        # decompressed here, on the io thread: a stream that lies fails as this producer's ProtocolError (its
        # task re-issued, the producer rejected) instead of failing later in staging, where the batch is out
        # of the reorder buffer and could not be re-issued. The time it takes is counted: "auto" keeps a codec
        # only while the io thread decompresses faster than the link delivered without it.
        began = time.perf_counter()
        array = leaf.assemble_into(np.empty(leaf.nbytes, np.uint8))
        if self.compressed is not None:
            self.compressed[0] += leaf.wire_nbytes
            self.compressed[1] += leaf.raw_compressed
            self.compressed[2] += time.perf_counter() - began
        return array


def _dtype_and_shape(node: dict, path: str) -> tuple[np.dtype, list[int], int]:
    dtype, shape = node.get("d"), node.get("s")
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise ProtocolError(f"dtype {dtype!r} at {path} is not allowed")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise ProtocolError(f"bad shape at {path}")
    elements = 1
    for dim in shape:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise ProtocolError(f"bad dimension {dim!r} in shape at {path}")
        elements *= dim
    return np.dtype(dtype), shape, elements


def _decode_slot_array(node: dict, region: Any, path: str) -> np.ndarray:
    np_dtype, shape, elements = _dtype_and_shape(node, path)
    if region is None:
        raise ProtocolError(f"array at {path} names a shared-memory slot, but this task has none")
    offset, nbytes = node["m"], elements * np_dtype.itemsize
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or offset % np_dtype.itemsize:
        raise ProtocolError(f"bad slot offset {offset!r} at {path}")
    if offset + nbytes > len(region):
        raise ProtocolError(f"array at {path} ({nbytes} bytes at {offset}) overruns its slot of {len(region)} bytes")
    return region[offset : offset + nbytes].view(np_dtype).reshape(shape)


def _frame_range(node: dict, frames: Sequence[Any], used: list[bool], path: str) -> tuple[int, int]:
    """The first frame and the frame count of an array leaf, checked and marked used."""
    index, count = node.get("f"), node.get("n", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ProtocolError(f"bad frame count {count!r} at {path}")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= len(frames) - count:
        raise ProtocolError(f"frame number {index!r} (x{count}) at {path} out of range (have {len(frames)})")
    if any(used[index : index + count]):
        raise ProtocolError(f"frame {index} referenced twice (at {path})")
    used[index : index + count] = [True] * count
    return index, count


def _decode_array(node: dict, frames: Sequence[Any], used: list[bool], path: str) -> np.ndarray | Chunked:
    np_dtype, shape, elements = _dtype_and_shape(node, path)
    index, count = _frame_range(node, frames, used, path)
    buffers = frames[index : index + count]
    length = sum(len(b) for b in buffers)
    if elements * np_dtype.itemsize != length:
        raise ProtocolError(f"array at {path}: shape {shape} x {np_dtype.itemsize} bytes != frame length {length}")
    if count > 1:
        return Chunked(np_dtype, tuple(shape), list(buffers))
    return np.frombuffer(buffers[0], dtype=np_dtype, count=elements).reshape(shape)

"""The batch tree codec: a nest of dict / list / tuple with array and scalar leaves <-> header + frames.

A batch travels as one msgpack header (the *tree spec*) plus one raw frame per array leaf. Encoding never
copies array bytes: each frame is the array's own buffer (C-contiguous). Decoding never copies either:
each array is ``np.frombuffer`` over its received frame. There is no pickle anywhere.

Tree spec grammar (what msgpack carries):

* ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes`` -- a scalar leaf, stored as itself;
* ``{"t": "a", "d": "<f4", "s": [2, 3], "f": 0}`` -- an array leaf: dtype, shape, frame number;
  a large leaf adds ``"n": k``: its bytes are the k consecutive frames from ``f`` (the bound a consumer announces: ``frame_bytes``);
* ``{"t": "a", "d": "<f4", "s": [2, 3], "m": 4096}`` -- an array leaf in the task's shared-memory slot, at
  that byte offset (local producers only; see :mod:`ferry.common.shm`);
* ``{"t": "d", "k": [keys], "v": [specs]}`` -- a dict (keys are str or int);
* ``{"t": "l", "v": [specs]}`` / ``{"t": "t", "v": [specs]}`` -- a list / a tuple;
* ``{"t": "n", "c": "module:QualName", "k": [fields], "v": [specs]}`` -- a namedtuple. The receiver uses
  that class if its module is already imported there and its fields match, else a namedtuple class of the
  same name and fields made on the spot (nothing is ever imported on a peer's word);
* an array leaf with ``"z": [entry per frame]`` has compressed frames: each entry ``None`` (raw) or
  ``[codec, shuffle, raw_nbytes]``; validated and bounded before anything is allocated, then decompressed
  into one fresh array (see :mod:`ferry.common.compression`);
* an array leaf with ``"x": "bf16"`` holds bfloat16 values as their int16 bits (numpy has no bfloat16);
  it decodes to a :class:`Bfloat16Bits` array, which the consumer's staging views as ``torch.bfloat16``.

``decode`` validates everything a hostile peer controls: tags, types, nesting depth, the number of
leaves, dtypes (an allow-list, never ``object``), shapes (non-negative, bounded rank) and that every
array's ``prod(shape) * itemsize`` equals its frame's length, with every frame used exactly once.
"""

from __future__ import annotations

import collections
import sys
import time
from typing import Any, Sequence

import numpy as np

from ferry.common.constants import MAX_FRAMES, MAX_NDIM, MAX_TREE_DEPTH, MAX_TREE_LEAVES
from ferry.common.errors import ProtocolError
from ferry.common.tree import fold_tree, path_text

__all__ = ["encode_tree", "decode_tree", "ALLOWED_DTYPES", "tree_nbytes", "tree_signature", "Chunked", "Bfloat16Bits"]

#: dtypes allowed on the wire, as numpy ``dtype.str`` (little-endian or byte-order free).
ALLOWED_DTYPES = frozenset(
    ["|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16"]
)
_SCALARS = (type(None), bool, int, float, str, bytes)
_MAX_CLASS_NAME = 256


class Bfloat16Bits(np.ndarray):
    """The int16 bits of a bfloat16 array (a zero-copy view): what a bfloat16 leaf decodes to."""

    bfloat16 = True


def as_array(value: Any) -> np.ndarray | None:
    """Return ``value`` as a numpy array if it is an array-like leaf (numpy array or scalar, torch CPU tensor)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    if type(value).__module__ == "torch" and type(value).__name__ == "Tensor":
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":  # numpy has no bfloat16: its bits, marked
            import torch

            return value.view(torch.int16).numpy().view(Bfloat16Bits)
        return value.numpy()  # a CPU tensor shares its memory; no copy
    return None


class Chunked:
    """A decoded array leaf that arrived in several frames: the receiver assembles it (one copy into a
    buffer of its choice, e.g. a reused host buffer or a pinned staging buffer)."""

    __slots__ = ("dtype", "shape", "chunks", "nbytes", "bfloat16")

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...], chunks: list[Any]) -> None:
        self.dtype, self.shape, self.chunks = dtype, shape, chunks
        self.bfloat16 = False  # its int16 bits are bfloat16 values (see Bfloat16Bits)
        self.nbytes = sum(len(c) for c in chunks)

    def assemble_into(self, out: np.ndarray) -> np.ndarray:
        """Copy the chunks into ``out`` (a uint8 buffer of at least nbytes); return the typed view."""
        flat = out[: self.nbytes]
        offset = 0
        for chunk in self.chunks:
            n = len(chunk)
            flat[offset : offset + n] = np.frombuffer(chunk, dtype=np.uint8)
            offset += n
        return flat.view(self.dtype).reshape(self.shape)


def encode_tree(tree: Any, chunk_bytes: int | None = None, slot: Any = None) -> tuple[Any, list[memoryview]]:
    """Encode a batch tree. Returns ``(spec, frames)``; frames are zero-copy views of the arrays.

    With ``chunk_bytes``, an array larger than that travels as consecutive frames of that size.
    With ``slot`` (a :class:`ferry.common.shm.SlotWriter`), arrays go into the shared-memory slot while they fit
    (an array already written there is only referenced), and travel as frames after that.
    """
    encoder = _Encoder(chunk_bytes, slot)
    spec = fold_tree(tree, encoder.leaf, encoder.container, max_depth=MAX_TREE_DEPTH)
    if len(encoder.frames) > MAX_FRAMES:
        raise ProtocolError(f"batch has {len(encoder.frames)} arrays, more than {MAX_FRAMES}")
    return spec, encoder.frames


# The walker of a batch is ferry.common.tree's fold; the decoder walks the wire's tree spec instead. Neither
# is a recursive closure: a closure that calls itself is a reference cycle, and it would keep a batch's
# buffers (and shared-memory slot) alive until the garbage collector ran.
class _Encoder:
    def __init__(self, chunk_bytes: int | None, slot: Any) -> None:
        self.chunk_bytes, self.slot = chunk_bytes, slot
        self.frames: list[memoryview] = []

    def leaf(self, node: Any, path: None) -> Any:
        array = as_array(node)
        if array is not None:
            return self.array(array)
        if isinstance(node, _SCALARS):
            return node
        raise ProtocolError(f"cannot encode a leaf of type {type(node).__name__}")

    @staticmethod
    def container(kind: str, keys: Any, values: list, path: None) -> dict[str, Any]:
        if keys is None:
            return {"t": kind, "v": values}
        if kind == "n":
            return {"t": "n", "c": f"{keys.__module__}:{keys.__qualname__}", "k": list(keys._fields), "v": values}
        for key in keys:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise ProtocolError(f"dict key {key!r} is not a str or int")
        return {"t": kind, "k": keys, "v": values}

    def array(self, array: np.ndarray) -> dict[str, Any]:
        if array.dtype.str not in ALLOWED_DTYPES:
            raise ProtocolError(f"dtype {array.dtype} cannot travel (allowed: {sorted(ALLOWED_DTYPES)})")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        spec = {"t": "a", "d": array.dtype.str, "s": list(array.shape)}
        if isinstance(array, Bfloat16Bits):
            spec["x"] = "bf16"
        if self.slot is not None and array.nbytes:
            offset = self.slot.place(array)
            if offset is not None:
                return {**spec, "m": offset}
        raw = memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")
        step, frames = self.chunk_bytes, self.frames
        if step and len(raw) > step:
            first = len(frames)
            frames.extend(raw[i : i + step] for i in range(0, len(raw), step))
            return {**spec, "f": first, "n": len(frames) - first}
        frames.append(raw)
        return {**spec, "f": len(frames) - 1}


def decode_tree(spec: Any, frames: Sequence[Any], max_bytes: int | None = None, region: Any = None,
                compressed: list[int] | None = None) -> Any:
    """Decode a tree spec over received frames (buffers). Arrays are zero-copy views of the frames;
    a leaf that spans several frames comes back as :class:`Chunked`.

    ``max_bytes`` bounds the total length of the frames (the batch's array bytes). ``region`` is the
    task's shared-memory slot (a uint8 array), where ``"m"`` leaves are views; without one they are an error.
    ``compressed``, a list ``[wire, raw, seconds]``, is increased by the wire and raw bytes of compressed frames
    and the seconds spent decompressing them (wall time on the calling thread: the consumer's io thread, whose
    cost "auto" compression weighs).

    Raises:
        ProtocolError: the spec or the frames are malformed; the message says what and where.
    """
    if len(frames) > MAX_FRAMES:
        raise ProtocolError(f"{len(frames)} frames, more than {MAX_FRAMES}")
    total = sum(len(f) for f in frames)
    if max_bytes is not None:
        if total > max_bytes:
            raise ProtocolError(f"batch of {total} bytes exceeds the limit of {max_bytes} bytes")
    decoder = _Decoder(frames, region, max_bytes)
    decoder.compressed = compressed
    try:
        tree = decoder.node(spec, 0, "batch")
    except ProtocolError:
        raise
    except Exception as exc:  # anything else a hostile or broken tree provokes is still this batch's fault
        raise ProtocolError(f"batch tree does not decode: {type(exc).__name__}: {exc}") from None
    if not all(decoder.used):
        raise ProtocolError(f"{decoder.used.count(False)} frame(s) not referenced by the tree")
    return tree


class _Decoder:
    def __init__(self, frames: Sequence[Any], region: Any, max_bytes: int | None = None) -> None:
        self.frames, self.region = frames, region
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
        if isinstance(node, _SCALARS):
            return node
        if not isinstance(node, dict):
            raise ProtocolError(f"unexpected {type(node).__name__} at {path}")
        tag = node.get("t")
        if tag == "a":
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
            cls = _namedtuple_class(node.get("c"), node.get("k"), len(values), path)
            items = [self.node(v, depth + 1, f"{path}.{f}") for f, v in zip(cls._fields, values)]
            # tuple.__new__, not cls(...): a class's own __new__ (PackedSequence's checks its fields) is code a
            # peer would choose to run here; the fields are set as they were sent
            return tuple.__new__(cls, items)
        raise ProtocolError(f"unknown node tag {tag!r} at {path}")

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


_made_classes: dict[tuple[str, tuple[str, ...]], type] = {}


def _namedtuple_class(name: Any, fields: Any, count: int, path: str) -> type:
    """The namedtuple class a ``"n"`` node names: the receiver's own if its module is imported and its fields
    match, else one made with that name and those fields (cached; nothing is imported on a peer's word)."""
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_CLASS_NAME or name.count(":") != 1:
        raise ProtocolError(f"namedtuple at {path} has a bad class name {name!r}")
    if (not isinstance(fields, list) or len(fields) != count
            or not all(isinstance(f, str) and f.isidentifier() and not f.startswith("_") for f in fields)
            or len(set(fields)) != len(fields)):
        raise ProtocolError(f"namedtuple at {path} has bad fields {fields!r}")
    module_name, qualname = name.split(":")
    module = sys.modules.get("__main__" if module_name == "__mp_main__" else module_name)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None and part.isidentifier() else None
    if isinstance(obj, type) and issubclass(obj, tuple) and getattr(obj, "_fields", None) == tuple(fields):
        return obj
    key = (name, tuple(fields))
    if key not in _made_classes:
        if len(_made_classes) >= 256:  # a peer cannot grow this without bound
            _made_classes.clear()
        short = qualname.rsplit(".", 1)[-1]
        _made_classes[key] = collections.namedtuple(short if short.isidentifier() else "Sample", fields)
    return _made_classes[key]


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


def tree_signature(tree: Any, count: int, path: str = "batch") -> Any:
    """The structure of a decoded batch, checked against the number of samples it should hold.

    Returns a hashable description (containers, keys, dtypes; not shapes, which may differ between batches)
    that must be the same for every batch of a dataset.

    Raises:
        ProtocolError: an array's leading dimension, or a list of strings' length, is not ``count``.
    """

    def leaf(node: Any, where: Any) -> Any:
        if isinstance(node, (np.ndarray, Chunked)):
            if len(node.shape) == 0 or node.shape[0] != count:
                raise ProtocolError(f"{path_text(where)} holds {node.shape[0] if node.shape else 'no'} samples, "
                                    f"the task {count}")
            return ("a", "bf16" if getattr(node, "bfloat16", False) else node.dtype.str)
        if isinstance(node, (list, tuple)):  # collated strings: one per sample
            if len(node) != count:
                raise ProtocolError(f"{path_text(where)} holds {len(node)} strings, the task {count} samples")
            return ("s", type(node[0]).__name__)
        return ("x", type(node).__name__)

    def container(kind: str, keys: Any, values: list, where: Any) -> Any:
        if kind == "n":
            return ("n", keys.__qualname__, keys._fields, tuple(values))
        return ("d", tuple(zip(keys, values))) if keys is not None else (kind, tuple(values))

    return fold_tree(tree, leaf, container, path, is_leaf=_is_strings)


def _is_strings(node: Any) -> bool:
    return isinstance(node, (list, tuple)) and bool(node) and all(isinstance(v, (str, bytes)) for v in node)


def _array_nbytes(node: Any, path: None) -> int:
    return node.nbytes if isinstance(node, (np.ndarray, Chunked)) else 0


def _sum(kind: str, keys: list | None, values: list, path: None) -> int:
    return sum(values)


def tree_nbytes(tree: Any) -> int:
    """Total bytes of the array leaves of a decoded tree."""
    return fold_tree(tree, _array_nbytes, _sum, is_leaf=_is_strings)

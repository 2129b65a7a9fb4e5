"""Encoding a batch tree into its tree spec and raw frames (the grammar: :mod:`ferry.common.codec`).

Encoding never copies array bytes: each frame is the array's own buffer (C-contiguous), or the array goes into
the task's shared-memory slot. A leaf that no spec describes (an object of a class of your own, an array of a
dtype that cannot travel) is pickled only where the consumer allowed it (its local producers, ``pickle``);
elsewhere it is a :class:`~ferry.common.errors.BatchTypeError` naming the class and
:func:`~ferry.common.batch_types.register_batch_type`.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ferry.common.arrays import ALLOWED_DTYPES, SCALARS, Bfloat16Bits, as_array
from ferry.common.batch_types import REGISTER_CALL, class_name
from ferry.common.constants import MAX_FRAMES, MAX_TREE_DEPTH
from ferry.common.errors import BatchTypeError, ProtocolError
from ferry.common.tree import fold_tree

__all__ = ["encode_tree"]


def encode_tree(tree: Any, chunk_bytes: int | None = None, slot: Any = None,
                pickle_ok: bool = False) -> tuple[Any, list[memoryview]]:
    """Encode a batch tree. Returns ``(spec, frames)``; frames are zero-copy views of the arrays.

    With ``chunk_bytes``, an array larger than that travels as consecutive frames of that size.
    With ``slot`` (a :class:`ferry.common.shm.SlotWriter`), arrays go into the shared-memory slot while they fit
    (an array already written there is only referenced), and travel as frames after that.
    With ``pickle_ok`` (a local producer whose consumer said so in its WELCOME), a leaf no spec describes is
    pickled into a frame of its own.

    Raises:
        BatchTypeError: a leaf no spec describes, without ``pickle_ok``; the message names its class and the
            registration call.
        ProtocolError: an array of a dtype that cannot travel (without ``pickle_ok``), a dict key that is not a
            str or int, a tree nested too deep, or more than MAX_FRAMES frames.
    """
    encoder = _Encoder(chunk_bytes, slot, pickle_ok)
    spec = fold_tree(tree, encoder.leaf, encoder.container, max_depth=MAX_TREE_DEPTH)
    if len(encoder.frames) > MAX_FRAMES:
        raise ProtocolError(f"batch has {len(encoder.frames)} arrays, more than {MAX_FRAMES}")
    return spec, encoder.frames


# The walker of a batch is ferry.common.tree's fold; the decoder walks the wire's tree spec instead. Neither
# is a recursive closure: a closure that calls itself is a reference cycle, and it would keep a batch's
# buffers (and shared-memory slot) alive until the garbage collector ran.
class _Encoder:
    def __init__(self, chunk_bytes: int | None, slot: Any, pickle_ok: bool) -> None:
        self.chunk_bytes, self.slot, self.pickle_ok = chunk_bytes, slot, pickle_ok
        self.frames: list[memoryview] = []

    def leaf(self, node: Any, path: None) -> Any:
        array = as_array(node)
        if array is not None:
            if array.dtype.str not in ALLOWED_DTYPES and self.pickle_ok:
                return self.pickled(node)
            return self.array(array)
        if isinstance(node, np.generic):  # numpy's str_ and bytes_ (as_array took every other numpy scalar)
            return {"t": "g", "d": type(node).__name__, "v": node.item()}
        if isinstance(node, SCALARS):
            return node
        if self.pickle_ok:
            return self.pickled(node)
        cls = type(node)
        if cls.__module__ == "torch" and cls.__name__ == "Tensor":  # as_array took the strided ones
            raise BatchTypeError(
                f"a batch holds a {'nested' if node.is_nested else str(node.layout).replace('torch.', '')} tensor, "
                f"which cannot travel to a consumer over the network (only strided tensors are bytes): convert it "
                f"in the collate_fn (to_dense(), unbind()), or load with local producers")
        raise BatchTypeError(
            f"a batch holds a {cls.__qualname__} ({class_name(cls)}), which cannot travel to a consumer over the "
            f"network: nothing is pickled there. Register the class on the producer and in the training script "
            f"with {REGISTER_CALL}, or make the batch of dicts, lists, tuples, dataclasses and arrays")

    @staticmethod
    def container(kind: str, keys: Any, values: list, path: None) -> dict[str, Any]:
        if keys is None:
            return {"t": kind, "v": values}
        if kind == "n":
            return {"t": "n", "c": class_name(keys), "k": list(keys._fields), "v": values}
        if kind == "c":
            return {"t": "c", "c": class_name(keys), "v": values}
        if kind == "r":
            return {"t": "r", "c": keys.name, "v": values}
        for key in keys:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise ProtocolError(f"dict key {key!r} is not a str or int")
        return {"t": kind, "k": keys, "v": values}

    def pickled(self, node: Any) -> dict[str, Any]:
        self.frames.append(memoryview(pickle.dumps(node, protocol=pickle.HIGHEST_PROTOCOL)))
        return {"t": "p", "f": len(self.frames) - 1}

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

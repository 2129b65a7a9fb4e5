"""The batch tree codec: a nest of dict / list / tuple with array and scalar leaves <-> header + frames.

A batch travels as one msgpack header (the *tree spec*) plus one raw frame per array leaf. Encoding never
copies array bytes (:mod:`ferry.common.encoder`); decoding never copies either, and validates everything a
hostile peer controls (:mod:`ferry.common.decoder`). Nothing is pickled, except where a consumer allows it for its
own local producers (``"p"`` below). This module is the codec's public face: the grammar, the structure check
(:func:`tree_signature`) and the byte count (:func:`tree_nbytes`); the array leaves are :mod:`ferry.common.arrays`,
the classes a tree may name :mod:`ferry.common.batch_types`.

Tree spec grammar (what msgpack carries):

* ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes`` -- a scalar leaf, stored as itself;
* ``{"t": "g", "d": "str_", "v": "text"}`` -- a numpy string scalar (``np.str_``; ``"bytes_"``: ``np.bytes_``);
* ``{"t": "a", "d": "<f4", "s": [2, 3], "f": 0}`` -- an array leaf: dtype, shape, frame number;
  a large leaf adds ``"n": k``: its bytes are the k consecutive frames from ``f`` (the bound a consumer
  announces: ``frame_bytes``);
* ``{"t": "a", "d": "<f4", "s": [2, 3], "m": 4096}`` -- an array leaf in the task's shared-memory slot, at
  that byte offset (local producers only; see :mod:`ferry.common.shm`);
* ``{"t": "d", "k": [keys], "v": [specs]}`` -- a dict (keys are str or int);
* ``{"t": "l", "v": [specs]}`` / ``{"t": "t", "v": [specs]}`` -- a list / a tuple;
* ``{"t": "n", "c": "module:QualName", "k": [fields], "v": [specs]}`` -- a namedtuple. The receiver uses
  that class if its module is already imported there and its fields match, else a namedtuple class of the
  same name and fields made on the spot (nothing is ever imported on a peer's word);
* ``{"t": "c", "c": "module:QualName", "v": [spec]}`` -- a typed container: a dict / list / tuple subclass, or a
  dataclass (its one spec a dict of its fields). The receiver rebuilds that class, without running its code, if
  it is already imported there and fits the spec; else the plain container;
* ``{"t": "r", "c": "name", "v": [spec]}`` -- a registered type (``ferry.register_batch_type``): its
  ``to_tree``; the receiver rebuilds it with its own registration's ``from_tree`` after staging, and a name not
  registered there is a :class:`~ferry.common.errors.BatchTypeError` in the training loop;
* ``{"t": "p", "f": 0}`` -- a pickled value in that frame: only from a producer the consumer's WELCOME allowed it
  (``pickle``: its local producers over ipc, same user), refused from any other;
* an array leaf with ``"z": [entry per frame]`` has compressed frames: each entry ``None`` (raw) or
  ``[codec, shuffle, raw_nbytes]``; validated and bounded before anything is allocated, then decompressed
  into one fresh array (see :mod:`ferry.common.compression`);
* an array leaf with ``"x": "bf16"`` holds bfloat16 values as their int16 bits (numpy has no bfloat16);
  it decodes to a :class:`Bfloat16Bits` array, which the consumer's staging views as ``torch.bfloat16``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ferry.common.arrays import ALLOWED_DTYPES, Bfloat16Bits, Chunked, as_array
from ferry.common.batch_types import class_name
from ferry.common.decoder import decode_tree
from ferry.common.encoder import encode_tree
from ferry.common.errors import ProtocolError
from ferry.common.tree import fold_tree, path_text

__all__ = ["encode_tree", "decode_tree", "ALLOWED_DTYPES", "tree_nbytes", "tree_signature", "Chunked",
           "Bfloat16Bits", "as_array"]


def tree_signature(tree: Any, count: int | None, path: str = "batch") -> Any:
    """The structure of a decoded batch, checked against the number of samples it should hold.

    Returns a hashable description (containers, keys, classes, dtypes; not shapes, which may differ between
    batches) that must be the same for every batch of a dataset. ``count`` None: the batch need not be
    batch-first (a user's collate_fn made it, or it is one sample of an unbatched loader): no sample counts are
    checked, and a list's or tuple's length and items are data, as an array's shape is (only its kind counts).

    Raises:
        ProtocolError: an array's leading dimension, or a list of strings' length, is not ``count``.
    """

    def leaf(node: Any, where: Any) -> Any:
        if isinstance(node, (np.ndarray, Chunked)):
            if count is not None and (len(node.shape) == 0 or node.shape[0] != count):
                raise ProtocolError(f"{path_text(where)} holds {node.shape[0] if node.shape else 'no'} samples, "
                                    f"the task {count}")
            return ("a", "bf16" if getattr(node, "bfloat16", False) else node.dtype.str)
        if isinstance(node, (list, tuple)):  # collated strings: one per sample
            if count is not None and len(node) != count:
                raise ProtocolError(f"{path_text(where)} holds {len(node)} strings, the task {count} samples")
            return ("s", type(node[0]).__name__)
        return ("x", type(node).__name__)

    def container(kind: str, keys: Any, values: list, where: Any) -> Any:
        if kind == "n":
            return ("n", keys.__qualname__, keys._fields, tuple(values))
        if kind == "c":
            return ("c", class_name(keys), values[0])
        if kind == "r":
            return ("r", keys.name, values[0])
        if keys is not None:
            return ("d", tuple(zip(keys, values)))
        return (kind,) if count is None else (kind, tuple(values))

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

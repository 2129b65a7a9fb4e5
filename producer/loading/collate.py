"""Collation in numpy, with the output types of ``torch.utils.data.default_collate``.

* arrays (and torch CPU tensors) are stacked and keep their dtype (bfloat16 tensors travel as their bits,
  :class:`ferry.common.codec.Bfloat16Bits`);
* numpy scalars keep their dtype; Python ``bool`` -> bool, ``int`` -> int64, ``float`` -> float64;
* ``str`` and ``bytes`` stay as the batch holds them: a list at the top, a tuple inside a tuple sample
  (default_collate returns the column ``zip`` made);
* mappings collate per key; a namedtuple collates field by field into the same namedtuple; a tuple
  collates into a *list* of fields (default_collate's own backwards-compatible behaviour); other
  sequences collate element-wise into a list;
* a dict or list subclass keeps its class, as default_collate keeps it (a copy of the first sample, its items
  replaced); other mappings and sequences become a plain dict or list (what can travel without pickle);
* numpy's string scalars (``np.str_``, ``np.bytes_``) stay as the batch holds them, as default_collate leaves them.

No torch import: a producer stays light unless its dataset needs torch.

:class:`RowLayout` is the general path's shortcut around :func:`collate`: learned from one sample, it copies
each later sample's arrays into their row of the batch's destination as soon as the sample is loaded, and
assembles the batch without a stacking copy. A sample that does not fit the layout sends the whole batch
back to :func:`collate`, so results never differ. :func:`odd_ones_out` says which samples of a batch that
does not collate differ from the others.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np

from ferry.common.arrays import Bfloat16Bits, as_array

from ferry.common.errors import CollateError

__all__ = ["collate", "CollateError", "RowLayout", "signature", "odd_ones_out", "describe", "keep_type"]


def _to_array(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__ == "torch" and type(value).__name__ == "Tensor":
        return as_array(value)  # the codec's own conversion: bfloat16 becomes its marked bits
    return None


def collate(samples: Sequence[Any], path: str = "sample") -> Any:
    if not samples:
        raise CollateError("cannot collate an empty batch")
    elem = samples[0]
    array = _to_array(elem)
    if array is not None:
        arrays = [_to_array(s) for s in samples]
        for i, a in enumerate(arrays):
            if a is None or a.shape != array.shape or a.dtype != array.dtype:
                got = "not an array" if a is None else f"{a.dtype}{list(a.shape)}"
                raise CollateError(f"{path}: batch item {i} is {got}, item 0 is {array.dtype}{list(array.shape)}")
        bfloat16 = isinstance(array, Bfloat16Bits)
        if any(isinstance(a, Bfloat16Bits) != bfloat16 for a in arrays):
            raise CollateError(f"{path}: bfloat16 and int16 values in one batch")
        if array.dtype.kind in "OUSV":
            raise CollateError(f"{path}: arrays of dtype {array.dtype} cannot be collated")
        stacked = np.stack(arrays)
        return stacked.view(Bfloat16Bits) if bfloat16 else stacked
    if isinstance(elem, (str, bytes)):  # np.str_ too: default_collate leaves numpy's strings as they are
        # as default_collate: the column as it came, a tuple inside a sequence sample (zip's), else a list
        return samples if isinstance(samples, tuple) else list(samples)
    if isinstance(elem, np.generic):
        return np.array(samples, dtype=elem.dtype)
    if isinstance(elem, bool):
        return np.array(samples, dtype=np.bool_)
    if isinstance(elem, int):
        return np.array(samples, dtype=np.int64)
    if isinstance(elem, float):
        return np.array(samples, dtype=np.float64)
    if isinstance(elem, Mapping):
        return keep_type(elem, {key: collate([s[key] for s in samples], f"{path}[{key!r}]") for key in elem})
    if isinstance(elem, tuple) and hasattr(type(elem), "_fields"):  # a namedtuple stays one
        return type(elem)(*(collate(column, f"{path}.{field}")
                            for field, column in zip(type(elem)._fields, zip(*samples))))
    if isinstance(elem, Sequence):
        size = len(elem)
        if any(len(s) != size for s in samples):
            raise CollateError(f"{path}: each element in the batch should be of equal size")
        columns = [collate(column, f"{path}[{i}]") for i, column in enumerate(zip(*samples))]
        return columns if isinstance(elem, tuple) else keep_type(elem, columns)
    if type(elem).__module__ == "torch" and type(elem).__name__ == "Tensor":  # not strided: as default_collate says
        kind = "nested" if elem.is_nested else "sparse"
        raise CollateError(f"{path}: batches of {kind} tensors are not currently supported by the default "
                           f"collate_fn; please provide a custom collate_fn to handle them appropriately")
    raise CollateError(f"{path}: cannot collate values of type {type(elem).__name__}")


def keep_type(elem: Any, plain: dict | list) -> Any:
    """``plain`` (the collated items of ``elem``'s kind) in ``elem``'s class, as default_collate makes it: for a
    dict or list subclass a copy of ``elem`` with its items replaced; a plain dict or list, and any other mapping
    or sequence (which could not travel without pickle), stays ``plain``."""
    cls = type(elem)
    if cls is dict or cls is list or not isinstance(elem, (dict, list)):
        return plain
    try:
        clone = copy.copy(elem)
        if isinstance(clone, dict):
            clone.update(plain)
        else:
            clone[:] = plain
        return clone
    except TypeError:  # as default_collate: a class that cannot be copied so gives the plain container
        return plain


# --- structure ----------------------------------------------------------------------------------------
# A sample's *signature* is a hashable description of its structure, in collate's own order of cases:
#   ("a", shape, dtype.str)       an array (or torch tensor) collate stacks
#   ("v", type)                   a scalar collate gathers per column (numpy scalar, bool, int, float, str, bytes)
#   ("d", keys, children, type)   a mapping;  ("s", type, children)  any other sequence
#   ("x", type name)              something collate cannot batch (None, object arrays, ...)
_VALUE_TYPES = (np.generic, bool, int, float, str, bytes)


def signature(sample: Any) -> tuple:
    """The structure, shapes and dtypes of one sample (see above): equal signatures collate together."""
    array = _to_array(sample)
    if array is not None:
        if array.dtype.kind in "OUSV":
            return ("x", f"array of {array.dtype}")
        if isinstance(array, Bfloat16Bits):  # collated, but as marked bits: rows leave it to collate
            return ("b", array.shape, "bfloat16")
        return ("a", array.shape, array.dtype.str)
    if isinstance(sample, _VALUE_TYPES):
        return ("v", type(sample))
    if isinstance(sample, Mapping):
        keys = tuple(sample)
        return ("d", keys, tuple(signature(sample[k]) for k in keys), type(sample))
    if isinstance(sample, Sequence):
        return ("s", type(sample), tuple(signature(v) for v in sample))
    return ("x", type(sample).__name__)


def describe(sig: tuple) -> str:
    """A signature in words: ``(float32[3, 4], int)``."""
    kind = sig[0]
    if kind == "a":
        return f"{np.dtype(sig[2])}{list(sig[1])}"
    if kind == "b":
        return f"bfloat16{list(sig[1])}"
    if kind == "v":
        return sig[1].__name__
    if kind == "d":
        return "{" + ", ".join(f"{k!r}: {describe(c)}" for k, c in zip(sig[1], sig[2])) + "}"
    if kind == "s":
        return "(" + ", ".join(describe(c) for c in sig[2]) + ")"
    return str(sig[1])


def odd_ones_out(samples: Sequence[Any]) -> tuple[list[int], tuple | None]:
    """The positions of the samples whose signature differs from the majority's, and that signature.
    Ties go to the signature seen first. No odd ones (``[]``) when all samples share one signature."""
    sigs = [signature(s) for s in samples]
    if not sigs:
        return [], None
    majority = Counter(sigs).most_common(1)[0][0]
    return [i for i, sig in enumerate(sigs) if sig != majority], majority


def _not_rowable(sig: tuple) -> bool:
    """Holds something collate refuses ("x"), or a leaf it marks (bfloat16 bits, "b")."""
    if sig[0] in ("x", "b"):
        return True
    if sig[0] in ("d", "s"):
        return any(_not_rowable(c) for c in sig[2])
    return False


# --- row layout ---------------------------------------------------------------------------------------
class RowLayout:
    """The layout of one sample, learned from it: where each of its arrays goes in a batch.

    ``write`` runs on a loading thread, once per sample: it checks the sample against the layout and copies
    its arrays into row ``row`` of the batch's destination arrays (one per array leaf, shape
    ``(batch, *leaf shape)``), returning the sample with those arrays replaced by views of their rows (None,
    having written nothing, when the sample does not fit). ``assemble`` builds the batch from such samples:
    the destinations themselves for the arrays, :func:`collate` for the scalar columns, and containers as
    collate makes them. Only ever built from a signature with no uncollatable part.
    """

    def __init__(self, sig: tuple) -> None:
        self.signature = sig
        self.leaves: list[tuple[tuple[int, ...], np.dtype]] = []  # (shape, dtype) per array leaf, in walk order
        self._collect(sig)

    @classmethod
    def learn(cls, sample: Any) -> "RowLayout | None":
        """The layout of ``sample``, or None if it has no array to place or holds what collate refuses."""
        sig = signature(sample)
        if _not_rowable(sig):
            return None
        layout = cls(sig)
        return layout if layout.leaves else None

    def _collect(self, sig: tuple) -> None:
        if sig[0] == "a":
            self.leaves.append((sig[1], np.dtype(sig[2])))
        elif sig[0] in ("d", "s"):
            for child in sig[2]:
                self._collect(child)

    def row_nbytes(self) -> list[int]:
        return [int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for shape, dtype in self.leaves]

    def destinations(self, rows: int, room: Callable[[int], np.ndarray]) -> list[np.ndarray]:
        """One array per leaf, ``(rows, *shape)``, over the uint8 memory ``room(nbytes)`` hands out."""
        return [room(rows * n).view(dtype).reshape(rows, *shape)
                for n, (shape, dtype) in zip(self.row_nbytes(), self.leaves)]

    def write(self, sample: Any, dests: list[np.ndarray], row: int) -> Any:
        """``sample`` with its arrays copied into row ``row`` of ``dests`` and replaced by those rows; None if
        it does not fit the layout (then nothing was written)."""
        if signature(sample) != self.signature:
            return None
        return _write(sample, self.signature, dests, row, iter(range(len(dests))))

    def assemble(self, samples: Sequence[Any], dests: list[np.ndarray]) -> Any:
        """The batch of ``samples`` (each returned by :meth:`write`, in row order ``0..len-1``): equal to
        ``collate(samples)``, with the arrays being ``dests`` themselves (no copy)."""
        return _assemble(samples, self.signature, dests, iter(range(len(dests))), "sample")


def _write(sample: Any, sig: tuple, dests: list[np.ndarray], row: int, leaf: Any) -> Any:
    kind = sig[0]
    if kind == "a":
        out = dests[next(leaf)][row, ...]  # a view even for a 0-d leaf
        np.copyto(out, _to_array(sample), casting="no")
        return out
    if kind == "v":
        return sample
    if kind == "d":  # the same class of mapping, so that a fallback collate sees what it would have
        return keep_type(sample, {k: _write(sample[k], child, dests, row, leaf) for k, child in zip(sig[1], sig[2])})
    values = [_write(v, child, dests, row, leaf) for v, child in zip(sample, sig[2])]
    if isinstance(sample, tuple):  # the same kind of tuple, so that a fallback collate sees what it would have
        return type(sample)(*values) if hasattr(type(sample), "_fields") else tuple(values)
    return keep_type(sample, values)


def _assemble(samples: Sequence[Any], sig: tuple, dests: list[np.ndarray], leaf: Any, path: str) -> Any:
    kind = sig[0]
    if kind == "a":
        return dests[next(leaf)][: len(samples)]
    if kind == "v":
        return collate(samples, path)
    if kind == "d":
        return keep_type(samples[0], {k: _assemble([s[k] for s in samples], child, dests, leaf, f"{path}[{k!r}]")
                                      for k, child in zip(sig[1], sig[2])})
    kind_type = sig[1]
    if issubclass(kind_type, tuple) and hasattr(kind_type, "_fields"):  # a namedtuple stays one, as in collate
        return kind_type(*(_assemble(tuple(s[i] for s in samples), child, dests, leaf, f"{path}.{field}")
                           for i, (field, child) in enumerate(zip(kind_type._fields, sig[2]))))
    columns = [_assemble(tuple(s[i] for s in samples), child, dests, leaf, f"{path}[{i}]")  # a tuple, as zip's
               for i, child in enumerate(sig[2])]
    return columns if issubclass(kind_type, tuple) else keep_type(samples[0], columns)

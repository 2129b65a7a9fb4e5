"""Collation in numpy, with the output types of ``torch.utils.data.default_collate``.

* arrays (and torch CPU tensors) are stacked and keep their dtype (bfloat16 tensors travel as their bits,
  :class:`ferry.common.codec.Bfloat16Bits`);
* numpy scalars keep their dtype; Python ``bool`` -> bool, ``int`` -> int64, ``float`` -> float64;
* ``str`` and ``bytes`` stay as the batch holds them: a list at the top, a tuple inside a tuple sample
  (default_collate returns the column ``zip`` made);
* mappings collate per key; a namedtuple collates field by field into the same namedtuple; a tuple
  collates into a *list* of fields (default_collate's own backwards-compatible behaviour); other
  sequences collate element-wise into a list.

No torch import: a producer stays light unless its dataset needs torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ferry.common.codec import Bfloat16Bits, as_array

from ferry.common.errors import FerryError

__all__ = ["collate", "CollateError"]


class CollateError(FerryError, TypeError):
    """The samples of a batch cannot be collated; the message says where in the sample and why."""


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
    if isinstance(elem, np.generic):
        return np.array(samples, dtype=elem.dtype)
    if isinstance(elem, bool):
        return np.array(samples, dtype=np.bool_)
    if isinstance(elem, int):
        return np.array(samples, dtype=np.int64)
    if isinstance(elem, float):
        return np.array(samples, dtype=np.float64)
    if isinstance(elem, (str, bytes)):
        return samples if isinstance(samples, tuple) else list(samples)
    if isinstance(elem, Mapping):
        return {key: collate([s[key] for s in samples], f"{path}[{key!r}]") for key in elem}
    if isinstance(elem, tuple) and hasattr(type(elem), "_fields"):  # a namedtuple stays one
        return type(elem)(*(collate(column, f"{path}.{field}")
                            for field, column in zip(type(elem)._fields, zip(*samples))))
    if isinstance(elem, Sequence):
        size = len(elem)
        if any(len(s) != size for s in samples):
            raise CollateError(f"{path}: each element in the batch should be of equal size")
        return [collate(column, f"{path}[{i}]") for i, column in enumerate(zip(*samples))]
    raise CollateError(f"{path}: cannot collate values of type {type(elem).__name__}")

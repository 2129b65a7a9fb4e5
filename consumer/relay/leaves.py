"""A batch as the relay sends it: its leaves, each in a dtype its client reads and in the order it asked for.

A batch tree (dict / list / tuple nests, namedtuples and dataclasses by their fields) becomes a flat list of parts
named by their paths (:func:`~ferry.consumer.relay.framing.encode_name`): arrays (tensors, numpy arrays, numbers),
texts (``str``), raws (``bytes``) and nulls (``None``, a ``null NAME`` line). An empty container has no leaf and
does not travel.

Order: ``C`` sends an array's elements row-major, as numpy and torch hold them; ``F`` column-major, so that a
column-major language (R, Fortran, Julia, MATLAB) that reads the bytes into an array of the same dimensions has
``a[i, j, k]`` equal to the batch's ``[i, j, k]``: R's ``array(readBin(...), dim = dims)`` without a transpose.

Dtype: a client names the dtypes it reads (R reads float64, int32, uint8 and bool at memory speed); any other is
converted on the relay to the first of :data:`WIDER` the client reads. ``int64`` (labels) goes as ``int32`` when
every value fits, else ``float64`` when every value is exact there (below 2**53), else it cannot travel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ferry.common.errors import RelayError
from ferry.consumer.relay.framing import WIRE_DTYPES, Part, encode_name

__all__ = ["ClientFormat", "Leaf", "leaves_of", "wire_dtype", "write_array", "inline_bytes", "WIDER"]

#: Where a dtype the client does not read goes: the first of these it reads (values are checked where noted).
WIDER: dict[str, tuple[str, ...]] = {
    "bool": ("uint8", "int32", "float64"),
    "uint8": ("int16", "uint16", "int32", "int64", "float32", "float64"),
    "int8": ("int16", "int32", "int64", "float32", "float64"),
    "int16": ("int32", "int64", "float32", "float64"),
    "uint16": ("int32", "uint32", "int64", "float32", "float64"),
    "int32": ("int64", "float64"),
    "uint32": ("int64", "uint64", "float64"),
    "int64": ("int32", "float64"),  # by value: see the module docstring
    "uint64": ("int64", "int32", "float64"),  # by value
    "float16": ("float32", "float64"),
    "float32": ("float64",),
    "float64": (),
}
_BY_VALUE = {"int64", "uint64"}
_EXACT_IN_FLOAT64 = 2 ** 53


@dataclass(frozen=True)
class ClientFormat:
    """How a client wants arrays: ``order`` ``"C"`` or ``"F"``, and the dtypes it reads."""

    order: str = "C"
    dtypes: frozenset[str] = frozenset(WIRE_DTYPES)


@dataclass(frozen=True)
class Leaf:
    """One leaf of a batch: its part, and its value (an array in its own dtype, bytes, or None for a null)."""

    part: Part
    value: Any


def _numpy(value: Any) -> np.ndarray | None:
    """An array leaf as numpy, or None if ``value`` is not one."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (bool, int, float, np.generic)):
        return np.asarray(value)
    try:
        import torch
    except ImportError:  # pragma: no cover - the relay runs in a loader's process, which has torch
        return None
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    return None


def _walk(tree: Any, path: list[str | int]) -> Iterator[tuple[list[str | int], Any]]:
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _walk(value, path + [str(key)])
    elif isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple (PackedSequence): by its fields
        for key, value in zip(tree._fields, tree):
            yield from _walk(value, path + [key])
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for f in dataclasses.fields(tree):
            yield from _walk(getattr(tree, f.name), path + [f.name])
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _walk(value, path + [i])
    else:
        yield path, tree


def wire_dtype(array: np.ndarray, accepted: frozenset[str], where: str) -> str:
    """The dtype ``array`` travels in to a client that reads ``accepted``.

    Raises:
        RelayError: no dtype the client reads holds it (naming the leaf ``where``).
    """
    name = array.dtype.name
    if name not in WIDER:
        raise RelayError(f"leaf {where}: dtype {name} cannot travel through the relay (it sends "
                         f"{', '.join(WIRE_DTYPES)})")
    if name in accepted:
        return name
    low = high = None
    for candidate in WIDER[name]:
        if candidate not in accepted:
            continue
        if name not in _BY_VALUE:
            return candidate
        if low is None:
            low, high = (int(array.min()), int(array.max())) if array.size else (0, 0)
        if candidate == "float64" and -_EXACT_IN_FLOAT64 <= low and high <= _EXACT_IN_FLOAT64:
            return candidate
        if candidate != "float64":
            info = np.iinfo(candidate)
            if info.min <= low and high <= info.max:
                return candidate
    raise RelayError(f"leaf {where}: its client reads none of the dtypes {name} goes to exactly "
                     f"({', '.join(WIDER[name]) or 'none'}; it reads {', '.join(sorted(accepted))})")


def leaves_of(tree: Any, fmt: ClientFormat) -> list[Leaf]:
    """The parts of a batch ``tree`` for a client of format ``fmt``, in path order.

    Raises:
        RelayError: a leaf that cannot travel (an object of another class, a dtype the client cannot read).
    """
    leaves = []
    for path, value in _walk(tree, []):
        name = encode_name(path)
        if value is None:
            leaves.append(Leaf(Part("null", name), None))
        elif isinstance(value, str):
            data = value.encode()
            leaves.append(Leaf(Part("text", name, nbytes=len(data)), data))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            leaves.append(Leaf(Part("raw", name, nbytes=len(data)), data))
        else:
            array = _numpy(value)
            if array is None:
                raise RelayError(f"leaf {name}: a {type(value).__module__}.{type(value).__qualname__} cannot travel "
                                 "through the relay: it sends arrays (tensors, numpy arrays, numbers), strings, bytes "
                                 "and None, in dicts, lists and tuples")
            dims = tuple(int(d) for d in array.shape)
            leaves.append(Leaf(Part("array", name, wire_dtype(array, fmt.dtypes, name), dims), array))
    return leaves


def write_array(dest: memoryview, leaf: Leaf, order: str) -> None:
    """Write an array leaf's elements into ``dest`` (exactly its bytes), in ``order``, converted to its wire dtype."""
    part, array = leaf.part, leaf.value
    dtype = WIRE_DTYPES[part.dtype]
    if order == "F":  # column-major bytes of a are the row-major bytes of a.T
        out = np.ndarray(part.dims[::-1], dtype=dtype, buffer=dest)
        out[...] = array.T
    else:
        out = np.ndarray(part.dims, dtype=dtype, buffer=dest)
        out[...] = array


def inline_bytes(leaf: Leaf, order: str) -> memoryview:
    """An array leaf's bytes to send inline: the array's own memory where it already is the wire's, else a copy."""
    array = leaf.value
    dtype = WIRE_DTYPES[leaf.part.dtype]
    own = array.dtype == dtype and (array.flags.c_contiguous if order == "C" else array.flags.f_contiguous)
    if own:
        return memoryview(array.reshape(-1, order=order).view(np.uint8))
    out = np.empty(array.size * dtype.itemsize, np.uint8)
    write_array(memoryview(out), leaf, order)
    return memoryview(out)

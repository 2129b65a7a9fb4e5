"""The array leaves of a batch tree: what may travel as raw bytes, and what a decoded leaf looks like.

* :data:`ALLOWED_DTYPES` -- the dtypes allowed on the wire (never ``object``, never a string dtype);
* :func:`as_array` -- a leaf as a numpy array: numpy arrays and scalars, torch CPU tensors (bfloat16 as its
  bits, :class:`Bfloat16Bits`);
* :class:`Chunked` -- a decoded leaf that arrived in several frames, which the receiver assembles.

Shared by the encoder (:mod:`ferry.common.encoder`), the decoder (:mod:`ferry.common.decoder`), the producer's
collation and the consumer's staging.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ALLOWED_DTYPES", "SCALARS", "Bfloat16Bits", "as_array", "Chunked"]

#: dtypes allowed on the wire, as numpy ``dtype.str`` (little-endian or byte-order free).
ALLOWED_DTYPES = frozenset(
    ["|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16"]
)
#: Leaves that travel as themselves in the tree spec (msgpack values).
SCALARS = (type(None), bool, int, float, str, bytes)


class Bfloat16Bits(np.ndarray):
    """The int16 bits of a bfloat16 array (a zero-copy view): what a bfloat16 leaf decodes to."""

    bfloat16 = True


def as_array(value: Any) -> np.ndarray | None:
    """Return ``value`` as a numpy array if it is an array-like leaf (numpy array or scalar, torch CPU tensor
    with a plain strided layout), else None. numpy's string scalars (``np.str_``, ``np.bytes_``) are strings,
    not arrays."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return None if isinstance(value, (str, bytes)) else np.asarray(value)
    if type(value).__module__ == "torch" and type(value).__name__ == "Tensor":
        if str(value.layout) != "torch.strided" or value.is_nested:  # sparse, nested: not one buffer
            return None
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

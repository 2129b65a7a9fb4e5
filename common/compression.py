"""Per-frame compression of a batch's array frames, for slow links (docs/ARCHITECTURE.md#batch-codec).

Each array frame travels on its own, compressed with lz4 or zstd (level 1), after a dtype-aware byte shuffle
where that makes it smaller: for itemsize k, the bytes of a frame viewed as ``(n, k)`` are sent transposed, so
that the i-th bytes of all elements sit together (the high bytes of whole-number floats repeat, and compress).
A frame that does not shrink below ``SHRINK_RATIO`` of its size travels raw. Shared-memory slot leaves (``"m"``)
and small frames (below ``MIN_COMPRESS_FRAME_BYTES``, common/constants.py) are never compressed.

On the wire an array leaf that has a compressed frame carries ``"z"``: one entry per frame of the leaf, ``None``
for a raw frame, else ``[codec, shuffle, raw_nbytes]`` (``shuffle`` 0: none, else the itemsize). The receiver
validates all of it before anything is allocated (:func:`decode_leaf`): a known codec, the shuffle matching the
dtype, raw sizes that add up to the leaf's ``prod(shape) × itemsize`` and, summed over the batch, stay within
``max_batch_bytes``. Decompression is bounded by the declared size (a zip bomb cannot allocate more) and its
result must have exactly that size. It happens on the io thread, as the batch is decoded
(:meth:`CompressedLeaf.assemble_into`), so that a stream that lies costs its producer its place and its task is
re-issued, like any other unusable batch.

Which codec a batch uses is the consumer's to say, in each TASK; under ``"auto"`` it decides from what it
sees (:mod:`ferry.consumer.core.compression`). The producer's side (the thread pool that compresses a batch's
frames, the codec of each task) is :mod:`ferry.producer.loading.compressing`. The codec libraries are optional
extras (``pip install 'ferry[lz4]'``, ``'ferry[zstd]'``); this module imports without them, and
:func:`require` names the missing package.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from ferry.common.errors import ConfigError, ProtocolError

__all__ = [
    "MODES", "CODECS", "SHRINK_RATIO", "available", "require", "check_mode", "codec",
    "shuffle", "unshuffle", "compress_frame", "decide_shuffle", "CompressedLeaf", "Budget", "decode_leaf",
    "CompressionUnavailable",
]

#: What a user may ask for (``None`` is spelled "none" on the wire and on the command line).
MODES = ("auto", "lz4", "zstd", "none")
#: The codecs, cheapest first.
CODECS = ("lz4", "zstd")
#: A compressed frame travels only if it is at most this fraction of its raw size.
SHRINK_RATIO = 0.9
#: The prefix of a leaf's first frame on which the shuffle is decided (both ways compressed). [Unit: byte]
SHUFFLE_SAMPLE_BYTES = 64 << 10
_PACKAGES = {"lz4": ("lz4", "ferry[lz4]"), "zstd": ("zstandard", "ferry[zstd]")}
_ZSTD_LEVEL = 1


class CompressionUnavailable(ConfigError):
    """A codec was asked for whose library is not installed; the message names the package."""


# --- codecs -------------------------------------------------------------------------------------------
class _Lz4:
    name = "lz4"

    def __init__(self) -> None:
        import lz4.block

        self._block = lz4.block

    def compress(self, data: Any) -> bytes:
        return self._block.compress(data, store_size=False)

    def decompress(self, data: Any, raw_nbytes: int) -> bytes:
        """At most ``raw_nbytes`` are allocated; a stream that would exceed them is an error."""
        return self._block.decompress(data, uncompressed_size=raw_nbytes)


class _Zstd:
    name = "zstd"

    def __init__(self) -> None:
        import zstandard

        self._zstd = zstandard
        self._local = threading.local()  # (de)compressor objects are not for concurrent use

    def _pair(self) -> tuple[Any, Any]:
        pair = getattr(self._local, "pair", None)
        if pair is None:
            pair = (self._zstd.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True),
                    self._zstd.ZstdDecompressor())
            self._local.pair = pair
        return pair

    def compress(self, data: Any) -> bytes:
        return self._pair()[0].compress(data)

    def check(self, data: Any, raw_nbytes: int) -> None:
        """With a content size in its header zstandard allocates that size whatever max_output_size says: so
        the header must declare exactly what the tree spec does (already bounded). Cheap: reads the header."""
        try:
            declared = self._zstd.frame_content_size(data)
        except self._zstd.ZstdError as exc:
            raise ProtocolError(f"not a zstd frame: {exc}") from None
        if declared != raw_nbytes:
            raise ProtocolError(f"zstd frame declares {declared} bytes, the tree spec {raw_nbytes}")

    def decompress(self, data: Any, raw_nbytes: int) -> bytes:
        self.check(data, raw_nbytes)
        return self._pair()[1].decompress(data, max_output_size=raw_nbytes)


_codecs: dict[str, Any] = {}
_codecs_lock = threading.Lock()


def codec(name: str) -> Any:
    """The codec object for ``name`` ("lz4" or "zstd"); raises :class:`CompressionUnavailable` without its library."""
    with _codecs_lock:
        found = _codecs.get(name)
        if found is None:
            package, extra = _PACKAGES[name]
            try:
                found = _Lz4() if name == "lz4" else _Zstd()
            except ImportError:
                raise CompressionUnavailable(f"compression={name!r} needs the {package} package: "
                                             f"pip install '{extra}' (or pip install {package})") from None
            _codecs[name] = found
        return found


def available() -> tuple[str, ...]:
    """The codecs whose libraries import here."""
    out = []
    for name in CODECS:
        try:
            codec(name)
        except CompressionUnavailable:
            continue
        out.append(name)
    return tuple(out)


def check_mode(name: str, value: Any) -> str:
    """``value`` ("auto", "lz4", "zstd", None or "none") as a wire mode. Raises ConfigError naming the choices."""
    mode = "none" if value is None else value
    if not isinstance(mode, str) or mode not in MODES:
        raise ConfigError(f"{name} must be one of 'auto', 'lz4', 'zstd' or None, got {value!r}")
    return mode


def require(mode: str) -> None:
    """Raise :class:`CompressionUnavailable` if ``mode`` names a codec whose library is missing."""
    if mode in CODECS:
        codec(mode)


# --- the shuffle ------------------------------------------------------------------------------------
def shuffle(raw: Any, itemsize: int) -> np.ndarray:
    """The bytes of ``raw`` (length a multiple of ``itemsize``) grouped by byte position: ``(n, k).T``."""
    data = np.frombuffer(raw, dtype=np.uint8)
    return np.ascontiguousarray(data.reshape(-1, itemsize).T).reshape(-1)


def unshuffle(data: Any, itemsize: int, out: np.ndarray) -> None:
    """Inverse of :func:`shuffle`, written into ``out`` (uint8, the raw length)."""
    shuffled = np.frombuffer(data, dtype=np.uint8)
    out.reshape(-1, itemsize)[...] = shuffled.reshape(itemsize, -1).T


def compress_frame(name: str, raw: Any, itemsize: int) -> tuple[bytes, list] | None:
    """Compress one frame (after the shuffle, for ``itemsize`` > 1). Returns ``(wire bytes, z entry)``, or None
    when it does not shrink below ``SHRINK_RATIO`` (it then travels raw)."""
    nbytes = len(raw)
    step = itemsize if itemsize > 1 and nbytes % itemsize == 0 else 0
    data = shuffle(raw, step) if step else raw
    out = codec(name).compress(data)
    if len(out) > SHRINK_RATIO * nbytes:
        return None
    return out, [name, step, nbytes]


def decide_shuffle(name: str, raw: Any, itemsize: int) -> int:
    """The itemsize if shuffled bytes compress smaller than plain ones on a prefix of ``raw``, else 1."""
    if itemsize <= 1:
        return 1
    size = min(len(raw), SHUFFLE_SAMPLE_BYTES) // itemsize * itemsize
    if size == 0:
        return 1
    sample = memoryview(raw)[:size]
    plain = len(codec(name).compress(sample))
    shuffled = len(codec(name).compress(shuffle(sample, itemsize)))
    return itemsize if shuffled < plain else 1


# --- decoding (consumer) ----------------------------------------------------------------------------
class Budget:
    """The raw bytes a batch may declare in all (``max_batch_bytes``), counted as its leaves are validated."""

    def __init__(self, limit: int | None, used: int = 0) -> None:
        self.limit, self.used = limit, used  # used: starts at the batch's frame bytes, each raw frame counted


    def take(self, nbytes: int, path: str) -> None:
        self.used += nbytes
        if self.limit is not None and self.used > self.limit:
            raise ProtocolError(f"batch declares {self.used} raw bytes (compressed frames at {path}), more than "
                                f"the limit of {self.limit} bytes")


class CompressedLeaf:
    """An array leaf with compressed frames, validated but not yet decompressed: ``assemble_into`` does that."""

    __slots__ = ("dtype", "shape", "nbytes", "bfloat16", "pieces", "path", "wire_nbytes", "raw_compressed")

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...], pieces: list[tuple[Any, str | None, int, int]],
                 path: str) -> None:  # pieces: (frame, codec or None, shuffle, raw_nbytes)
        self.dtype, self.shape, self.pieces, self.path = dtype, shape, pieces, path
        self.bfloat16 = False
        self.nbytes = sum(p[3] for p in pieces)
        self.wire_nbytes = sum(len(p[0]) for p in pieces if p[1] is not None)  # of the compressed frames
        self.raw_compressed = sum(p[3] for p in pieces if p[1] is not None)

    def assemble_into(self, out: np.ndarray) -> np.ndarray:
        flat = out[: self.nbytes]
        offset = 0
        for buffer, name, step, raw in self.pieces:
            _expand(buffer, name, step, raw, flat[offset : offset + raw], self.path)
            offset += raw
        return flat.view(self.dtype).reshape(self.shape)


def decode_leaf(np_dtype: np.dtype, shape: tuple[int, ...], buffers: Sequence[Any], z: Any, path: str,
                budget: Budget) -> CompressedLeaf:
    """A compressed array leaf, validated: a :class:`CompressedLeaf` (nothing decompressed or allocated yet).

    Raises:
        ProtocolError: a bad ``"z"`` list, an unknown or unavailable codec, a shuffle that does not match the
            dtype, raw sizes that do not add up to the leaf's size or exceed the batch's bound.
    """
    if not isinstance(z, list) or len(z) != len(buffers):
        raise ProtocolError(f"compression list at {path} does not have one entry per frame ({len(buffers)})")
    expected = int(np.prod(shape, dtype=object)) * np_dtype.itemsize
    pieces: list[tuple[Any, str | None, int, int]] = []
    total = 0
    for buffer, entry in zip(buffers, z):
        if entry is None:
            pieces.append((buffer, None, 0, len(buffer)))
            total += len(buffer)
            continue
        if not (isinstance(entry, list) and len(entry) == 3):
            raise ProtocolError(f"bad compression entry {entry!r} at {path}")
        name, step, raw = entry
        if not isinstance(name, str) or name not in CODECS:
            raise ProtocolError(f"unknown codec {name!r} at {path}")
        if not isinstance(step, int) or isinstance(step, bool) or step not in (0, np_dtype.itemsize):
            raise ProtocolError(f"bad shuffle {step!r} at {path} (dtype {np_dtype.str})")
        if not isinstance(raw, int) or isinstance(raw, bool) or raw < 0 or (step and raw % step):
            raise ProtocolError(f"bad raw size {raw!r} at {path}")
        try:
            found = codec(name)
        except CompressionUnavailable as exc:
            raise ProtocolError(f"frame at {path} uses {name}, which this consumer cannot decompress: {exc}") from None
        total += raw
        if total > expected:
            break
        budget.take(raw - len(buffer), path)  # the frame was counted at its wire length
        check = getattr(found, "check", None)  # what the frame's own header says, where it says something
        if check is not None:
            try:
                check(buffer, raw)
            except ProtocolError as exc:
                raise ProtocolError(f"{exc} (at {path})") from None
        pieces.append((buffer, name, step, raw))
    if total != expected:
        raise ProtocolError(f"array at {path}: shape {list(shape)} x {np_dtype.itemsize} bytes != "
                            f"{total} bytes declared by its frames")
    return CompressedLeaf(np_dtype, tuple(shape), pieces, path)


def _expand(buffer: Any, name: str | None, step: int, raw: int, out: np.ndarray, path: str) -> None:
    """One frame into ``out`` (uint8, ``raw`` bytes): copied, or decompressed (and unshuffled)."""
    if name is None:
        out[...] = np.frombuffer(buffer, dtype=np.uint8)
        return
    try:
        data = codec(name).decompress(buffer, raw)
    except ProtocolError:
        raise
    except Exception as exc:  # each library has its own error types for a corrupt stream
        raise ProtocolError(f"{name} frame at {path} does not decompress: {type(exc).__name__}: {exc}") from None
    if len(data) != raw:
        raise ProtocolError(f"{name} frame at {path} decompresses to {len(data)} bytes, declared {raw}")
    if step:
        unshuffle(data, step, out)
    else:
        out[...] = np.frombuffer(data, dtype=np.uint8)

"""The relay's framing (docs/relay-protocol.md): a 4-byte length, a header of text lines, then the parts' bytes.

A header is UTF-8 text: its first line is the message's type, each further line ``key value`` (the value is the rest
of the line, possibly empty). ``array``, ``text``, ``raw`` and ``null`` lines declare the message's parts, in the
order of their bytes: arrays by dtype and dimensions, texts and raws by their byte count, nulls (``None``) with none. This module holds the format and
nothing else: no socket (the relay's server and the clients feed it bytes), so that it is tested on its own.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import numpy as np

from ferry.common.constants import RELAY_MAX_HEADER_BYTES, RELAY_MAX_TEXT_BYTES
from ferry.common.errors import RelayError

__all__ = ["Header", "Part", "encode", "parse_header", "header_length", "LENGTH", "WIRE_DTYPES", "part_nbytes",
           "encode_name", "decode_name", "dims_text", "parse_dims", "MessageReader", "text_parts",
           "stream_parts"]

#: The length prefix: the header's byte count, 4 bytes, big-endian ("network order").
LENGTH = struct.Struct(">I")

#: The dtypes an array part may have, by the names the header uses; little-endian, as numpy's.
WIRE_DTYPES: dict[str, np.dtype] = {name: np.dtype(name).newbyteorder("<") for name in (
    "bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64")}

_KEY = re.compile(r"[a-z][a-z0-9_]*\Z")
_TYPE = re.compile(r"[a-z][a-z_]*\Z")


@dataclass(frozen=True)
class Part:
    """One part a header declares: ``kind`` ``array`` (``dtype``, ``dims``), ``text`` (UTF-8) or ``raw`` (bytes, in
    ``nbytes``), or ``null`` (no bytes); ``name`` is the leaf's path (see :func:`encode_name`)."""

    kind: str
    name: str
    dtype: str = ""
    dims: tuple[int, ...] = ()
    nbytes: int = 0


@dataclass
class Header:
    """A message's header: its ``type``, its ``fields`` (``key`` → value, as text) in order, and its ``parts``."""

    type: str
    fields: dict[str, str] = field(default_factory=dict)
    parts: list[Part] = field(default_factory=list)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.fields.get(key, default)

    def integer(self, key: str, default: int | None = None) -> int:
        """Field ``key`` as an int.

        Raises:
            RelayError: missing (without a default) or not an integer.
        """
        value = self.fields.get(key)
        if value is None:
            if default is None:
                raise RelayError(f"a {self.type} message needs a {key} line")
            return default
        try:
            return int(value)
        except ValueError:
            raise RelayError(f"{self.type}'s {key} must be an integer, got {value!r}") from None


def part_nbytes(part: Part) -> int:
    """How many bytes a part's data takes."""
    if part.kind == "array":
        return math.prod(part.dims) * WIRE_DTYPES[part.dtype].itemsize
    return part.nbytes


def encode_name(segments: list[str | int]) -> str:
    """A leaf's path as a part's name: dict keys percent-encoded (``/``, ``#``, ``%`` and spaces included), list and
    tuple positions as ``#i``, joined by ``/``. The batch itself, when it is one array: ``.``."""
    if not segments:
        return "."
    return "/".join(f"#{s}" if isinstance(s, int) else quote(s, safe="") for s in segments)


def decode_name(name: str) -> list[str | int]:
    """:func:`encode_name`'s inverse."""
    if name == ".":
        return []
    return [int(s[1:]) if s.startswith("#") else unquote(s) for s in name.split("/")]


def dims_text(dims: tuple[int, ...]) -> str:
    return ",".join(map(str, dims)) if dims else "-"


def parse_dims(text: str) -> tuple[int, ...]:
    if text == "-":
        return ()
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise RelayError(f"dimensions {text!r} are not integers separated by commas (or - for a scalar)") from None
    if any(d < 0 for d in dims):
        raise RelayError(f"dimensions {text!r} are negative")
    return dims


def encode(type_: str, fields: dict[str, object] | None = None, parts: list[Part] | None = None) -> bytes:
    """The length prefix and header of a message (its parts' bytes follow it, written by the caller)."""
    if not _TYPE.match(type_):
        raise ValueError(f"message type {type_!r}")
    lines = [type_]
    for key, value in (fields or {}).items():
        text = str(value)
        if not _KEY.match(key) or "\n" in text:
            raise ValueError(f"header line {key!r}: {text!r}")
        lines.append(f"{key} {text}")
    for part in parts or ():
        if part.kind == "array":
            lines.append(f"array {part.name} {part.dtype} {dims_text(part.dims)}")
        elif part.kind == "null":
            lines.append(f"null {part.name}")
        else:
            lines.append(f"{part.kind} {part.name} {part.nbytes}")
    data = "\n".join(lines).encode()
    if len(data) > RELAY_MAX_HEADER_BYTES:
        raise ValueError(f"header of {len(data)} bytes, over {RELAY_MAX_HEADER_BYTES}")
    return LENGTH.pack(len(data)) + data


def header_length(prefix: bytes) -> int:
    """The header's byte count from the 4-byte prefix.

    Raises:
        RelayError: over :data:`RELAY_MAX_HEADER_BYTES` (the peer does not speak this protocol).
    """
    (length,) = LENGTH.unpack(prefix)
    if length > RELAY_MAX_HEADER_BYTES:
        raise RelayError(f"a header of {length} bytes, over the bound {RELAY_MAX_HEADER_BYTES}: the peer does not "
                         "speak the ferry relay protocol")
    return length


def parse_header(data: bytes) -> Header:
    """A header's bytes (without the length prefix) as a :class:`Header`.

    Raises:
        RelayError: not UTF-8, no type, a malformed line, a part of an unknown kind or dtype, a text part over
            :data:`RELAY_MAX_TEXT_BYTES`.
    """
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        raise RelayError("a header that is not UTF-8 text") from None
    if not _TYPE.match(lines[0]):
        raise RelayError(f"a header whose first line {lines[0][:40]!r} is no message type")
    header = Header(lines[0])
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        if not _KEY.match(key):
            raise RelayError(f"a header line {line[:60]!r} that does not start with a key")
        if key in ("array", "text", "raw"):
            header.parts.append(_parse_part(key, value))
        elif key == "null":
            header.parts.append(Part("null", value))
        else:
            header.fields[key] = value
    return header


def _parse_part(kind: str, value: str) -> Part:
    words = value.split(" ")
    if kind == "array":
        if len(words) != 3:
            raise RelayError(f"an array line needs NAME DTYPE DIMS, got {value!r}")
        name, dtype, dims = words
        if dtype not in WIRE_DTYPES:
            raise RelayError(f"array {name}: dtype {dtype!r} is not one of {', '.join(WIRE_DTYPES)}")
        return Part("array", name, dtype, parse_dims(dims))
    if len(words) != 2 or not words[1].isdigit():
        raise RelayError(f"a {kind} line needs NAME NBYTES, got {value!r}")
    nbytes = int(words[1])
    if kind == "text" and nbytes > RELAY_MAX_TEXT_BYTES:
        raise RelayError(f"{kind} {words[0]} of {nbytes} bytes, over {RELAY_MAX_TEXT_BYTES}")
    return Part(kind, words[0], nbytes=nbytes)


def stream_parts(header: Header) -> list[Part]:
    """The parts whose bytes follow the header on the stream: all of them, but the arrays of a message whose
    ``file`` line says they lie in a payload file."""
    if header.get("file") is None:
        return header.parts
    return [p for p in header.parts if p.kind != "array"]


def text_parts(texts: dict[str, str]) -> tuple[list[Part], list[bytes]]:
    """Text parts for ``texts`` (name → text), and their bytes."""
    data = [text.encode() for text in texts.values()]
    return [Part("text", name, nbytes=len(b)) for name, b in zip(texts, data)], data


class MessageReader:
    """Messages out of a byte stream fed in pieces (a non-blocking socket's reads): ``feed`` returns the messages
    it completed, each a header and its parts' bytes (name → bytes, nulls left out), in order.

    Raises (from ``feed``):
        RelayError: a header over the bound or malformed: the stream cannot be read further.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Header, dict[str, bytes]]]:
        self._buffer += data
        done = []
        while True:
            message = self._next()
            if message is None:
                return done
            done.append(message)

    def _next(self) -> tuple[Header, dict[str, bytes]] | None:
        buffer = self._buffer
        if len(buffer) < LENGTH.size:
            return None
        length = header_length(bytes(buffer[:LENGTH.size]))
        if len(buffer) < LENGTH.size + length:
            return None
        header = parse_header(bytes(buffer[LENGTH.size:LENGTH.size + length]))
        at = LENGTH.size + length
        inline = stream_parts(header)
        end = at + sum(part_nbytes(p) for p in inline)
        if len(buffer) < end:
            return None
        parts = {}
        for part in inline:
            n = part_nbytes(part)
            if part.kind != "null":
                parts[part.name] = bytes(buffer[at:at + n])
            at += n
        del buffer[:end]
        return header, parts

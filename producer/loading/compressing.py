"""A producer's compression: the pool that compresses a batch's frames, and the codec each task's batch uses.

:class:`FrameCompressor` compresses the frames of a batch on a small thread pool (``ferry-compress``; lz4 and
zstandard release the GIL) with the frame codec of :mod:`ferry.common.compression`.

The consumer decides: each TASK names the codec for its batch (``compression``; absent: none), "auto"
included (:mod:`ferry.consumer.core.compression` chooses it from what the consumer sees). Its WELCOME lists
the codecs it can decompress (``codecs``). :class:`LinkCodec` turns that into the codec of each task, with
the producer's ``--compression`` flag, when given, overriding the TASK: ``none`` never compresses, ``lz4`` /
``zstd`` always do (frames that do not shrink still travel raw), ``auto`` follows the TASK like no flag.
Whoever asked, a codec the consumer did not list, or whose library is missing here, is never sent: the batch
travels raw and the reason is logged once.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ferry.common import compression as comp
from ferry.common.compression import compress_frame, decide_shuffle
from ferry.common.constants import MIN_COMPRESS_FRAME_BYTES

log = logging.getLogger("ferry.producer")


@dataclass
class Compressed:
    """The result of :meth:`FrameCompressor.apply`."""

    spec: Any
    frames: list[Any]
    compressed: set[int]  # the indices of the frames that were replaced by compressed bytes


class FrameCompressor:
    """Compresses the frames of a batch on a small thread pool (lz4 and zstandard release the GIL), started on
    first use. ``close()`` joins its threads."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("the frame compressor is closed")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="ferry-compress")
            return self._pool

    def apply(self, name: str, spec: Any, frames: list[Any]) -> Compressed:
        """Compress the frames of every array leaf of ``spec`` (slot leaves have none) with codec ``name``;
        frames that do not shrink stay as they are. Returns the new spec and frames."""
        leaves = _array_nodes(spec)
        jobs = []
        pool = self._executor()
        for node in leaves:
            first, count = node["f"], node.get("n", 1)
            itemsize = np.dtype(node["d"]).itemsize
            if len(frames[first]) < MIN_COMPRESS_FRAME_BYTES:
                continue
            step = decide_shuffle(name, frames[first], itemsize)
            for index in range(first, first + count):
                jobs.append((node, index - first, index, pool.submit(compress_frame, name, frames[index], step)))
        out = list(frames)
        marks: dict[int, list] = {}
        for node, position, index, future in jobs:
            result = future.result()
            if result is None:
                continue
            out[index], entry = result
            marks.setdefault(id(node), [node, [None] * node.get("n", 1)])[1][position] = entry
        for node, entries in marks.values():
            node["z"] = entries
        return Compressed(spec, out, {index for _, _, index, f in jobs if f.result() is not None})

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _array_nodes(spec: Any) -> list[dict]:
    """The array nodes of a tree spec that have frames (not slot leaves), in order. Iterative: no recursion."""
    out, stack = [], [spec]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("t") == "a":
                if "f" in node:
                    out.append(node)
            elif isinstance(node.get("v"), list):  # a container ("g", numpy strings, holds its text in "v")
                stack.extend(reversed(node["v"]))
    return out


class LinkCodec:
    """The codec of each task's batch on one consumer link (see the module docstring). Owned by the main loop.

    Args:
        endpoint: the consumer's, for log lines.
        override: the producer's ``--compression`` ("auto", "lz4", "zstd", "none"), or None to follow the TASKs.
    """

    def __init__(self, endpoint: str, override: str | None) -> None:
        self.endpoint = endpoint
        self.override = override if override in (*comp.CODECS, "none") else None  # "auto": follow the TASKs
        self.codecs: tuple[str, ...] = ()  # what the consumer can decompress (its WELCOME)
        self.last: str | None = None  # the codec of the latest task (PING reports it)
        self._warned: set[str] = set()

    def welcome(self, header: dict[str, Any]) -> None:
        """The consumer's WELCOME: the codecs it can decompress. No codec library is loaded here: a link whose
        tasks never name one (a local link) never loads one."""
        self.codecs = tuple(c for c in header["codecs"] if c in comp.CODECS)

    def task(self, header: dict[str, Any]) -> str | None:
        """The codec for the batch answering the TASK ``header``, or None (raw)."""
        asked = header.get("compression") or "none"
        if self.override is not None and self.override != asked:  # the operator's word wins: said once per codec
            self._warn(f"override-{asked}", logging.INFO, "--compression %s: batches to %s use it whatever the "
                       "consumer's tasks ask (one asked for %s; the loader's compression= does not apply here)",
                       self.override, self.endpoint, asked)
        wanted = self.override or asked
        self.last = self._usable(wanted)
        return self.last

    def _usable(self, name: str) -> str | None:
        if name not in comp.CODECS:
            return None
        if name not in self.codecs:
            self._warn(f"consumer-{name}", logging.WARNING, "compression %r asked for, but the consumer at %s cannot "
                       "decompress it (it has %s); batches travel uncompressed", name, self.endpoint,
                       ", ".join(self.codecs) or "no codec")
            return None
        try:
            comp.require(name)
        except comp.CompressionUnavailable as exc:
            self._warn(name, logging.ERROR, "%s; batches to %s travel uncompressed", exc, self.endpoint)
            return None
        return name

    def _warn(self, key: str, level: int, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.log(level, message, *args)

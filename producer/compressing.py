"""A producer's compression: the pool that compresses a batch's frames, and which codec each link uses.

:class:`FrameCompressor` compresses the frames of a batch on a small thread pool (``ferry-compress``; lz4 and
zstandard release the GIL) with the frame codec of :mod:`ferry.common.compression`, and probes the codecs on
the producer's own data: :class:`Rates` keeps what it measured.

The consumer's WELCOME says what it wants (``compression``: auto, lz4, zstd or none; absent from older
consumers: none) and which codecs it can decompress (``codecs``); the producer's ``--compression`` flag, when
given, overrides the mode. :class:`LinkCompression` turns that into a codec per task:

* ``none``: never; ``lz4`` / ``zstd``: always (frames that do not shrink still travel raw);
* ``auto``: never on a local endpoint (ipc, inproc, tcp to loopback), decided without measuring. Else
  every ``PROBE_EVERY`` tasks one task also *probes* the codecs on its data (compress and decompress rate,
  ratio; :class:`~ferry.common.compression.Rates`), and every ``EVAL_EVERY`` tasks the codec is chosen again by
  :func:`~ferry.common.compression.choose_codec` from those rates and the link's drain rate, measured by a
  :class:`LinkMeter`. The decision is logged when it changes, and reported in PING's load.

:class:`LinkMeter` is one thread (``ferry-linkmeter``) per measured link: it waits on each sent message's
ZeroMQ tracker in send order and takes ``bytes / (t_done - t_prev_done)`` for every message that was sent
while the previous one was still draining (a backlog: the link, not the producer, set the pace). Messages
sent to an idle link say nothing about its rate and are not counted. Stopped by ``close()``, bounded waits.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

import zmq

from ferry.common import compression as comp
from ferry.common.compression import MIN_FRAME_BYTES, codec, compress_frame, decide_shuffle, shuffle

log = logging.getLogger("ferry.producer")

#: Tasks between two probes of the codecs on the data (the first task probes too).
PROBE_EVERY = 16
#: Tasks between two decisions of "auto", and the early ones (a slow link should not wait 16 batches).
EVAL_EVERY = 16
FIRST_EVALS = (4, 8)
#: Backlogged messages the link rate is averaged over.
METER_WINDOW = 16
_WAIT_SLICE_S = 0.1


class Rates:
    """What a producer measured of each codec on its own data: compress rate (per thread), ratio, and decompress
    rate (the consumer's library is the same; its staging thread decompresses on one core). Thread-safe:
    batch threads write, the main loop reads. Figures decay (each new sample weighs ``1 - KEEP``)."""

    KEEP = 0.75

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compress: dict[str, tuple[float, float]] = {}  # codec -> (raw bytes/s per thread, raw/wire)
        self._decompress: dict[str, float] = {}

    def _blend(self, old: float | None, new: float) -> float:
        return new if old is None else self.KEEP * old + (1 - self.KEEP) * new

    def compressed(self, name: str, raw: int, wire: int, seconds: float) -> None:
        if raw <= 0 or seconds <= 0:
            return
        with self._lock:
            old = self._compress.get(name)
            rate, ratio = raw / seconds, raw / max(1, wire)
            self._compress[name] = (self._blend(old and old[0], rate), self._blend(old and old[1], ratio))

    def decompressed(self, name: str, raw: int, seconds: float) -> None:
        if raw > 0 and seconds > 0:
            with self._lock:
                self._decompress[name] = self._blend(self._decompress.get(name), raw / seconds)

    def snapshot(self) -> dict[str, tuple[float, float, float]]:
        """codec -> (compress raw bytes/s per thread, ratio, decompress raw bytes/s), for the measured ones."""
        with self._lock:
            return {name: (*self._compress[name], self._decompress[name])
                    for name in self._compress if name in self._decompress}


@dataclass
class Compressed:
    """The result of :meth:`FrameCompressor.apply`."""

    spec: Any
    frames: list[Any]
    compressed: set[int]  # the indices of the frames that were replaced by compressed bytes


class FrameCompressor:
    """Compresses the frames of a batch on a small thread pool (lz4 and zstandard release the GIL), and probes
    codecs on the batch's data so that ``"auto"`` knows their rates (:class:`Rates`). ``close()`` joins its
    threads."""

    PROBE_BYTES = 1 << 20

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self.rates = Rates()
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
            if len(frames[first]) < MIN_FRAME_BYTES:
                continue
            step = decide_shuffle(name, frames[first], itemsize)
            for index in range(first, first + count):
                jobs.append((node, index - first, index, pool.submit(self._one, name, frames[index], step)))
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

    def _one(self, name: str, raw: Any, step: int) -> tuple[bytes, list] | None:
        began = time.perf_counter()
        result = compress_frame(name, raw, step)
        seconds = time.perf_counter() - began
        self.rates.compressed(name, len(raw), len(result[0]) if result else len(raw), seconds)
        return result

    def probe(self, frames: list[Any], itemsizes: dict[int, int], names: Sequence[str]) -> None:
        """Measure each codec in ``names`` on up to PROBE_BYTES of the batch's largest frame (compress, then
        decompress); nothing is sent. ``itemsizes``: frame index -> its leaf's itemsize."""
        if not frames:
            return
        index = max(range(len(frames)), key=lambda i: len(frames[i]))
        itemsize = itemsizes.get(index, 1)
        size = min(len(frames[index]), self.PROBE_BYTES) // max(1, itemsize) * max(1, itemsize)
        if size < MIN_FRAME_BYTES:
            return
        raw = memoryview(frames[index])[:size]
        for name in names:
            step = decide_shuffle(name, raw, itemsize)
            began = time.perf_counter()
            data = shuffle(raw, step) if step > 1 else raw
            wire = codec(name).compress(data)
            middle = time.perf_counter()
            codec(name).decompress(wire, size)
            end = time.perf_counter()
            self.rates.compressed(name, size, len(wire), middle - began)
            self.rates.decompressed(name, size, end - middle)

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
            else:
                stack.extend(reversed(node.get("v", [])))
    return out


def frame_itemsizes(spec: Any) -> dict[int, int]:
    """Frame index -> the itemsize of the leaf it belongs to."""
    sizes = {}
    for node in _array_nodes(spec):
        for i in range(node["f"], node["f"] + node.get("n", 1)):
            sizes[i] = np.dtype(node["d"]).itemsize
    return sizes


class LinkMeter:
    """The drain rate of one link, from its messages' trackers (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._sent: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._window: deque[tuple[int, float]] = deque(maxlen=METER_WINDOW)  # (bytes, seconds)
        self._thread = threading.Thread(target=self._run, name=f"ferry-linkmeter-{name}", daemon=True)
        self._thread.start()

    def sent(self, tracker: zmq.MessageTracker, nbytes: int, at: float) -> None:
        """A message of ``nbytes`` on the wire went to ZeroMQ at ``at`` (time.perf_counter())."""
        self._sent.put((tracker, nbytes, at))

    def rate(self) -> float | None:
        """Wire bytes per second while backlogged, or None before any backlog was seen."""
        with self._lock:
            seconds = sum(s for _, s in self._window)
            return sum(b for b, _ in self._window) / seconds if self._window and seconds > 0 else None

    def _run(self) -> None:
        previous_done: float | None = None
        while not self._stop.is_set():
            try:
                tracker, nbytes, at = self._sent.get(timeout=_WAIT_SLICE_S)
            except queue.Empty:
                continue
            while not tracker.done:
                if self._stop.is_set():
                    return
                try:
                    tracker.wait(_WAIT_SLICE_S)
                except zmq.NotDone:
                    continue
            done = time.perf_counter()
            if previous_done is not None and at < previous_done and done > previous_done:
                with self._lock:
                    self._window.append((nbytes, done - previous_done))
            previous_done = done

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * _WAIT_SLICE_S + 1)


class LinkCompression:
    """The codec of one consumer connection (see the module docstring)."""

    def __init__(self, endpoint: str, override: str | None, compressor: FrameCompressor) -> None:
        self.endpoint = endpoint
        self.override = override  # the producer's --compression, or None to follow the consumer
        self.compressor = compressor
        self.local = comp.is_local_endpoint(endpoint)
        self.mode = override or "none"
        self.codecs: tuple[str, ...] = comp.CODECS  # what the consumer can decompress
        self.codec: str | None = None  # what tasks use now
        self.meter: LinkMeter | None = None
        self._tasks = 0
        self._warned: set[str] = set()
        self._welcomed = False
        self._set_mode(self.mode)

    def welcome(self, header: dict[str, Any]) -> None:
        """The consumer's WELCOME: its wish (unless overridden) and the codecs it can decompress."""
        wish = header.get("compression", "none")
        codecs = header.get("codecs")
        # a consumer older than compression says nothing, and can decompress nothing
        codecs = tuple(c for c in codecs if c in comp.CODECS) if isinstance(codecs, list) else ()
        mode = self.override or (wish if wish in comp.MODES else "none")
        if (mode, codecs) == (self.mode, self.codecs) and self._welcomed:
            return  # a repeated WELCOME, or the same consumer again: keep what "auto" learned
        self._welcomed = True
        self.codecs = codecs
        self._set_mode(mode)

    def _set_mode(self, mode: str) -> None:
        self.mode = mode
        self._tasks = 0
        usable = self._usable([mode] if mode in comp.CODECS else [])
        self.codec = usable[0] if usable else None
        if mode != "auto" or self.local:
            # "auto" is off on loopback, ipc and inproc without measuring, so a local link never loads a codec
            # library: in a producer forked from the trainer that load took 100 ms before the first TASK
            return
        if self._usable(comp.CODECS):
            if self.meter is None:
                self.meter = LinkMeter(str(id(self) % 10000))
        elif "auto" not in self._warned:
            self._warned.add("auto")
            log.info("compression 'auto' stays off towards %s: no codec both here and at the consumer "
                     "(pip install 'ferry[lz4]' or 'ferry[zstd]')", self.endpoint)

    def _usable(self, names: Any) -> tuple[str, ...]:
        out = []
        for name in names:
            try:
                comp.require(name)
            except comp.CompressionUnavailable as exc:
                if name not in self._warned:
                    self._warned.add(name)
                    log.error("%s; batches to %s travel uncompressed", exc, self.endpoint)
                continue
            if name in self.codecs:
                out.append(name)
            elif self.mode == name and f"consumer-{name}" not in self._warned:
                self._warned.add(f"consumer-{name}")
                log.warning("compression %r asked for, but the consumer at %s cannot decompress it (it has %s); "
                            "batches travel uncompressed", name, self.endpoint, ", ".join(self.codecs) or "no codec")
        return tuple(out)

    def task(self) -> tuple[str | None, tuple[str, ...]]:
        """The codec for the next task, and the codecs it should probe (none most of the time)."""
        if self.mode != "auto" or self.local or self.meter is None:
            return self.codec, ()
        count, self._tasks = self._tasks, self._tasks + 1
        if count in FIRST_EVALS or (count and count % EVAL_EVERY == 0):
            self._decide()
        probe = self._usable(comp.CODECS) if count % PROBE_EVERY == 0 else ()
        return self.codec, probe

    def _decide(self) -> None:
        link = self.meter.rate() if self.meter is not None else None
        rates = {k: v for k, v in self.compressor.rates.snapshot().items() if k in self._usable(comp.CODECS)}
        choice = comp.choose_codec(link, rates, self.compressor.workers)
        if choice != self.codec:
            figures = ", ".join(f"{k}: ratio {r:.2f}, {c / 1e6:.0f} MB/s per thread, decompress {d / 1e6:.0f} MB/s"
                                for k, (c, r, d) in rates.items())
            log.info("compression towards %s: %s (link %s; %s)", self.endpoint, choice or "off",
                     f"{link / 1e6:.1f} MB/s" if link else "not backlogged", figures or "no codec measured yet")
            self.codec = choice

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()
            self.meter = None

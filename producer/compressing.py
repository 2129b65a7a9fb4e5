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
  :class:`~ferry.producer.linkpace.LinkMeter`. Each change is a trial: it is kept only if the link then
  delivers more raw bytes per second, measured from the pace of the consumer's tasks
  (:class:`~ferry.producer.linkpace.Delivered`); else the codec before it comes back for a hold that doubles
  with each failed trial. The decision is logged when it changes, and reported in PING's load.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ferry.common import compression as comp
from ferry.common.compression import codec, compress_frame, decide_shuffle, shuffle
from ferry.common.constants import MIN_COMPRESS_FRAME_BYTES
from ferry.producer.linkpace import SETTLE_TASKS, Delivered, LinkMeter

log = logging.getLogger("ferry.producer")

#: Tasks between two probes of the codecs on the data (the first task probes too).
PROBE_EVERY = 16
#: Tasks between two decisions of "auto", and the early ones (a slow link should not wait 16 batches).
EVAL_EVERY = 16
FIRST_EVALS = (4, 8, 12)
#: A codec "auto" turns on is kept only if the link then delivers this much more raw data per second than it
#: did without (producer/linkpace.py: ``Delivered``).
TRIAL_GAIN = 1.1
#: After a failed trial "auto" holds the codec it had for this many tasks, doubling up to the maximum.
TRIAL_HOLD_FIRST, TRIAL_HOLD_MAX = 64, 4096
#: A trial that has not seen enough of a starved loop after this many tasks ends, keeping the rule's choice:
#: nothing shows that it costs the loop anything.
TRIAL_MAX_TASKS = 64


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
            if len(frames[first]) < MIN_COMPRESS_FRAME_BYTES:
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
        if size < MIN_COMPRESS_FRAME_BYTES:
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


class LinkCompression:
    """The codec of one consumer connection (see the module docstring)."""

    def __init__(self, endpoint: str, override: str | None, compressor: FrameCompressor, slots: int = 2) -> None:
        self.endpoint = endpoint
        self.slots = slots  # the producer's tasks in flight: credits of the old codec still come after a change
        self.clock = time.perf_counter  # when a task comes in (replaceable in tests)
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
        self._session: Any = None  # the consumer's session: a new one is another loop, measured afresh
        self._set_mode(self.mode)

    def welcome(self, header: dict[str, Any]) -> None:
        """The consumer's WELCOME: its wish (unless overridden) and the codecs it can decompress."""
        wish = header.get("compression", "none")
        codecs = header.get("codecs")
        # a consumer older than compression says nothing, and can decompress nothing
        codecs = tuple(c for c in codecs if c in comp.CODECS) if isinstance(codecs, list) else ()
        mode = self.override or (wish if wish in comp.MODES else "none")
        session = header.get("session")
        if (mode, codecs, session) == (self.mode, self.codecs, self._session) and self._welcomed:
            return  # a repeated WELCOME of the same session: keep what "auto" learned
        self._welcomed, self._session = True, session
        self.codecs = codecs
        self._set_mode(mode)

    def _set_mode(self, mode: str) -> None:
        self.mode = mode
        self._tasks = 0
        # "auto" starts over: a trial, a hold or a rate measured under the old mode or consumer says nothing now
        self.delivered = Delivered(settle_after_change=max(SETTLE_TASKS, self.slots + 2), burst=self.slots)
        self._trial: tuple[str | None, str | None, float, int] | None = None  # (tried, before, its rate, task)
        self._hold_until = 0  # no change while the task count is below this (after a failed trial)
        self._hold = TRIAL_HOLD_FIRST
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

    def task(self, waited: float | None = None, epoch: int = 0) -> tuple[str | None, tuple[str, ...]]:
        """The codec for the next task, and the codecs it should probe (none most of the time). ``waited``: the
        TASK's figure of how long the consumer's loop has waited for batches (absent from older consumers)."""
        if self.mode != "auto" or self.local or self.meter is None:
            return self.codec, ()
        count, self._tasks = self._tasks, self._tasks + 1
        self.delivered.arrived(self.codec, self.clock(), waited, epoch)
        if count in FIRST_EVALS or (count and count % EVAL_EVERY == 0):
            self._decide()
        probe = self._usable(comp.CODECS) if count % PROBE_EVERY == 0 else ()
        return self.codec, probe

    def _decide(self) -> None:
        """Choose the codec again (``choose_codec``), then check that the choice pays. The rule's figures are
        estimates: a receiver busy with its own work also backs the link up, and then decompressing costs it
        more than the wire saves. So a change is a trial: once the pipeline has settled and the loop was seen
        starved for TRIAL_BATCHES gaps between tasks with the new codec, it is kept only if the link delivered
        TRIAL_GAIN times the raw bytes per second it did before;
        else the previous codec comes back and stays for a hold that doubles with each failed trial."""
        if self._trial is not None:
            self._judge_trial()
            return
        if self._tasks <= self._hold_until:  # _tasks counts this task already: held while its number < hold
            return
        link = self.meter.rate() if self.meter is not None else None
        rates = {k: v for k, v in self.compressor.rates.snapshot().items() if k in self._usable(comp.CODECS)}
        choice = comp.choose_codec(link, rates, self.compressor.workers)
        if choice == self.codec:
            return
        figures = ", ".join(f"{k}: ratio {r:.2f}, {c / 1e6:.0f} MB/s per thread, decompress {d / 1e6:.0f} MB/s"
                            for k, (c, r, d) in rates.items())
        link_text = f"{link / 1e6:.1f} MB/s" if link else "not backlogged"
        if not self.delivered.informed:  # a consumer that does not say how long its loop waits: the rule alone
            log.info("compression towards %s: %s (link %s; %s)", self.endpoint, choice or "off", link_text,
                     figures or "no codec measured yet")
            self.codec = choice
            return
        before = self.delivered.rate(self.codec)
        if before is None:  # (never 0: a rate needs bytes and time)
            return  # the loop has not been starved long enough to compare a change with: decide again later
        log.info("compression towards %s: trying %s (link %s; %s)", self.endpoint, choice or "off", link_text,
                 figures or "no codec measured yet")
        self._trial = (choice, self.codec, before, self._tasks)
        self.codec = choice
        self.delivered.changed(choice)

    def _judge_trial(self) -> None:
        tried, previous, before, started = self._trial
        now = self.delivered.rate(tried)
        if now is None and self._tasks - started < TRIAL_MAX_TASKS:
            return  # too few batches yet while the loop waited for data
        self._trial = None
        if now is None:  # the loop hardly waited for data since: nothing shows the codec costs it; keep the rule's
            log.info("compression towards %s: %s kept: the loop seldom waited for data during the trial",
                     self.endpoint, tried or "off")
            return
        if now >= before * TRIAL_GAIN:
            log.info("compression towards %s: %s kept: %.0f MB/s of raw data delivered, against %.0f MB/s with %s",
                     self.endpoint, tried or "off", now / 1e6, before / 1e6, previous or "none")
            self._hold = TRIAL_HOLD_FIRST
            return
        if previous is not None and previous not in self._usable([previous]):
            previous = None  # no longer one the consumer can decompress
        log.info("compression towards %s: back to %s: %s delivered %.0f MB/s of raw data, against %.0f MB/s "
                 "before; no change for %d batches", self.endpoint, previous or "off", tried or "off", now / 1e6,
                 before / 1e6, self._hold)
        self.codec = previous
        self.delivered.changed(previous)
        self._hold_until = self._tasks + self._hold
        self._hold = min(2 * self._hold, TRIAL_HOLD_MAX)

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()
            self.meter = None

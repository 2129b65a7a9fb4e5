"""Which codec a producer uses on each consumer connection, and the link measurements ``"auto"`` needs.

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
from typing import Any

import zmq

from ferry.common import compression as comp

log = logging.getLogger("ferry.producer")

#: Tasks between two probes of the codecs on the data (the first task probes too).
PROBE_EVERY = 16
#: Tasks between two decisions of "auto", and the early ones (a slow link should not wait 16 batches).
EVAL_EVERY = 16
FIRST_EVALS = (4, 8)
#: Backlogged messages the link rate is averaged over.
METER_WINDOW = 16
_WAIT_SLICE_S = 0.1


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

    def __init__(self, endpoint: str, override: str | None, compressor: comp.FrameCompressor) -> None:
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
        if mode == "auto" and not self.local and self._usable(comp.CODECS) and self.meter is None:
            self.meter = LinkMeter(str(id(self) % 10000))
        elif mode == "auto" and not self._usable(comp.CODECS) and "auto" not in self._warned:
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

"""What one consumer link delivers, as "auto" compression (producer/compressing.py) needs to know it.

:class:`LinkMeter` is one thread (``ferry-linkmeter``) per measured link: it waits on each sent message's
ZeroMQ tracker in send order and takes ``bytes / (t_done - t_prev_done)`` for every message that was sent
while the previous one was still draining (a backlog: the link, not the producer, set the pace). Messages
sent to an idle link say nothing about its rate and are not counted. Stopped by ``close()``, bounded waits.

:class:`Delivered` is what the link delivers end to end, in raw bytes per second, per codec: the pace at which
the consumer hands out tasks while its training loop waits for data. It is how a change of codec is judged.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections import deque
from typing import Any

import zmq

#: Backlogged messages the link rate is averaged over.
METER_WINDOW = 16
#: Starved gaps between settled task arrivals a rate needs (Delivered).
TRIAL_BATCHES = 6
#: Tasks not counted: at the start (the first credits come at once, one per slot), and after a change of
#: codec (credits that still come from batches sent the old way).
SETTLE_FIRST, SETTLE_TASKS = 4, 8
#: A gap between two tasks counts when the consumer's loop waited for batches at least this share of it.
STARVED = 0.5
_WAIT_SLICE_S = 0.1

__all__ = ["LinkMeter", "Delivered"]


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


class Delivered:
    """What one link delivers, in raw (uncompressed) bytes per second, per codec (None: uncompressed), while the
    consumer's training loop is starved. Owned by the main loop, which records and reads.

    Measured from TASK arrivals: the consumer issues a task when a credit comes back, so tasks arrive at the
    pace the consumer takes batches in, decompression included (sends, which ZeroMQ queues, run ahead of it).
    But that pace is also the training loop's, when the loop is busy or paused (an evaluation, a checkpoint)
    rather than waiting for data. So each TASK carries ``waited``, the seconds the consumer's loop has spent
    waiting for batches so far, and only the gaps between tasks during which the loop waited for at least
    STARVED of the time count: then the link, not the loop, set the pace. Arrivals are counted only once the
    pipeline has settled after a change of codec (credits that came from batches sent the old way).
    """

    def __init__(self, settle_after_change: int = SETTLE_TASKS, burst: int = SETTLE_FIRST) -> None:
        self._settle_after_change = settle_after_change
        self._burst = burst  # tasks a consumer may hand this producer at once (its slots)
        self._arrivals: dict[str | None, deque[tuple[float, float, int]]] = {}  # (at, consumer's waited, epoch)
        self._sizes: deque[int] = deque(maxlen=METER_WINDOW)  # raw bytes of recent batches
        self._settle = max(SETTLE_FIRST, burst)
        self._epoch: int | None = None
        self.informed = False  # the consumer says how long its loop waited (older consumers do not)

    def sent(self, raw_bytes: int) -> None:
        self._sizes.append(raw_bytes)

    def arrived(self, codec: str | None, at: float, waited: float | None, epoch: int = 0) -> None:
        """A task of ``epoch`` came in at ``at`` (time.perf_counter()) while ``codec`` was in use; ``waited``
        is the TASK's. A new epoch starts with a burst of credits, one per slot: those are not counted."""
        if waited is None:
            return
        self.informed = True
        if self._epoch is not None and epoch != self._epoch:
            self._settle = max(self._settle, self._burst)
        self._epoch = epoch
        if self._settle > 0:
            self._settle -= 1
            return
        self._arrivals.setdefault(codec, deque(maxlen=METER_WINDOW)).append((at, waited, epoch))

    def changed(self, codec: str | None) -> None:
        """The link now uses ``codec``: wait for the pipeline to settle, and measure it afresh."""
        self._settle = self._settle_after_change
        self._arrivals.pop(codec, None)

    def rate(self, codec: str | None) -> float | None:
        """Raw bytes per second with ``codec`` while the loop was starved; None below TRIAL_BATCHES such gaps."""
        arrivals = self._arrivals.get(codec)
        if arrivals is None or not self._sizes:
            return None
        pairs = [(a, b) for a, b in zip(arrivals, list(arrivals)[1:]) if a[2] == b[2]]  # not across epochs
        starved = [b[0] - a[0] for a, b in pairs if b[1] - a[1] >= STARVED * (b[0] - a[0])]
        seconds, size = sum(starved), statistics.fmean(self._sizes)
        if len(starved) < TRIAL_BATCHES or seconds <= 0 or size <= 0:
            return None
        return len(starved) * size / seconds

"""What one consumer link delivers, as "auto" compression (producer/compressing.py) needs to know it.

:class:`LinkMeter` is one thread (``ferry-linkmeter``) per measured link: it waits on each sent message's
ZeroMQ tracker in send order and takes ``bytes / (t_done - t_prev_done)`` for every message that was sent
while the previous one was still draining (a backlog: the link, not the producer, set the pace). Messages
sent to an idle link say nothing about its rate and are not counted. Stopped by ``close()``, bounded waits.

:class:`Delivered` is what the link delivers end to end, in raw bytes per second, per codec: the pace at which
the consumer hands out tasks. It is how a change of codec is judged.
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
#: Settled task arrivals a rate needs (Delivered).
TRIAL_BATCHES = 6
#: Tasks not counted: at the start (the first credits come at once, one per slot), and after a change of
#: codec (credits that still come from batches sent the old way).
SETTLE_FIRST, SETTLE_TASKS = 4, 8
#: A gap between tasks of this many seconds or more, among gaps all under a quarter of it, is a pause of the
#: training loop rather than the pace of the link: left out. (Credits come back in bursts, so gaps of a few
#: milliseconds next to near-zero ones are the pace; a link slow enough for second-long gaps has no pauses.)
PAUSE_S = 1.0
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
    """What one link delivers, in raw (uncompressed) bytes per second, per codec (None: uncompressed). Owned by
    the main loop, which records and reads.

    Measured from TASK arrivals, not from sends: the consumer issues a task when a credit comes back, so in a
    steady state tasks arrive at the pace the consumer takes batches in, decompression included; sends, which
    ZeroMQ queues, run ahead of it. Arrivals are counted only once the pipeline has settled after a change of
    codec (SETTLE_TASKS tasks, whose credits came from batches sent the old way), and a rate is the mean batch
    size times the arrivals over their span (credits come back in bursts: a single gap says little), leaving
    out pauses of the loop (PAUSE_S)."""

    def __init__(self, settle_after_change: int = SETTLE_TASKS) -> None:
        self._settle_after_change = settle_after_change
        self._arrivals: dict[str | None, deque[float]] = {}
        self._sizes: deque[int] = deque(maxlen=METER_WINDOW)  # raw bytes of recent batches
        self._settle = SETTLE_FIRST

    def sent(self, raw_bytes: int) -> None:
        self._sizes.append(raw_bytes)

    def arrived(self, codec: str | None, at: float) -> None:
        """A task came in at ``at`` (time.perf_counter()) while ``codec`` was in use."""
        if self._settle > 0:
            self._settle -= 1
            return
        self._arrivals.setdefault(codec, deque(maxlen=METER_WINDOW)).append(at)

    def changed(self, codec: str | None) -> None:
        """The link now uses ``codec``: wait for the pipeline to settle, and measure it afresh."""
        self._settle = self._settle_after_change
        self._arrivals.pop(codec, None)

    def rate(self, codec: str | None) -> float | None:
        """Raw bytes per second with ``codec``; None below TRIAL_BATCHES settled arrivals or any batch sent."""
        times = self._arrivals.get(codec)
        if times is None or len(times) < TRIAL_BATCHES or not self._sizes:
            return None
        gaps = [b - a for a, b in zip(times, list(times)[1:])]
        paced = [g for g in gaps if g < PAUSE_S]
        # a pause stands out of a measurable pace; bursts a second apart are the pace itself (their gaps near 0)
        if len(paced) < len(gaps) and paced and PAUSE_S / 1000 <= statistics.fmean(paced) and max(paced) < PAUSE_S / 4:
            gaps = paced  # the loop stopped asking for a while (an evaluation, a checkpoint): not the link's pace
        seconds = sum(gaps)
        return len(gaps) * statistics.fmean(self._sizes) / seconds if seconds > 0 else None

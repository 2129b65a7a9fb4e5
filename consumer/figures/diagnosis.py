"""What bounds a run (docs/ARCHITECTURE.md#observability): a verdict from one epoch's figures, for people.

Inputs are what the loader measures anyway: the time the loop waited for data and the time it ran, the
batches delivered per producer, how often the credit window (``buffer_batches``) was full when the loop had
to wait, and the CPU time of the consumer's own threads (io and staging). The wait before the very first
batch of a loader (producers starting, datasets opening) is start-up, not stall: it is left out of both
times. The reasoning, in order:

1. no batches: nothing to diagnose.
2. stall <= STALL_LIMIT: not data-bound; more producers will not speed the loop up.
3. the window was full while the loop waited, and held back a producer that would have taken more tasks: batches
   are in flight but the window is too small for the load latency (Little's law: in flight ~ step rate x batch
   latency); raise ``buffer_batches``. (Producers that each hold all they take are the bound themselves: 5.)
4. the consumer is the bound: producers had free slots while work was queued (the io thread did not hand
   it out in time), or the consumer's threads were busy most of the epoch. More producers will not help.
5. otherwise the producers cannot keep up: at the measured rate per producer, about
   ``ceil(1.1 x step rate / rate per producer)`` producers remove the stall, capped by what the consumer's
   threads can take in (``batches / their CPU seconds``); past the cap, the consumer is the bound, and the
   verdict says so. A slow link looks like slow producers from here: nothing in these figures is evidence
   for the transport, so the verdict never blames it. When every producer runs on this machine and more are
   needed than its usable CPUs minus one (the training loop's), the verdict says the machine cannot run them
   (producers on ipc or loopback run here too, whoever started them).

:class:`EpochLog` logs an epoch's line only when it says something to act on: at INFO when the epoch was
data-bound (stall above STALL_LIMIT over at least MIN_BATCHES batches, the loop's own steps taking at least
MIN_STEP_S on average: a loop that does nothing with its batches has no training to speed up), at WARNING when
that lasts WARN_AFTER_EPOCHS consecutive epochs; every other epoch's line is at DEBUG (``loader.diagnosis()`` and
``stats()`` give it any time).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("ferry.consumer")

#: Above this share of the loop's time spent waiting for data, an epoch is data-bound.
STALL_LIMIT = 0.10
#: An epoch with fewer batches says too little to warn about.
MIN_BATCHES = 20
#: A loop whose steps take less than this on average does nothing with its batches (a toy loop, a scan): its
#: stall is not a training run's, and its epochs are logged at DEBUG. [Unit: second]
MIN_STEP_S = 0.001
#: Consecutive data-bound epochs before the verdict is logged at WARNING rather than INFO.
WARN_AFTER_EPOCHS = 2
#: The consumer's threads busy for this share of the epoch: they are the bound.
CONSUMER_BUSY_LIMIT = 0.8


@dataclass
class EpochFigures:
    batches: int
    wait_s: float
    active_s: float
    producers: int
    batches_by_producer: dict[str, int]
    window_full_waits: int  # __next__ calls that had to wait while the window was full
    idle_waits: int  # __next__ calls that had to wait while producers had free slots and work was queued
    waits: int  # __next__ calls that had to wait at all
    startup_s: float = 0.0  # the wait for the loader's first batch: start-up, left out of wait_s and active_s
    consumer_cpu_s: float | None = None  # CPU seconds of the consumer's io and staging threads; None: unknown
    serial_producers: int = 0  # producers loading a user's dataset class one sample at a time (no --threads)
    local_cpus: int | None = None  # the CPUs this process may use, when every producer runs on this machine


def stall_of(f: EpochFigures) -> float:
    """The share of the loop's time spent waiting for data, start-up left out."""
    active = f.active_s - f.startup_s
    return max(0.0, f.wait_s - f.startup_s) / active if active > 0 else 0.0


def diagnose(f: EpochFigures) -> str:
    active_s = f.active_s - f.startup_s
    if f.batches == 0 or active_s <= 0:
        return "no batches in this epoch: nothing to diagnose"
    wait_s = max(0.0, f.wait_s - f.startup_s)
    stall = wait_s / active_s
    step_s = max(1e-9, (active_s - wait_s) / f.batches)
    head = f"stall {100 * stall:.1f} % over {f.batches} batches (step {1e3 * step_s:.1f} ms"
    head += f"; {f.startup_s:.1f} s of start-up not counted)" if f.startup_s >= 0.05 else ")"
    if stall <= STALL_LIMIT:
        return f"{head}: not data-bound; the loop itself sets the pace, and more producers will not help"
    if f.waits and f.window_full_waits / f.waits > 0.5:
        if f.serial_producers:  # a deeper window queues more tasks behind each producer's one loading thread
            return (f"{head}: bound by the credit window (full in {f.window_full_waits} of {f.waits} waits), but "
                    f"{_serial_text(f.serial_producers, f.producers)}; a deeper window only queues more behind it"
                    f"{_count_text(f, active_s, step_s)}")
        return (f"{head}: bound by the credit window: it was full in {f.window_full_waits} of {f.waits} waits. "
                f"Batches take longer to load than buffer_batches steps; raise buffer_batches (in flight needed "
                f"~ batch latency / step time)")
    rate_all = f.batches / active_s
    want = 1 / step_s
    busy = f.consumer_cpu_s / active_s if f.consumer_cpu_s is not None else None
    ingest = f.batches / f.consumer_cpu_s if f.consumer_cpu_s else None  # batches/s at full use of its threads
    busy_text = f"; its io and staging threads were busy {100 * busy:.0f} % of the epoch" if busy is not None else ""
    if f.waits and f.idle_waits / f.waits > 0.5:
        return (f"{head}: bound by the consumer: producers had free slots while work was queued ({f.idle_waits} "
                f"of {f.waits} waits), so the consumer did not hand it out in time{busy_text}. More producers will "
                f"not help; give the training process more CPU (fewer torch threads, no other busy threads)")
    if busy is not None and busy >= CONSUMER_BUSY_LIMIT:
        return (f"{head}: bound by the consumer{busy_text}, taking in about {rate_all:.0f} batches/s while the "
                f"loop wants {want:.0f}/s. More producers will not help")
    delivering, per_producer, needed = _producers_needed(f, active_s, step_s)
    text = (f"{head}: bound by the producers ({delivering} delivering {per_producer:.1f} batches/s each, the "
            f"loop wants {want:.1f}/s)")
    serial = f"; {_serial_text(f.serial_producers, delivering)}" if f.serial_producers else ""
    if ingest is not None and ingest < 1.1 * want:
        cap = max(delivering, math.floor(ingest / per_producer))
        return (f"{text}: about {cap} producers would feed the consumer to its limit; beyond that the consumer "
                f"is the bound: its io and staging threads take in about {ingest:.0f} batches/s at most, less than "
                f"the loop wants{serial}")
    machine = ""
    if f.local_cpus is not None and needed > max(1, f.local_cpus - 1):
        machine = (f", more than this machine can run: its {f.local_cpus} usable CPUs are shared with the training "
                   f"loop. Run producers on other hosts (docs/deployment.md), or make each one faster "
                   f"(docs/tuning.md)")
    return f"{text}: about {needed} producers would remove the stall{machine}{serial}"


def _producers_needed(f: EpochFigures, active_s: float, step_s: float) -> tuple[int, float, int]:
    """(producers delivering, batches/s each, producers of that speed that remove the stall: 1.1 x the step rate)."""
    delivering = max(1, sum(1 for n in f.batches_by_producer.values() if n > 0))
    per_producer = f.batches / active_s / delivering
    return delivering, per_producer, math.ceil(1.1 / step_s / per_producer)


def _count_text(f: EpochFigures, active_s: float, step_s: float) -> str:
    """``; else about N producers of this speed would remove the stall``, as the producer-bound verdict counts."""
    delivering, _, needed = _producers_needed(f, active_s, step_s)
    return f"; else about {needed} producers of this speed would remove the stall" if needed > delivering else ""


def _serial_text(serial: int, producers: int) -> str:
    """The advice for ``serial`` of ``producers`` producers that load a user's dataset class one sample at a time."""
    who = ("it loads" if producers == 1 else "they load") if serial >= producers else \
        f"{serial} of them load{'s' if serial == 1 else ''}"
    return (f"{who} your dataset class one sample at a time, as a DataLoader worker would: if its __getitem__ is "
            f"thread-safe, producer_threads=4 (--threads 4 by hand) loads 4 at once, which helps loads that wait on "
            f"storage more than they compute")


def cpu_seconds(threads: tuple[threading.Thread, ...]) -> float | None:
    """CPU time of these (live) threads, or None where the platform cannot tell."""
    total = 0.0
    try:
        for thread in threads:
            if thread.ident is None or not thread.is_alive():
                return None
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError):
        return None
    return total


class EpochLog:
    """One verdict per epoch, logged quietly; see the module docstring.

    The loader calls :meth:`first_wait` once, when its first batch arrives, :meth:`start_epoch` at each
    epoch's first ``__next__``, and :meth:`end_epoch` when an epoch is exhausted.
    """

    def __init__(self, consumer_threads: tuple[threading.Thread, ...] = ()) -> None:
        self._threads = consumer_threads
        self._cpu_at_start: float | None = None
        self._stalled_in_a_row = 0
        self.startup_s = 0.0  # the wait for the loader's first batch

    def first_wait(self, seconds: float) -> None:
        self.startup_s = seconds

    def start_epoch(self) -> None:
        self._cpu_at_start = cpu_seconds(self._threads) if self._threads else None

    def consumer_cpu_s(self) -> float | None:
        """CPU seconds of the consumer's threads since the epoch started, or None."""
        now = cpu_seconds(self._threads) if self._threads else None
        return None if now is None or self._cpu_at_start is None else max(0.0, now - self._cpu_at_start)

    def end_epoch(self, epoch: int, figures: EpochFigures) -> str:
        text = diagnose(figures)
        stalled = (figures.batches >= MIN_BATCHES and stall_of(figures) > STALL_LIMIT
                   and figures.active_s >= MIN_STEP_S * figures.batches)
        self._stalled_in_a_row = self._stalled_in_a_row + 1 if stalled else 0
        level = (logging.WARNING if self._stalled_in_a_row >= WARN_AFTER_EPOCHS else
                 logging.INFO if stalled else logging.DEBUG)
        log.log(level, "ferry: epoch %d: %s", epoch, text)
        return text

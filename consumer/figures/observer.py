"""What a loader learns about each epoch, for people: why the loop waited, the periodic progress line, and
the end-of-epoch diagnosis (:mod:`ferry.consumer.figures.diagnosis`); and for engines, the demand gauge
(:mod:`ferry.consumer.figures.demand`), sampled about once a second. Everything here runs on the training thread,
except that ``stats()`` may read the gauge's value from another.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, Callable

from ferry.consumer.figures.demand import DemandGauge, DemandSample
from ferry.consumer.figures.diagnosis import EpochFigures, EpochLog, cpu_seconds, diagnose
from ferry.consumer.figures.counters import Counters, stats_figures

__all__ = ["EpochObserver", "WaitTally", "DEMAND_SAMPLE_S"]

#: How often the demand gauge takes a sample, at most. [Unit: second]
DEMAND_SAMPLE_S = 1.0

log = logging.getLogger("ferry.consumer")


class EpochObserver:
    """Per-epoch figures of one loader.

    Args:
        counters: the loader's counters (time spent waiting and working in this epoch).
        snapshot: the io thread's snapshot (buffered, in flight, per-producer figures).
        capacity: ``buffer_batches``.
        log_every: seconds between progress lines; None: never. [Unit: second]
        threads: the consumer's own threads, whose CPU time is the consumer's load.
        on_demand: called with ``(now, the gauge's value)`` after each demand sample, on this thread (the
            autoscaler of ``local_producers="auto"``), or None.
        on_load: called with ``(the gauge's value, the loop's stall fraction since the last sample)`` after each
            demand sample: what the PINGs tell the producers (a pool exports them per job), or None.
    """

    def __init__(self, counters: Counters, snapshot: Callable[[], dict[str, Any]],
                 *, capacity: int, log_every: float | None,
                 threads: tuple[Any, ...], on_demand: Callable[[float, int | None], None] | None = None,
                 on_load: Callable[[int | None, float], None] | None = None,
                 local_cpus: int | None = None) -> None:
        self._counters, self._snapshot = counters, snapshot
        self._local_cpus = local_cpus  # this machine's usable CPUs: said when every producer runs on it
        self._host = socket.gethostname()  # what a producer on this machine says in its HELLO
        self._capacity, self._log_every = capacity, log_every
        self._waits = WaitTally({"per_producer": {}})
        self._epoch_log = EpochLog(threads)
        self._threads = threads
        self._last_log = time.monotonic()
        self.demand = DemandGauge()
        self._on_demand = on_demand
        self._on_load = on_load
        self._last_sample = float("-inf")
        self._sampled = (0.0, 0.0)  # wait_s and active_s at the last sample

    def started(self) -> None:
        """The first ``__next__`` of an epoch."""
        self._waits = WaitTally(self._snapshot())
        self._epoch_log.start_epoch()

    def first_wait(self, seconds: float) -> None:
        """The loader's very first batch took ``seconds``: start-up, not stall."""
        self._epoch_log.first_wait(seconds)

    def note_wait(self) -> None:
        """``__next__`` found nothing staged: was the window full, or were producers idle?"""
        self._waits.note(self._snapshot(), self._capacity)

    def ended(self, epoch: int, active: Any) -> None:
        """The epoch ran out: log its diagnosis (INFO, or WARNING for a stall that persists)."""
        self._epoch_log.end_epoch(epoch, self.figures(active))

    def diagnosis(self, active: Any) -> str:
        return diagnose(self.figures(active))

    def figures(self, active: Any) -> EpochFigures:
        c, snap, waits = self._counters, self._snapshot(), self._waits
        return EpochFigures(
            batches=active.yielded if active is not None else 0, wait_s=c.epoch_wait_s, active_s=c.epoch_active_s,
            producers=snap["producers"], batches_by_producer=waits.batches_by_producer(snap),
            window_full_waits=waits.window_full, idle_waits=waits.idle, waits=waits.waits,
            startup_s=self._epoch_log.startup_s if active is not None and active.run == 1 else 0.0,
            consumer_cpu_s=self._epoch_log.consumer_cpu_s(),
            serial_producers=sum(1 for p in snap["per_producer"].values() if p.get("serial")),
            local_cpus=self._local_cpus if _all_on_this_machine(snap, self._host) else None,
        )

    def progress(self, now: float, epoch: int, done: int, total: int) -> None:
        """After each batch: a demand sample every DEMAND_SAMPLE_S (then ``on_demand``), one INFO line every
        ``log_every`` seconds."""
        if now - self._last_sample >= DEMAND_SAMPLE_S:
            self._last_sample = now
            c, snap = self._counters, self._snapshot()
            self.demand.add(DemandSample(at=now, batches=c.batches, wait_s=c.wait_s, active_s=c.active_s,
                                         received=c.received, busy_s=snap.get("busy_s", 0.0),
                                         consumer_cpu_s=cpu_seconds(self._threads)))
            if self._on_demand is not None:
                self._on_demand(now, self.demand.value)
            waited, active = c.wait_s - self._sampled[0], c.active_s - self._sampled[1]
            self._sampled = (c.wait_s, c.active_s)
            if self._on_load is not None:
                self._on_load(self.demand.value, min(1.0, waited / active) if active > 0 else 0.0)
        if self._log_every is None or now - self._last_log < self._log_every:
            return
        self._last_log = now
        s = stats_figures(self._counters, self._snapshot(), capacity=self._capacity, epoch=epoch)
        log.info("ferry: epoch %d batch %d/%d | %s MB/s | stall %.1f %% | producers %d | buffered %d + in flight "
                 "%d of %d | re-issued %d, duplicates %d, invalid %d", epoch, done, total, rate_text(s["mb_per_s"]),
                 100 * s["epoch_stall_fraction"], s["producers"], s["buffered"], s["in_flight"], self._capacity,
                 s["reissued"], s["duplicates"], s["invalid_messages"])


def rate_text(mb_per_s: float) -> str:
    """A rate for the progress line: whole MB/s from 10 up, two significant digits below (0.12, not 0)."""
    return f"{mb_per_s:.0f}" if mb_per_s >= 10 else f"{mb_per_s:.2g}"


class WaitTally:
    """Why the training loop waited in one epoch, for the diagnosis: read from io-thread snapshots.

    A wait is counted when ``__next__`` finds nothing staged. It was *window full* when buffered + in flight
    had reached the capacity while tasks were queued and a producer held fewer than it takes (its ``window``:
    slots and tasks ahead): a larger window would have given it more. With every producer holding all it takes,
    the producers are the bound, whatever the window. It was *idle* when a producer had a free slot while tasks
    were queued (the transport or the consumer is slow to hand them out).
    """

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.waits = self.window_full = self.idle = 0
        self._start_batches = {name: p["batches"] for name, p in snapshot["per_producer"].items()}

    def note(self, snapshot: dict[str, Any], capacity: int) -> None:
        self.waits += 1
        producers = snapshot["per_producer"].values()
        free_slot = any(p["in_flight"] < p["slots"] for p in producers)
        if snapshot["buffered"] + snapshot["in_flight"] >= capacity:
            if snapshot["queued"] > 0 and any(p["in_flight"] < p["window"] for p in producers):  # one held back
                self.window_full += 1
        elif free_slot and snapshot["queued"] > 0:  # with nothing queued: the end of the epoch, not idleness
            self.idle += 1

    def batches_by_producer(self, snapshot: dict[str, Any]) -> dict[str, int]:
        """Batches each producer delivered in this epoch."""
        return {name: p["batches"] - self._start_batches.get(name, 0) for name, p in snapshot["per_producer"].items()}


def _all_on_this_machine(snapshot: dict[str, Any], host: str) -> bool:
    """Every producer of ``snapshot`` runs on this machine: over shared memory, ipc or loopback (not ``remote``) and
    on this ``host`` (a loopback link may be a tunnel from another one: ``ssh -L``, ``kubectl port-forward``)."""
    items = snapshot["per_producer"].items()
    return bool(items) and all(not p["remote"] and name.rpartition(":")[0] == host for name, p in items)

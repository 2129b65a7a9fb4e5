"""Counters and figures of a consumer (docs/ARCHITECTURE.md#observability), and the declaration of what ``stats()`` returns.

Each counter has one writer: the io thread counts what arrives, the training thread what it yields and how
long it waited. ``stats()`` reads them all; a read of an int is atomic in CPython, so no lock is needed.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from ferry.common.metrics import COUNTER, GAUGE, Figure

__all__ = ["Counters", "STATS", "stats_figures", "stall_fraction", "WeakStats"]


@dataclass
class Counters:
    # written by the io thread
    received: int = 0
    bytes: int = 0
    duplicates: int = 0
    stale: int = 0  # results tagged with an old session
    invalid_messages: int = 0
    skipped_samples: int = 0
    shared_batches: int = 0  # received through the shared-memory slab (local producers)
    compressed_bytes: int = 0  # wire bytes of compressed frames received
    uncompressed_bytes: int = 0  # their size once decompressed
    # written by the training thread
    batches: int = 0  # yielded to the training loop
    bytes_yielded: int = 0
    wait_s: float = 0.0  # time __next__ spent waiting for a batch
    waiting_since: float | None = None  # when the wait in progress began (time.monotonic()), else None
    active_s: float = 0.0  # time from an epoch's first __next__ to its latest return
    epoch_wait_s: float = 0.0
    epoch_active_s: float = 0.0
    created: float = field(default_factory=time.monotonic)


def waited_so_far(c: "Counters", now: float) -> float:
    """Seconds the training loop has waited for batches, the wait in progress included (read from the io
    thread; the two fields are read apart, so it may miss the last wait for a moment, never count it twice)."""
    total = c.wait_s  # read before the wait in progress: the training thread clears that first, then adds it
    since = c.waiting_since
    return total + (now - since if since is not None and now > since else 0.0)


def stall_fraction(wait_s: float, active_s: float) -> float:
    return wait_s / active_s if active_s > 0 else 0.0


#: The fields of ``RemoteLoader.stats()``, declared once: a counter only grows over the loader's life, a gauge
#: goes up and down (``epoch_*`` restart each epoch). The Prometheus export takes its types from here.
STATS: tuple[Figure, ...] = (
    Figure("batches", COUNTER, "batches yielded to the training loop"),
    Figure("bytes", COUNTER, "bytes of the batches yielded"),
    Figure("mb_per_s", GAUGE, "MB yielded per second of iteration"),
    Figure("producers", GAUGE, "producers alive now", also="ferry_producers_connected"),
    Figure("producers_needed", GAUGE, "producers of the current speed the loop needs to stop waiting (None until "
           "known; consumer/figures/demand.py)", also="ferry_producers_needed"),
    Figure("local_producers", GAUGE, "producer processes the loader runs on this machine (local mode; under "
           "local_producers=\"auto\" the count it chose; 0 without local mode)"),
    Figure("producers_seen", COUNTER, "producers admitted since the start"),
    Figure("buffered", GAUGE, "batches received and not yet yielded"),
    Figure("in_flight", GAUGE, "tasks sent and not yet answered"),
    Figure("capacity", GAUGE, "the bound on buffered + in flight (buffer_batches)"),
    Figure("wait_s", COUNTER, "seconds the training loop waited for a batch"),
    Figure("active_s", COUNTER, "seconds of iteration"),
    Figure("step_s", GAUGE, "mean seconds of the training step between batches"),
    Figure("stall_fraction", GAUGE, "wait_s / active_s", also="ferry_stall_fraction"),
    Figure("epoch", GAUGE, "the epoch being iterated"),
    Figure("epoch_wait_s", GAUGE, "seconds waited in this epoch"),
    Figure("epoch_stall_fraction", GAUGE, "the stall fraction of this epoch"),
    Figure("received", COUNTER, "batches received"),
    Figure("received_bytes", COUNTER, "bytes received"),
    Figure("reissued", COUNTER, "tasks sent again after a producer was lost"),
    Figure("duplicates", COUNTER, "batches received twice (dropped)"),
    Figure("stale", COUNTER, "results of an old session (dropped)"),
    Figure("invalid_messages", COUNTER, "malformed messages (dropped)"),
    Figure("skipped_samples", COUNTER, "samples dropped by on_error='skip'"),
    Figure("uptime_s", GAUGE, "seconds since the loader was built"),
    Figure("per_producer", None, "figures per producer (name -> dict: batches, bytes, in_flight, slots, ahead, "
                                 "window (the most tasks it holds: slots and ahead, capped), serial, remote (on "
                                 "another machine: no shared memory, ipc or loopback), joined_s, batches_per_s "
                                 "since it joined, silent_s since last heard)"),
    Figure("shared_memory", None, "the shared-memory slab: slots, free, lost (None without one)"),
    Figure("shared_batches", COUNTER, "batches received through shared memory"),
    Figure("compressed_bytes", COUNTER, "wire bytes of the compressed frames received"),
    Figure("uncompressed_bytes", COUNTER, "bytes those compressed frames hold (their ratio is the compression's)"),
)


def stats_figures(c: Counters, io: dict[str, Any], *, capacity: int, epoch: int,
                  producers_needed: int | None = None, local_producers: int = 0) -> dict[str, Any]:
    """The ``stats()`` dict, from the training thread's counters, the io thread's snapshot ``io``, the demand
    gauge's value and the count of local producers."""
    values = {
        "batches": c.batches,
        "bytes": c.bytes_yielded,
        "mb_per_s": c.bytes_yielded / 1e6 / c.active_s if c.active_s > 0 else 0.0,
        "producers": io.get("producers", 0),
        "producers_needed": producers_needed,
        "local_producers": local_producers,
        "producers_seen": io.get("producers_seen", 0),
        "buffered": io.get("buffered", 0),
        "in_flight": io.get("in_flight", 0),
        "capacity": capacity,
        "wait_s": c.wait_s,
        "active_s": c.active_s,
        "step_s": (c.active_s - c.wait_s) / c.batches if c.batches else 0.0,
        "stall_fraction": stall_fraction(c.wait_s, c.active_s),
        "epoch": epoch,
        "epoch_wait_s": c.epoch_wait_s,
        "epoch_stall_fraction": stall_fraction(c.epoch_wait_s, c.epoch_active_s),
        "received": c.received,
        "received_bytes": c.bytes,
        "reissued": io.get("reissued", 0),
        "duplicates": c.duplicates,
        "stale": c.stale,
        "invalid_messages": c.invalid_messages,
        "skipped_samples": c.skipped_samples,
        "uptime_s": max(1e-9, time.monotonic() - c.created),
        "per_producer": io.get("per_producer", {}),
        "shared_memory": io.get("shared_memory"),
        "shared_batches": c.shared_batches,
        "compressed_bytes": c.compressed_bytes,
        "uncompressed_bytes": c.uncompressed_bytes,
    }
    return {f.name: values[f.name] for f in STATS}  # a KeyError here: a field declared but not computed


class WeakStats:
    """The metrics thread's view of a loader's ``stats()``: a weak reference, so that it never keeps the loader
    alive ({} once the loader is closed or gone)."""

    def __init__(self, loader: Any) -> None:
        self._loader = weakref.ref(loader)

    def __call__(self) -> dict[str, Any]:
        loader = self._loader()
        return loader.stats() if loader is not None and not loader.closed else {}

"""One pass over one epoch's plan: what ``iter(loader)`` returns.

The iterator owns its position (``yielded`` of ``total``, from ``first_seq``; within a shard for a sharded run, each
stream's batches for an iterable one),
which is what ``state_dict()`` saves while it runs, and the time accounting of the training thread (wait versus
active time, lifetime and per epoch). It takes staged batches from the staging thread's queue with bounded
waits (each at most the loader's ``timeout``, DataLoader's limit on one batch), gives each batch's credit back to
the io thread, makes the current CUDA stream wait for the batch's copy,
applies ``device_transform`` and raises a failed batch's error at its position; over an iterable dataset it warns,
as DataLoader, when more batches come than the ``len(dataset)`` that ``len(loader)`` read. It uses the loader's parts
(:class:`EpochParts`), never the loader, so that the two never form a reference cycle: the parts hold the
loader's *lease* on its pipeline, which the loader holds too, and the pipeline stops when the last of them
is dropped (a ``break``, a ``del``), by reference counting alone.
"""

from __future__ import annotations

import math
import queue
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from ferry.common.constants import POLL_SLICE_S
from ferry.common.errors import BatchTimeoutError

from ferry.consumer.core import Delivery, Sequencer, is_eof
from ferry.consumer.figures.counters import Counters
from ferry.consumer.resume import ResumePoint
from ferry.consumer.staging.tensors import iter_tensors

__all__ = ["EpochParts", "EpochIterator", "RunCounter"]

_NOTHING = object()  # what an empty ``staged`` queue gave


class RunCounter:
    """Which run (iteration of a loader) is the newest: only its iterator may advance."""

    def __init__(self) -> None:
        self.current = 0


@dataclass(frozen=True)
class EpochParts:
    """What an epoch iterator uses of its loader.

    Attributes:
        staged: staged batches, in order (the staging thread's output).
        release: gives one credit of a run back (the io thread's ``release``, which may hold it back a while).
        flush_credits: returns the credits ``release`` held back (the io thread's ``flush_credits``): called
            whenever the loop is about to wait for a batch.
        check_health: raises when the loader is closed or cannot deliver any more (no producers, a thread failed).
        observer: the per-epoch figures: waits, progress lines, the diagnosis at the end.
        counters: the figures this thread writes (batches yielded, time waited and active).
        runs: which run is the newest.
        stream_for: the current CUDA stream of the loader's device (None on the CPU).
        device_transform: applied to each batch on its device, or None.
        lease: the loader's lease on its pipeline. The loader and each of its iterators hold it, so the
            producers and threads run while either is referenced (``for b in RemoteLoader(...)`` holds only
            the iterator) and stop when the last goes, without waiting for the garbage collector.
        timeout: how long one ``__next__`` waits for its batch before BatchTimeoutError [Unit: second]; 0: no
            limit (DataLoader's ``timeout``).
    """

    staged: "queue.Queue[Any]"
    release: Callable[[int], None]
    flush_credits: Callable[[], None]
    check_health: Callable[[], None]
    observer: Any
    counters: Counters
    runs: RunCounter
    stream_for: Callable[[], Any]
    device_transform: Callable[[Any], Any] | None
    lease: object
    timeout: float = 0.0


class EpochIterator:
    """One pass over one epoch's plan, planned by ``sequencer`` (which the io thread then owns) from ``start``."""

    def __init__(self, parts: EpochParts, sequencer: Sequencer, start: ResumePoint, *,
                 warn_past: int | None = None) -> None:
        """``warn_past``: warn at each batch past this many (an iterable dataset's ``len(dataset)``, as
        ``len(loader)`` read it: DataLoader's check)."""
        self._parts = parts
        self.run = sequencer.run
        self.epoch = start.epoch
        self.first_seq = sequencer.first_seq  # plan position of the first batch (past 0 after a resume)
        self.total = sequencer.total  # batches of this pass; None when not known in advance
        self._shard_after = sequencer.shard_after  # a pure function: no reference to the sequencer's state
        self._shard = start.shard
        self._streams_after = sequencer.streams_after  # pure too
        self._streams = sequencer.resume_streams  # read before the io thread owns the sequencer
        self._warn_past = warn_past
        self.yielded = 0  # positions consumed (a failed batch consumes its position too)
        self.finished = False
        self._started: float | None = None
        self._last: float | None = None

    @property
    def position(self) -> ResumePoint:
        """Where a resume goes on from: after the last batch this pass yielded."""
        return ResumePoint(self.epoch, self.first_seq + self.yielded, self._shard, self._streams)

    def __iter__(self) -> "EpochIterator":
        return self

    def __len__(self) -> int:
        if self.total is None:  # discovered while reading: a sharded dataset without shard lengths, an iterable one
            raise TypeError("the length of this epoch is not known in advance: its batches are discovered while "
                            "reading (a sharded dataset without shard_len, an iterable dataset)")
        return self.total - self.yielded

    def __next__(self) -> Any:
        parts = self._parts
        if self.finished:
            raise StopIteration
        if parts.runs.current != self.run:
            raise RuntimeError("a newer iteration of this RemoteLoader has started; this one is abandoned")
        counters = parts.counters
        began = time.monotonic()
        if self._started is None:
            self._started = began
            counters.epoch_wait_s = counters.epoch_active_s = 0.0
            parts.observer.started()
        counters.waiting_since = began
        try:
            item = self._next_item()
        finally:
            now = time.monotonic()
            counters.waiting_since = None  # cleared first: a reader may miss this wait a moment, never count it twice
            counters.wait_s += now - began
            counters.epoch_wait_s += now - began
            if self.run == 1 and began == self._started:  # the loader's first batch: start-up, not stall
                parts.observer.first_wait(now - began)
        if item is None:
            self.finished = True
            self._account(now)
            parts.observer.ended(self.epoch, self)
            raise StopIteration
        self.yielded += 1
        if self._warn_past is not None and self.first_seq + self.yielded > self._warn_past:  # at each, as DataLoader
            warnings.warn(f"the length of this RemoteLoader's IterableDataset was reported to be {self._warn_past} "
                          f"(when len(loader) was asked), but {self.first_seq + self.yielded} batches have been "
                          "fetched: does each stream (get_worker_info().id of num_workers) yield only its own share? "
                          "See torch.utils.data.IterableDataset", UserWarning, stacklevel=2)
        try:
            return self._deliver(item)  # raises RemoteSampleError in place of a failed batch
        finally:
            done = time.monotonic()
            self._account(done)
            total = -1 if self.total is None else self.first_seq + self.total  # -1: not known
            parts.observer.progress(done, self.epoch, self.first_seq + self.yielded, total)

    def _next_item(self) -> Delivery | None:
        """The next item of this run; None at its end. Every wait is bounded, and checks the loader's health.

        Raises:
            BatchTimeoutError: no item came within the loader's ``timeout`` (nothing is consumed: the next call
                waits for the same batch again).
        """
        staged, waited = self._parts.staged, False
        limit = self._parts.timeout if self._parts.timeout > 0 else math.inf
        deadline = time.monotonic() + limit
        while True:
            try:
                item = (staged.get(timeout=max(0.0, min(POLL_SLICE_S, deadline - time.monotonic()))) if waited
                        else staged.get_nowait())
            except queue.Empty:
                item = _NOTHING  # handled outside the except: an error raised there must not chain queue.Empty
            if item is _NOTHING:
                if not waited:
                    waited = True
                    self._parts.flush_credits()  # nothing staged: no credit may wait on this wait
                    self._parts.observer.note_wait()
                    continue
                self._parts.check_health()
                if time.monotonic() >= deadline:
                    raise BatchTimeoutError(
                        f"RemoteLoader timed out after {limit:g} seconds waiting for batch "
                        f"{self.first_seq + self.yielded} of epoch {self.epoch} (timeout={limit:g}: DataLoader's "
                        f"limit on each batch; the next call waits for it again)") from None
                continue
            if is_eof(item):
                if item.run == self.run:
                    return None
                continue
            if item.run == self.run:
                return item  # else left over from an abandoned iteration

    def _deliver(self, item: Delivery) -> Any:
        parts = self._parts
        parts.release(item.run)
        self._shard = self._shard_after(item.seq)
        self._streams = self._streams_after(self._streams, item.seq)
        if item.error is not None:
            error, item.error = item.error, None
            try:
                raise error
            finally:  # the traceback holds this frame: its locals must not hold the error (a cycle, freed by gc only)
                del error
        tree = item.tree
        if item.event is not None:
            stream = parts.stream_for()
            stream.wait_event(item.event)
            for tensor in iter_tensors(tree):
                tensor.record_stream(stream)
        if parts.device_transform is not None:
            tree = parts.device_transform(tree)
        parts.counters.batches += 1
        parts.counters.bytes_yielded += item.nbytes
        return tree

    def _account(self, now: float) -> None:
        counters = self._parts.counters
        span = now - (self._last or self._started)
        counters.active_s += span
        counters.epoch_active_s += span
        self._last = now

"""One pass over one epoch's plan (what ``iter(loader)`` returns), and the tally of why it waited.

The iterator owns its position (``yielded`` of ``total``, from ``first_seq``) and the time accounting of the
training thread (wait versus active time, lifetime and per epoch). Everything else it needs from the loader
comes through :class:`EpochHooks`, a handful of callables the loader hands over: the iterator never reads
the loader's members.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from ferry.consumer.buffer import Delivery
from ferry.consumer.figures.counters import Counters

__all__ = ["EpochHooks", "EpochIterator"]


@dataclass(frozen=True)
class EpochHooks:
    """What an epoch iterator may ask of its loader.

    Attributes:
        counters: the figures it accounts time into (the training thread is their one writer).
        is_current: whether the iterator of ``run`` is still the loader's newest.
        next_delivery: the next item of ``run``, or None at its end; bounded waits; raises when the loader
            is unhealthy (no producers, a thread failed, closed).
        deliver: the batch of an item, on its device, transformed; raises a failed batch's error.
        began: the first ``__next__`` of an epoch (the per-epoch figures restart).
        ended: the epoch ran out (``epoch`` is done: the next iteration runs ``epoch + 1``).
        progress: called after each batch with ``(now, epoch, done, total)``, for periodic logs.
        first_wait: the seconds the loader's very first batch took to come: start-up, not stall.
    """

    counters: Counters
    is_current: Callable[[int], bool]
    next_delivery: Callable[[int], Delivery | None]
    deliver: Callable[[Delivery], Any]
    began: Callable[[], None]
    ended: Callable[[int], None]
    progress: Callable[[float, int, int, int], None]
    first_wait: Callable[[float], None]


class EpochIterator:
    """One pass over one epoch's plan. Only the newest iterator of a loader may advance.

    ``first_seq`` is the plan position of its first batch (more than 0 after a resume); ``total`` the batches
    of this pass (None when not known in advance: a sharded dataset without shard lengths); ``yielded`` how many positions were consumed (a failed batch consumes its position too).
    """

    def __init__(self, hooks: EpochHooks, run: int, epoch: int, first_seq: int, total: int | None) -> None:
        self._hooks = hooks
        self.run = run
        self.epoch = epoch
        self.first_seq = first_seq
        self.total = total
        self.yielded = 0
        self.finished = False
        self._started: float | None = None
        self._last: float | None = None

    def __iter__(self) -> "EpochIterator":
        return self

    def __len__(self) -> int:
        if self.total is None:  # a sharded dataset without shard lengths: discovered while reading
            raise TypeError("the length of this epoch is not known: the dataset gives no shard_len")
        return self.total - self.yielded

    def __next__(self) -> Any:
        hooks = self._hooks
        if self.finished:
            raise StopIteration
        if not hooks.is_current(self.run):
            raise RuntimeError("a newer iteration of this RemoteLoader has started; this one is abandoned")
        counters = hooks.counters
        began = time.monotonic()
        if self._started is None:
            self._started = began
            counters.epoch_wait_s = counters.epoch_active_s = 0.0
            hooks.began()
        counters.waiting_since = began
        try:
            item = hooks.next_delivery(self.run)
        finally:
            now = time.monotonic()
            counters.waiting_since = None  # cleared first: a reader may miss this wait a moment, never count it twice
            counters.wait_s += now - began
            counters.epoch_wait_s += now - began
            if self.run == 1 and began == self._started:  # the loader's first batch: start-up, not stall
                hooks.first_wait(now - began)
        if item is None:
            self.finished = True
            self._account(now)
            hooks.ended(self.epoch)
            raise StopIteration
        self.yielded += 1  # this position is consumed, even when it raises
        try:
            return hooks.deliver(item)  # raises RemoteSampleError in place of a failed batch
        finally:
            done = time.monotonic()
            self._account(done)
            total = -1 if self.total is None else self.first_seq + self.total  # -1: not known
            hooks.progress(done, self.epoch, self.first_seq + self.yielded, total)

    def _account(self, now: float) -> None:
        counters = self._hooks.counters
        span = now - (self._last or self._started)
        counters.active_s += span
        counters.epoch_active_s += span
        self._last = now

"""Credits going back from the training thread to the io thread, in groups (docs/ARCHITECTURE.md#credits).

Each batch the training loop takes gives a credit back. Waking the io thread for each one costs a wake-up and
a GIL hand-off per batch; :class:`CreditReturns` queues each credit at once but wakes the io thread only for every
:func:`credit_group` of them, and whenever the loop is about to wait for a batch (:meth:`CreditReturns.flush`),
so that no task waits on a loop that is itself waiting. Credits queued without a wake-up are taken at the io
thread's next turn (the next message that arrives wakes it, and it turns at least every heartbeat). Holding a
credit back only ever delays a task: ``buffered + in flight <= buffer_batches`` holds throughout.

On the io thread, :func:`coalesce` turns the queued commands into core events: consecutive credits of one run
become one ``released(run, count)``.
"""

from __future__ import annotations

import queue
from typing import Any, Callable, Iterator

__all__ = ["credit_group", "CreditReturns", "coalesce"]


#: The most credits held back at once, whatever the capacity: each one held back is a task not yet in flight,
#: which a deep window (slow producers, many batches in flight to hide their latency) would miss.
MAX_CREDIT_GROUP = 4


def credit_group(capacity: int) -> int:
    """Credits taken back before the io thread is woken for them: a quarter of ``capacity`` (buffer_batches),
    at least 1 and at most MAX_CREDIT_GROUP. With the default 8, every second batch."""
    return max(1, min(MAX_CREDIT_GROUP, capacity // 4))


class CreditReturns:
    """The training thread's side. ``commands``: the io thread's command queue (a credit is the run's number, an
    int); ``wake``: wakes the io thread. Used by one thread, the training loop's (a stray count from another
    thread would only move a wake-up)."""

    def __init__(self, commands: "queue.SimpleQueue[Any]", wake: Callable[[], None], capacity: int) -> None:
        self._commands, self._wake = commands, wake
        self.group = credit_group(capacity)
        self.unwoken = 0  # credits queued since the io thread was last woken for them

    def release(self, run: int) -> None:
        """One batch (or error) of ``run`` was taken: a credit back, the io thread woken for every group."""
        self._commands.put(run)
        self.unwoken += 1
        if self.unwoken >= self.group:
            self.unwoken = 0
            self._wake()

    def flush(self) -> None:
        """The loop is about to wait for a batch: wake the io thread for the credits queued since the last wake."""
        if self.unwoken:
            self.unwoken = 0
            self._wake()


def coalesce(commands: Iterator[Any]) -> Iterator[tuple[int, int] | Any]:
    """The io thread's side: ``commands`` in order, each run of consecutive credits of one run as ``(run, count)``
    (other commands, callables or None, as they are)."""
    run, count = 0, 0
    for command in commands:
        if isinstance(command, int):
            if count and command != run:
                yield run, count
                count = 0
            run, count = command, count + 1
            continue
        if count:
            yield run, count
            count = 0
        yield command
    if count:
        yield run, count

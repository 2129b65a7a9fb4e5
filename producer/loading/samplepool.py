"""The sample pool: ``--threads`` loading threads that run ``dataset[i]`` (or ``read_into``), with one shortcut.

A batch worker whose batch is one sample (batch size 1, an unbatched loader's task) would hand it to the pool
and then only wait for it; it loads it itself when a loading permit is free, which saves two thread hand-offs
per batch, each a wake-up and a GIL acquisition (docs/performance.md, "The socket path after issue 21"). The
permits, ``threads`` of them, are taken by the pool's threads too, so no more than ``threads`` samples are ever
loading at once, whoever runs them: ``--threads 1`` still means one ``dataset[i]`` at a time. A batch of several
samples goes to the pool whole, in submission order: a worker taking one of its samples could overtake the
samples of batches queued before it and make each of them later.

With one loading thread (a user's dataset class without ``--threads``, or ``--threads 1``), :class:`Turns` makes
the batch workers submit in the order their batches were started, so that samples load in that order, as in a
DataLoader worker.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ferry.common.constants import POLL_SLICE_S

__all__ = ["SamplePool", "Turns"]


class SamplePool:
    """``threads`` loading threads (named ``ferry-sample_N``) and as many permits."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._permits = threading.BoundedSemaphore(threads)
        self._lock = threading.Lock()
        self._queued = 0  # submitted loads not yet holding a permit
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ferry-sample")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on a loading thread."""
        with self._lock:
            self._queued += 1
        return self._pool.submit(self._permitted, fn, *args)

    def run_or_submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on this thread if a permit is free and no submitted load waits for one (it never
        overtakes them; the returned future is then done), else on a loading thread. For a caller that would
        otherwise only wait for the result."""
        with self._lock:
            inline = self._queued == 0 and self._permits.acquire(blocking=False)
        if not inline:
            return self.submit(fn, *args)
        done: Future = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # as a loading thread would: the caller's result() raises it
            done.set_exception(exc)
        finally:
            self._permits.release()
        return done

    def _permitted(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._permits:
            with self._lock:
                self._queued -= 1
            return fn(*args)

    def shutdown(self) -> None:
        """Cancel what has not started; wait for what has."""
        self._pool.shutdown(wait=True, cancel_futures=True)


class Turns:
    """Batches take their turn at a sample pool in the order they were given tickets (the order the producer
    started them). A dataset loaded one sample at a time (a user's class without ``--threads``) then loads its
    samples in the order of its batches, as a DataLoader worker works through its index queue, however the batch
    workers that submit them are scheduled; its global random streams are drawn in that order too.

    Every ticket must be passed once (:meth:`passed` is idempotent): its turn ends, or its job failed or was
    cancelled before it came. :meth:`close` ends every wait (it raises :class:`TurnsClosed`).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._next = 0  # the ticket whose turn it is
        self._passed: set[int] = set()  # tickets passed out of order, before their turn came
        self._closed = False

    def ticket(self) -> int:
        with self._cond:
            return next(self._tickets)

    @contextmanager
    def turn(self, ticket: int) -> Iterator[None]:
        """Wait for ``ticket``'s turn (every earlier ticket passed), hold it, then pass it."""
        try:
            with self._cond:
                while self._next != ticket:  # bounded: each earlier ticket is passed once its job is done or cancelled
                    if self._closed:
                        raise TurnsClosed("the batcher is closing")
                    self._cond.wait(POLL_SLICE_S)
            yield
        finally:
            self.passed(ticket)

    def passed(self, ticket: int) -> None:
        with self._cond:
            if ticket < self._next:
                return
            self._passed.add(ticket)
            while self._next in self._passed:
                self._passed.discard(self._next)
                self._next += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class TurnsClosed(RuntimeError):
    """A turn waited for ended: its batcher closed."""

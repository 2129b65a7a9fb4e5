"""The sample pool: ``--threads`` loading threads that run ``dataset[i]`` (or ``read_into``), with one shortcut.

A batch worker whose batch is one sample (batch size 1, an unbatched loader's task) would hand it to the pool
and then only wait for it; it loads it itself when a loading permit is free, which saves two thread hand-offs
per batch, each a wake-up and a GIL acquisition (docs/performance.md, "The socket path after issue 21"). The
permits, ``threads`` of them, are taken by the pool's threads too, so no more than ``threads`` samples are ever
loading at once, whoever runs them: ``--threads 1`` still means one ``dataset[i]`` at a time. A batch of several
samples goes to the pool whole, in submission order: a worker taking one of its samples could overtake the
samples of batches queued before it and make each of them later.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

__all__ = ["SamplePool"]


class SamplePool:
    """``threads`` loading threads (named ``ferry-sample_N``) and as many permits."""

    def __init__(self, threads: int) -> None:
        self._permits = threading.BoundedSemaphore(threads)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ferry-sample")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on a loading thread."""
        return self._pool.submit(self._permitted, fn, *args)

    def run_or_submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on this thread if a permit is free (the returned future is then done), else on a
        loading thread. For a caller that would otherwise only wait for the result."""
        if not self._permits.acquire(blocking=False):
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
            return fn(*args)

    def shutdown(self) -> None:
        """Cancel what has not started; wait for what has."""
        self._pool.shutdown(wait=True, cancel_futures=True)

"""Whether a loader's parts can still deliver: the checks that end a training-thread wait with an error.

:class:`LoaderHealth` reads the io thread's :class:`~ferry.consumer.io.thread.IoHealth`, the staging thread's
failure and the local producers (:meth:`ferry.consumer.local.LocalProducers.check`), and raises the error
that says why the next batch will not come: :class:`~ferry.common.errors.LoaderClosedError` once the loader
is closed, :class:`~ferry.common.errors.FerryThreadError` for a thread
that failed, :class:`~ferry.common.errors.NoProducersError` after ``no_producer_timeout`` seconds with no
producer (or with producers joining and leaving and no batch), or what the local producers' deaths raise. (The
loader's ``timeout``, DataLoader's limit on each batch, is the epoch iterator's: consumer/epoch.py.)

It holds the loader's parts, never the loader (the loader's ``weakref.finalize`` must run when it is
dropped): the loader is closed once its pipeline's ``stop`` event is set.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ferry.common.errors import FerryThreadError, LoaderClosedError, NoProducersError


class LoaderHealth:
    """The health checks of one loader's io thread, staging thread and local producers."""

    def __init__(self, io: Any, local: Any, staging_failure: list[BaseException], endpoints: tuple[str, ...],
                 timeout: float, stop: Any) -> None:
        self._stop = stop  # a threading.Event, set when the loader closes
        self._io = io  # IoThread
        self._local = local  # LocalProducers, or None
        self._staging_failure = staging_failure  # the staging thread appends what ended it
        self._endpoints = endpoints
        self._timeout = timeout  # no_producer_timeout; math.inf: wait forever

    def check(self) -> None:
        """Raise if the loader is closed, a part failed, or no producer has served for longer than the
        no-producer timeout."""
        if self._stop.is_set():
            raise LoaderClosedError("this RemoteLoader is closed")
        io = self._io.health()
        if io.failure is not None:
            raise FerryThreadError("ferry's io thread failed") from io.failure
        if self._staging_failure:
            raise FerryThreadError("ferry's staging thread failed") from self._staging_failure[0]
        if not io.alive:
            raise FerryThreadError("ferry's io thread is not running")
        # local producers' deaths are seen at once; with another endpoint bound, remote ones may still serve
        if self._local is not None and (len(self._endpoints) == 1 or not io.live_producers):
            self._local.check(served=io.producers_seen > 0)
        if not io.live_producers:
            silent = time.monotonic() - io.no_producer_since
            if silent > self._timeout:
                raise self.no_producers_error(waited=silent)
        elif io.churn >= 2 and time.monotonic() - io.progress_at > self._timeout:  # joining and leaving, no batch
            raise NoProducersError(
                f"no batch arrived for {time.monotonic() - io.progress_at:.1f} s (no_producer_timeout="
                f"{self._timeout:g} s) while producers kept joining and leaving: {io.churn} lost in that time, the "
                f"latest: {io.last_loss}")

    def until_timeout(self) -> Callable[[], None]:
        """A check for a wait that needs a producer: :meth:`check`, and at most the no-producer timeout from now."""
        deadline = time.monotonic() + self._timeout
        timeout = self._timeout

        def bounded() -> None:
            self.check()
            if time.monotonic() > deadline:
                raise self.no_producers_error(waited=timeout)

        return bounded

    def no_producers_error(self, waited: float) -> NoProducersError:
        health = self._io.health()
        refused = (f" A producer refused the dataset this loader names: {health.refused} (start the pool with "
                   f"--allow-dataset <spec>)." if health.refused else "")
        return NoProducersError(
            f"no producer alive for {waited:.1f} s (no_producer_timeout={self._timeout:g} s); the consumer is bound to "
            f"{', '.join(self._endpoints)} and has seen {health.producers_seen} producer(s) in all.{refused} Start "
            f"one with: python -m ferry.producer --connect tcp://<this-host>:<port> --dataset <spec>"
        )

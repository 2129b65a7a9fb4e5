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

import json
import shlex
import time
from typing import Any, Callable

from ferry.common.datasets import importable_module
from ferry.common.endpoints import tcp_address
from ferry.common.errors import FerryThreadError, LoaderClosedError, NoProducersError


class LoaderHealth:
    """The health checks of one loader's io thread, staging thread and local producers."""

    def __init__(self, io: Any, local: Any, staging_failure: list[BaseException], endpoints: tuple[str, ...],
                 timeout: float, stop: Any, start_hint: str = "") -> None:
        """``start_hint``: the command that starts a producer for this loader, as far as it knows
        (:func:`start_hint`)."""
        self._stop = stop  # a threading.Event, set when the loader closes
        self._io = io  # IoThread
        self._local = local  # LocalProducers, or None
        self._staging_failure = staging_failure  # the staging thread appends what ended it
        self._endpoints = endpoints
        self._timeout = timeout  # no_producer_timeout; math.inf: wait forever
        self._start_hint = start_hint or start_hint_for(endpoints, None, None)

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
        rejected = (f" It rejected {health.rejected} producer HELLO(s), the latest: {health.last_rejection}."
                    if health.rejected and not health.refused else "")
        # why the last one went: a producer still running but holding back (a load that hangs, producer/core/stuck.py)
        # says so in its own log; this names the loss it follows
        lost = f" The last one lost: {health.last_loss}." if health.producers_seen and health.last_loss else ""
        return NoProducersError(
            f"no producer alive for {waited:.1f} s (no_producer_timeout={self._timeout:g} s); the consumer is bound to "
            f"{', '.join(self._endpoints)} and has seen {health.producers_seen} producer(s) in all.{lost}{rejected}"
            f"{refused} Start one with: {self._start_hint}"
        )


def start_hint_for(endpoints: tuple[str, ...], dataset: Any, dataset_args: dict[str, Any] | None, *,
                   local: bool = True) -> str:
    """The command that starts a producer for a loader bound to ``endpoints`` and serving ``dataset`` (a spec with
    ``dataset_args``, or an object), with placeholders where the loader cannot know: the host a wildcard bind
    stands for, the importable name of a class defined in the script, the arguments of an object. A loader given
    a dataset object and no local producers (``local`` False) is also told ``local_producers=N``."""
    address = next((a for a in map(tcp_address, endpoints) if a is not None), None)
    if address is not None:
        host, port = address
        connect = f"tcp://{'<this-host>' if host in ('*', '0.0.0.0', '[::]') else host}:{port}"
    else:
        connect = "tcp://<this-host>:<port>"
    if isinstance(dataset, str) and dataset:
        spec = dataset
        args = "".join(f" --dataset-arg {shlex.quote(f'{key}={_arg_text(value)}')}"
                       for key, value in (dataset_args or {}).items())
    elif dataset is not None and importable_module(type(dataset).__module__) not in ("__main__", "builtins"):
        # a class of the training script is imported by the script's name (the producer's fingerprint agrees)
        spec = f"{importable_module(type(dataset).__module__)}:{type(dataset).__qualname__}"
        args = " [--dataset-arg KEY=VALUE ...]"
    else:
        spec, args = "<package.module:YourDataset>", ""
    hint = f"python -m ferry.producer --connect {connect} --dataset {spec}{args}"
    if not local and dataset is not None and not isinstance(dataset, str):
        hint += "; or, to load this dataset object here as DataLoader's workers would, pass local_producers=N"
    return hint


def _arg_text(value: Any) -> str:
    """A dataset argument as ``--dataset-arg`` reads it: a string as it is, else JSON, else (a Path, a numpy
    scalar) its str."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)

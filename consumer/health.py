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
import logging
import shlex
import time
from typing import Any, Callable

from ferry.common.constants import WAITING_NOTICE_EVERY_S, WAITING_NOTICE_S
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
        self._notices = 0  # "waiting for a producer" notices said in the current silence

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
            self._notice_waiting(silent, io.producers_seen)
            return
        self._notices = 0
        if io.churn >= 2 and time.monotonic() - io.progress_at > self._timeout:  # joining and leaving, no batch
            raise NoProducersError(
                f"no batch arrived for {time.monotonic() - io.progress_at:.1f} s (no_producer_timeout="
                f"{self._timeout:g} s) while producers kept joining and leaving: {io.churn} lost in that time, the "
                f"latest: {io.last_loss}")

    def _notice_waiting(self, silent: float, seen: int) -> None:
        """A loader that waits for remote producers says so after WAITING_NOTICE_S, with the command that starts
        one, and again every WAITING_NOTICE_EVERY_S (a WARNING: a script that configured no logging shows it).
        Local producers say why they failed themselves."""
        if self._local is not None:
            return
        if silent < WAITING_NOTICE_S + self._notices * WAITING_NOTICE_EVERY_S:
            return
        self._notices += 1
        gone = f"its {seen} producer(s) left; " if seen else ""
        limit = (f"no_producer_timeout={self._timeout:g} s" if self._timeout != float("inf")
                 else "no_producer_timeout=None: it waits for good")
        logging.getLogger("ferry.consumer").warning(
            "ferry: waiting for a producer for %.0f s (%sbound to %s; %s). Start one with: %s", silent, gone,
            ", ".join(self._endpoints), limit, self._start_hint)

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
                   local: bool = True, collate: Any = None, collate_args: dict[str, Any] | None = None) -> str:
    """The command that starts a producer for a loader bound to ``endpoints`` and serving ``dataset`` (a spec with
    ``dataset_args``, or an object), with its ``collate`` function (a callable or a spec) where it has one, and
    placeholders where the loader cannot know: the host a wildcard bind stands for, the importable name of a class
    defined in the script. A dataset object that holds functions of its own (a ``transform``) cannot be described on
    a command line: the hint says so and how to write the factory that rebuilds it, rather than name a command that
    would drop them. A loader given a dataset object and no local producers (``local`` False) is also told
    ``local_producers=N``."""
    address = next((a for a in map(tcp_address, endpoints) if a is not None), None)
    if address is not None:
        host, port = address
        connect = f"tcp://{'<this-host>' if host in ('*', '0.0.0.0', '[::]') else host}:{port}"
    else:
        connect = "tcp://<this-host>:<port>"
    note = ""
    if isinstance(dataset, str) and dataset:
        spec = dataset
        args = _args_text("--dataset-arg", dataset_args)
    elif dataset is not None and _hooks_of(dataset):
        spec, args = "<package.module:make_dataset>", ""
        note = (f" ({type(dataset).__name__} holds {', '.join(_hooks_of(dataset))}, which a command line cannot "
                f"carry: write make_dataset(), a function that builds this dataset as the script does, "
                f"{type(dataset).__name__}(..., {_hooks_of(dataset)[0]}=...), in a module the producers' host can "
                f"import)")
    elif dataset is not None and importable_module(type(dataset).__module__) not in ("__main__", "builtins"):
        # a class of the training script is imported by the script's name (the producer's fingerprint agrees)
        spec = f"{importable_module(type(dataset).__module__)}:{type(dataset).__qualname__}"
        args = " [--dataset-arg KEY=VALUE ...]"
    else:
        spec, args = "<package.module:YourDataset>", ""
    hint = f"python -m ferry.producer --connect {connect} --dataset {spec}{args}{_collate_text(collate, collate_args)}"
    hint += note
    if not local and dataset is not None and not isinstance(dataset, str):
        hint += "; or, to load this dataset object here as DataLoader's workers would, pass local_producers=N"
    return hint


def _hooks_of(dataset: Any) -> list[str]:
    """The attributes of a dataset object that are functions or callable objects of the user's (a ``transform``,
    a ``loader``): what its spec and JSON arguments cannot rebuild."""
    try:
        attributes = vars(dataset)
    except TypeError:
        return []
    return sorted(name for name, value in attributes.items()
                  if value is not None and callable(value) and not isinstance(value, type)
                  and not name.startswith("__"))


def _collate_text(collate: Any, collate_args: dict[str, Any] | None) -> str:
    """`` --collate SPEC`` (and its arguments) for a collate function, or "" without one."""
    if collate is None:
        return ""
    if isinstance(collate, str):
        spec = collate
    else:
        module = importable_module(getattr(collate, "__module__", "") or "")
        name = getattr(collate, "__qualname__", "")
        spec = (f"{module}:{name}" if module not in ("", "__main__", "builtins") and name and "<" not in name
                else "<package.module:your_collate_fn>")
    return f" --collate {spec}" + _args_text("--collate-arg", collate_args)


def _args_text(flag: str, args: dict[str, Any] | None) -> str:
    return "".join(f" {flag} {shlex.quote(f'{key}={_arg_text(value)}')}" for key, value in (args or {}).items())


def _arg_text(value: Any) -> str:
    """A dataset argument as ``--dataset-arg`` reads it: a string as it is, else JSON, else (a Path, a numpy
    scalar) its str."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)

"""Ferry's producer: a standalone service that loads samples, collates batches and streams them to
consumers over ZeroMQ.

Run it as ``python -m ferry.producer --connect tcp://trainer:5555 --dataset npy-folder --dataset-arg root=/data``
(or ``ferry produce …``). Embed it with :func:`serve`, its one public entry point; the consumer's local
mode starts producers only through it, or through the command line that :func:`command_line` writes for a
:class:`ProducerConfig` (its ``FERRY_*`` variables: :data:`PRODUCER_ENV`).

This package never imports ``consumer``, and imports torch only if the dataset does.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import logging
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from ferry.common.heap import keep_freed_memory
from ferry.producer.cli import command_line
from ferry.producer.config import PRODUCER_ENV, ProducerConfig
from ferry.producer.handle import ServeHandle
from ferry.producer.torch_threads import limit_torch_threads

__all__ = ["serve", "serve_process", "preload", "ProducerConfig", "ServeHandle", "keep_freed_memory", "command_line",
           "PRODUCER_ENV"]

_PR_SET_PDEATHSIG = 1
# keep_freed_memory (and its constants) lives in ferry.common.heap: the consumer sets it too


def preload() -> None:
    """Import every module :func:`serve` needs. A process forked after this call starts serving at once
    instead of importing them first (35 ms alone, 100 ms and more while the trainer and the other producers
    start on the same cores): the consumer's local mode calls it before it forks its producers."""
    import importlib

    for name in ("ferry.common.datasets", "ferry.common.sampleinfo", "ferry.producer.io.service"):
        importlib.import_module(name)


def serve(config: ProducerConfig, dataset: Any = None, *, stop: ServeHandle | None = None) -> int:
    """Serve ``dataset`` (or the one ``config.dataset`` names; neither: only the datasets consumers name, from the
    built-ins and ``config.allow_dataset``) until ``stop`` is set, or SIGTERM/SIGINT where it runs on the main
    thread (they set the same handle). Returns an exit code (:mod:`ferry.producer.exits`): 0 when stopped so.

    ``stop``: a :class:`ServeHandle` that another thread (an engine's actor method, a supervisor) sets to stop this
    call the way SIGTERM does: BYE to every consumer, a drain of at most ``config.drain_timeout`` seconds, then
    return 0. Its ``figures()`` read the producer while it serves. None: a handle of its own (signals only).

    ``dataset`` may be a :class:`ferry.common.deferred_pickle.DeferredPickle` (local mode): it is unpickled here,
    once stderr goes where ``config.stderr_path`` says; a :class:`~ferry.common.deferred_pickle.WithHooks` in it
    brings the hooks (``init``, ``collate``, ``transform``) pickled together with the dataset. With
    ``config.status_file``, the status file says ``starting`` while the dataset opens (producer/status.py). First
    of all it sets how many CPU threads torch's operations use in this process (``config.torch_threads``; by
    default one, as in DataLoader's workers: producer/torch_threads.py).

    Raises:
        DatasetSpecError: the dataset spec cannot be resolved, or a dataset argument is refused (a ConfigError
            in the dataset's constructor).
        DatasetOpenError: a DatasetSpecError too: the dataset failed to open (its constructor, length or
            fingerprint, the transform, the collate class or the init hook raised); the cause is chained.
        ConfigError: the producer cannot start as configured (an endpoint, the metrics port, the status file).
        Exception: whatever unpickling a deferred dataset raises.
    """
    if config.exit_with_parent:  # a local producer: the terminal's Ctrl-C is the trainer's (see ignore_sigint)
        ignore_sigint()
    if config.freeze_inherited:  # before anything allocates: a collection now would walk the parent's objects
        gc.freeze()
    # one CPU thread per torch operation, as in DataLoader's workers, before the dataset is unpickled or opened and
    # before any thread starts: a process forked from a trainer must not run an operation on the OpenMP pool it
    # inherited, and each loading thread takes up the count at its first operation (producer/torch_threads.py)
    limit_torch_threads(config.torch_threads)
    if config.exit_with_parent:
        _die_with_parent(config.trainer_pid)
    if config.stderr_path is not None:
        _stderr_to(config.stderr_path)
    from ferry.common.deferred_pickle import DeferredPickle, WithHooks

    from ferry.producer.status import STARTING, StatusFile

    if isinstance(dataset, DeferredPickle):
        dataset = dataset.load()
    if isinstance(dataset, WithHooks):
        config = dataclasses.replace(config, **dataset.hooks)
        dataset = dataset.dataset
    keep_freed_memory()
    status = StatusFile(config.status_file, config.stuck_after)
    try:
        status.write(STARTING, time.monotonic())
        producer = _opened(config, dataset)
        handle = stop if stop is not None else ServeHandle()
        if threading.current_thread() is threading.main_thread():
            install_signal_handlers(handle, sigint=not config.exit_with_parent)
        handle._attach(producer)
        try:
            return producer.run()
        finally:
            handle._detach()
    finally:
        status.remove()  # the producer's own is gone already; this one where it did not start


def serve_process(config: ProducerConfig, dataset: Any = None) -> None:
    """:func:`serve` as a local producer's ``multiprocessing`` target. Once it returns, the process ends at once
    even where a sample is still loading past the drain timeout (``multiprocessing`` would join that thread at
    exit, so the trainer's ``close()`` and Ctrl-C waited for a slow ``__getitem__``). Its exit status is what
    ``serve`` returns: 0 when stopped as asked, 5 when stuck loads held it (producer/exits.py)."""
    from ferry.producer.exits import exit_past_lingering_threads

    ignore_sigint()  # first, before a forked child runs anything of the trainer's own SIGINT handler
    code = exit_past_lingering_threads(serve(config, dataset), daemons=True)
    if code:
        sys.exit(code)


def _opened(config: ProducerConfig, dataset: Any) -> Any:
    """The dataset opened, the hooks bound and run, and the :class:`~ferry.producer.io.service.Producer` built.

    Raises:
        DatasetOpenError: anything raised in the way that is not a configuration error (see :func:`serve`).
    """
    from ferry.common.datasets import Transformed, bind_hook, resolve_callable, resolve_dataset
    from ferry.common.errors import ConfigError, DatasetOpenError, DatasetSpecError, MissingExtraError
    from ferry.common.sampleinfo import seed_process

    from ferry.producer.io.service import Producer

    try:
        if dataset is None and config.dataset:  # without --dataset: a pool serving only what consumers name
            dataset = resolve_dataset(config.dataset, config.dataset_args)
        if config.transform and dataset is not None:
            dataset = Transformed(dataset, config.transform, config.transform_args)
        if config.collate is not None:  # its spec resolved, its keyword arguments bound
            config = dataclasses.replace(config, collate=bind_hook(config.collate, config.collate_args,
                                                                   "collate function"))
        seed_process(config.seed, worker_id=config.worker_id, num_workers=config.num_workers, dataset=dataset)
        if config.init is not None:
            init = resolve_callable(config.init, "init function") if isinstance(config.init, str) else config.init
            init(config.worker_id)
        return Producer(config, dataset)
    except DatasetSpecError as exc:
        if isinstance(exc, DatasetOpenError) or _is_configuration(exc.__cause__):
            raise
        raise DatasetOpenError(str(exc)) from exc.__cause__
    except (ConfigError, MissingExtraError):
        raise
    except Exception as exc:
        raise DatasetOpenError(f"the dataset {config.dataset_label!r} failed to open: {type(exc).__name__}: "
                               f"{exc}") from exc


def _is_configuration(cause: BaseException | None) -> bool:
    """Whether a DatasetSpecError with this cause is the configuration's fault (the spec does not resolve, a
    module is missing, an argument is refused), not the dataset's failing to open."""
    from ferry.common.errors import ConfigError

    return cause is None or isinstance(cause, (ConfigError, ImportError, TypeError))


def install_signal_handlers(handle: ServeHandle, sigint: bool = True) -> None:
    """SIGTERM and SIGINT (``sigint``; a local producer ignores it) set ``handle``: the producer stops cleanly (BYE,
    exit 0). Main thread only."""

    def handler(signum: int, frame: Any) -> None:
        handle.set()

    signal.signal(signal.SIGTERM, handler)
    if sigint:
        signal.signal(signal.SIGINT, handler)


def ignore_sigint() -> None:
    """A local producer ignores SIGINT: a Ctrl-C in the terminal reaches every process of the trainer's group, and it
    belongs to the trainer, which may trap it to finish its epoch and save a checkpoint, as it can with DataLoader's
    workers. The producer stops when its loader closes (SIGTERM), when the trainer exits, or dies with it (main thread
    only, as ``signal`` allows; a producer started by spec starts in a process group of its own as well)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stderr_to(path: str) -> None:
    """Make the FIFO at ``path`` this process's fd 2. Its reader (the loader that started us) opened it before
    starting us; where it is gone already (ENXIO: no reader) fd 2 stays as it was, and we die with it anyway."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # never blocks: a FIFO without a reader refuses at once
    except OSError:
        return
    os.set_blocking(fd, True)  # writes wait for the reader, as on any pipe, rather than fail
    if sys.stderr is not None:
        sys.stderr.flush()
    if fd != 2:  # 2 itself when we started without a stderr
        os.dup2(fd, 2)
        os.close(fd)
    if not _writes_to_fd2(sys.stderr):
        # started without one, or forked from a trainer whose sys.stderr is not fd 2 (Jupyter, pytest's capture):
        # Python's tracebacks must reach the FIFO too, not an object of the trainer's that nobody reads here
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)


def _writes_to_fd2(stream: object) -> bool:
    try:
        return stream is not None and stream.fileno() == 2  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both an OSError and a ValueError
        return False


def _die_with_parent(trainer_pid: int | None) -> None:
    """Ask Linux to SIGTERM us when the parent dies (local mode), so no producer outlives its trainer. Linux sends
    it when the *thread* that forked us ends: the consumer forks its producers from a thread that lives as long
    as they do (``ferry-local-watch``). Under ``forkserver`` the parent is the fork server, which outlives a
    killed trainer (and every producer keeps it alive): then a daemon thread waits for the trainer's own exit."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the consumer-liveness timeout still ends the work
        logging.getLogger("ferry.producer").debug("PR_SET_PDEATHSIG unavailable")
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
    elif trainer_pid is not None and os.getppid() != trainer_pid:
        _watch_trainer(trainer_pid)


def _watch_trainer(pid: int) -> None:
    """SIGTERM this process when process ``pid`` exits (seen through a pidfd: no polling, no pid reuse)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone already
        os.kill(os.getpid(), signal.SIGTERM)
        return
    except (AttributeError, OSError):  # not Linux >= 5.3: the consumer-liveness timeout still ends the work
        logging.getLogger("ferry.producer").debug("pidfd_open unavailable: the trainer is not watched")
        return

    def wait() -> None:
        select.select([fd], [], [])  # readable once it has exited; for this process's life, as its parent's signal
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="ferry-trainer-watch", daemon=True).start()

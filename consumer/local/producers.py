"""Local mode (docs/ARCHITECTURE.md#local-mode): producer processes that a RemoteLoader starts, owns and stops.

They connect over ``ipc://`` to a socket in a private temporary folder (:mod:`ferry.consumer.local.folder`:
removed on close and at exit, and swept by the next trainer after a death that runs no Python). Two ways to
start one, both through the producer's one public entry point:

* a dataset *spec* (a string): ``python -m ferry.producer …`` as a subprocess, with the command line of its
  ``ProducerConfig`` (:func:`ferry.producer.command_line`); of the environment it inherits, the producer's own
  ``FERRY_*`` variables are left out. Nothing of the training script is re-imported or pickled.
* a dataset *object*: a ``multiprocessing`` process running :func:`ferry.producer.serve` with the same kind
  of config and the object (``fork`` by default on Linux, as DataLoader does; pass ``mp_context="spawn"``
  for objects that must not be forked). The object travels by pickle between our own processes, never on the wire.

Each producer dies with its parent (``PR_SET_PDEATHSIG``). Its stderr is a pipe to this process: for a
subprocess, ``stderr=PIPE``; for a ``multiprocessing`` process, a FIFO in the folder that ``serve`` makes its
fd 2 as it starts (nothing in the trainer is redirected while a child starts). One thread,
``ferry-local-watch``, waits on every pipe and every process sentinel (``Process.sentinel``, or a ``pidfd``
for a subprocess) at once: it copies what a producer writes both to this process's stderr (shown
live, as before) and to ``producer-N.stderr`` in the folder, and it sees a death the moment it happens. A
death is logged at WARNING with the exit code or signal and the tail of that output; the io thread
re-issues the dead producer's tasks to the others. When every local producer is dead, :meth:`check` raises
in the training thread: :class:`ProducerStartupError` if none of them ever served, else
:class:`ProducerDiedError`.

Shutdown order (``close``): mark the set as closing (exits are expected from then on, not reported); SIGTERM
every producer (it says BYE and exits 0), wait, SIGKILL stragglers; stop the watch thread (it copies what is
left in the pipes); close the pipes and files; remove the folder; close the slab last.

With ``shared_memory=(slots, slot_bytes)`` this object also owns the :class:`ferry.common.shm.Slab` that its
producers write batches into (see :mod:`ferry.common.shm`), and closes it last.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import selectors
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from ferry.common import shm
from ferry.common.constants import JOIN_TIMEOUT_S, LOCAL_PRODUCER_LOG_LEVEL
from ferry.common.deferred_pickle import DeferredPickle
from ferry.common.errors import ConfigError, ProducerDiedError, ProducerStartupError
from ferry.common.settings import shared_values
from ferry.common.waker import Waker

from ferry.consumer.local import folder as local_folder
from ferry.consumer.local.children import Child, describe_exit, open_pidfd
from ferry.consumer.options import LocalOptions, TransportOptions

log = logging.getLogger("ferry.consumer")

#: How often the watch thread polls exit codes where the platform gives no sentinel (no pidfd). [Unit: second]
EXIT_POLL_S = 0.1


def _forks(ctx: Any) -> bool:
    """Whether ``ctx`` forks; if so, the modules ``serve`` needs are imported first (``preload``), so that a
    forked producer has none to import before its first batch. Its children freeze what they inherit
    themselves (``ProducerConfig.freeze_inherited``): the trainer's collector is left as it is."""
    if ctx.get_start_method() != "fork":
        return False
    from ferry.producer import preload

    preload()
    return True


class LocalProducers:
    """N producer processes on this machine; see the module docstring."""

    def __init__(self, local: LocalOptions, transport: TransportOptions, dataset: Any, *,
                 dataset_args: dict[str, Any] | None, shared_memory: tuple[int, int] | None = None,
                 base_seed: int | None = None) -> None:
        """``local.count`` producers of ``dataset``, configured by the options they share with the loader.

        Args:
            shared_memory: ``(slots, slot_bytes)`` of the slab to create, or None for none.
            base_seed: producer i seeds its random streams with ``base_seed + i``, as DataLoader's workers do.
        """
        self.folder = local_folder.create()
        self.endpoint = f"ipc://{self.folder}/consumer.sock"
        self.children: list[Child] = []
        self.slab: shm.Slab | None = None
        self._lock = threading.Lock()  # guards exit codes and _closing between the watch thread and the others
        self._closing = False
        self._stop = threading.Event()
        self._waker = Waker()
        self._watch = threading.Thread(target=self._watch_loop, name="ferry-local-watch", daemon=True)
        #: called from the watch thread with (pid, why) for each death it sees, so that the io thread loses
        #: that producer at once instead of after the liveness window; set by the pipeline
        self.on_death: Callable[[int, str], None] | None = None
        try:
            if shared_memory is not None and shm.available():
                try:
                    self.slab = shm.Slab(*shared_memory)
                except OSError as exc:  # e.g. a seccomp profile without memfd_create: the socket still works
                    log.warning("no shared memory for local producers (%s); batches go over the socket", exc)
            config = self._config(local, transport, dataset, dataset_args)
            configs = [dataclasses.replace(config, worker_id=i, seed=None if base_seed is None else base_seed + i)
                       for i in range(local.count)]
            if isinstance(dataset, str):
                for index, seeded in enumerate(configs):
                    self.children.append(self._spawn_cli(index, seeded))
            else:
                ctx = multiprocessing.get_context(local.mp_context or ("fork" if sys.platform == "linux" else "spawn"))
                forks = _forks(ctx)  # then a producer freezes what it inherited (ProducerConfig.freeze_inherited)
                for index, seeded in enumerate(configs):
                    child_config = dataclasses.replace(seeded, freeze_inherited=forks)
                    self.children.append(self._start_process(index, ctx, child_config, dataset))
            self._watch.start()
        except BaseException:
            self.close()
            raise

    def _capture(self, index: int) -> Any:
        # appends only (O_APPEND), read back with pread: the watch thread writes while another thread reads
        return open(os.path.join(self.folder, f"producer-{index}.stderr"), "a+b", buffering=0)

    def _config(self, local: LocalOptions, transport: TransportOptions, dataset: Any,
                dataset_args: dict[str, Any] | None) -> Any:
        """The producers' ProducerConfig: every option it declares with the same setting as the loader's groups
        (threads, slots, heartbeat, liveness, the hooks: common/settings.py), and where to connect."""
        from ferry.producer import ProducerConfig

        if isinstance(dataset, str):
            for name, hook in (("producer_transform", local.transform), ("producer_init", local.init),
                               ("collate_fn", local.collate)):
                if hook is not None and not isinstance(hook, str):
                    raise ConfigError(f"with a dataset spec, {name} must be a spec too "
                                      "('package.module:function'): the producers are new interpreters")
        return ProducerConfig(
            endpoints=(self.endpoint,), dataset=dataset if isinstance(dataset, str) else type(dataset).__qualname__,
            dataset_args=dict(dataset_args or {}), exit_with_parent=True, num_workers=local.count,
            shared_memory=(self.slab.path, self.slab.token) if self.slab is not None else None,
            **shared_values(ProducerConfig, local, transport),
        )

    def _spawn_cli(self, index: int, config: Any) -> Child:
        """``python -m ferry.producer`` with the command line of ``config``; of the environment it inherits, the
        producer's own variables are left out, so that only the loader's options configure it."""
        from ferry.producer import command_line

        log_level = os.environ.get("FERRY_LOG_LEVEL") or LOCAL_PRODUCER_LOG_LEVEL
        argv, env = command_line(config, log_level, environ=os.environ)
        command = [sys.executable, "-m", "ferry.producer", *argv]
        capture = self._capture(index)
        try:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except BaseException:
            capture.close()
            raise
        stderr_fd = os.dup(process.stderr.fileno())
        process.stderr.close()
        os.set_blocking(stderr_fd, False)
        pidfd = open_pidfd(process.pid)
        return Child(index, process, stderr_fd, pidfd, True, capture)

    def _start_process(self, index: int, ctx: Any, config: Any, dataset: Any) -> Child:
        """A ``multiprocessing`` process running ``serve``; its stderr is a FIFO in the folder, which ``serve``
        opens as its fd 2 first thing (``ProducerConfig.stderr_path``). We open the reading end first, so the
        child's open never waits; nothing of ours is redirected, whatever the start method."""
        from ferry.producer import serve

        fifo = os.path.join(self.folder, f"producer-{index}.fifo")
        capture = self._capture(index)
        read_fd = -1
        try:
            os.mkfifo(fifo, 0o600)
            read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # no writer yet: polls as not readable
            process = ctx.Process(target=serve, args=(dataclasses.replace(config, stderr_path=fifo),
                                                      DeferredPickle(dataset)), name="ferry-producer", daemon=False)
            process.start()
        except BaseException:
            if read_fd >= 0:
                os.close(read_fd)
            capture.close()
            raise
        return Child(index, process, read_fd, process.sentinel, False, capture)

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    # --- the watch thread ---------------------------------------------------------------------------
    def _watch_loop(self) -> None:
        """Copy every producer's stderr and see each death at once; see the module docstring."""
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._waker.fileno(), selectors.EVENT_READ, None)
            for child in self.children:
                selector.register(child.stderr_fd, selectors.EVENT_READ, (child, "stderr"))
                if child.sentinel is not None:
                    selector.register(child.sentinel, selectors.EVENT_READ, (child, "exit"))
            polling = any(child.sentinel is None for child in self.children)
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=EXIT_POLL_S if polling else 1.0):
                    if key.data is None:
                        self._waker.drain()
                        continue
                    child, what = key.data
                    if what == "exit":
                        selector.unregister(key.fd)  # readable for good; the exit code is read below
                    elif not child.pump():
                        selector.unregister(key.fd)
                self._note_deaths()
        except BaseException:  # a bug: say so; check() still sees deaths through exit codes
            log.exception("ferry local-producer watch thread failed")
        finally:
            for child in self.children:  # what they wrote last, before close() releases the pipes
                child.pump()
            selector.close()

    def _note_deaths(self) -> None:
        dead = []
        with self._lock:
            if self._closing:
                return
            for child in self.children:
                if child.exit_code is None:
                    code = child.exitcode()
                    if code is not None:
                        child.pump()  # all it wrote is in the pipe now: captured before anyone reports it
                        child.exit_code = code
                        dead.append(child)
            live = sum(child.exit_code is None for child in self.children)
        for child in dead:
            if self.on_death is not None:
                self.on_death(child.pid, f"died ({describe_exit(child.exit_code)})")
            what = "its tasks go to the others" if live else "none is left"
            log.warning("ferry: local %s\n%d of %d local producers live, %s", child.report(), live,
                        len(self.children), what)

    # --- called from the training thread ------------------------------------------------------------
    def check(self, *, served: bool = False) -> None:
        """Raise if every local producer has exited.

        Args:
            served: whether any producer has ever joined this loader (then a death is mid-run).

        Raises:
            ProducerStartupError: all exited and none ever served.
            ProducerDiedError: all exited after serving.
        """
        if not self._watch.is_alive():  # not started, or failed: read the exit codes here
            self._note_deaths()
        with self._lock:
            if not self.children or self._closing or any(c.exit_code is None for c in self.children):
                return
            reports = "\n".join(child.report() for child in self.children)
        n = len(self.children)
        who = "the local producer" if n == 1 else f"all {n} local producers"
        if served:
            raise ProducerDiedError(f"{who} died mid-run:\n{reports}")
        raise ProducerStartupError(f"{who} exited before serving:\n{reports}")

    def close(self) -> None:
        with self._lock:
            self._closing = True
        for child in self.children:
            child.signal_stop()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for child in self.children:
            if not child.wait(max(0.0, deadline - time.monotonic())):
                child.kill()
                child.wait(JOIN_TIMEOUT_S)
        self._stop.set()
        self._waker.wake()
        if self._watch.is_alive():
            self._watch.join(JOIN_TIMEOUT_S)
        self._waker.close()
        for child in self.children:
            child.release()
        self.children.clear()
        local_folder.remove(self.folder)
        if self.slab is not None:
            self.slab.close()

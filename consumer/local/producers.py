"""Local mode (docs/ARCHITECTURE.md#local-mode): producer processes that a RemoteLoader starts, owns, replaces
and stops.

They connect over ``ipc://`` to a socket in a private temporary folder (:mod:`ferry.consumer.local.folder`:
removed on close and at exit, and swept by the next trainer after a death that runs no Python).
:mod:`ferry.consumer.local.launchers` starts one: a subprocess for a dataset spec, a daemonic
``multiprocessing`` process for a dataset object.

One thread, ``ferry-local-watch``, owns the processes. It starts every one of them: Linux sends a producer
its parent-death signal (``PR_SET_PDEATHSIG``) when the *thread* that forked it ends, so they are forked from
this thread, which lives until ``close``, and not from the thread that built the loader (which may end at
once). A trainer that dies, SIGKILL included, still takes them with it. The thread waits on every stderr
pipe and every process sentinel (``Process.sentinel``, or a ``pidfd`` for a subprocess) at once: it copies
what a producer writes both to this process's stderr (shown live) and to its capture file in the folder,
and sees a death the moment it happens. A death is logged at WARNING with the exit code or signal and the
tail of that output, and the io thread re-issues the dead producer's tasks to the others (``on_death``).

The dead producer is then replaced, after a back-off, at most ``RESPAWNS_PER_WINDOW`` times within
``RESPAWN_WINDOW_S`` (:mod:`ferry.consumer.local.respawn`; past the bound it stays dead, said at ERROR),
unless the loader is closing, no producer has served the loader yet (a start-up failure would only repeat),
or it was asked to stop (it exits 0 on SIGTERM or SIGINT, or dies of one). A replacement keeps the producer's
index (its ``worker_id``) and gets a seed of its own (``ferry.common.sampleinfo.producer_seed``). When every
local producer is dead and none is due for replacement, :meth:`check` raises in the training thread:
:class:`ProducerStartupError` if none of them ever served, else :class:`ProducerDiedError`.

Shutdown order (``close``): mark the set as closing (no replacement from then on; exits are expected, not
reported); stop the watch thread (its end sends the producers it started their SIGTERM, through
``PR_SET_PDEATHSIG``); SIGTERM every producer (it says BYE and exits 0), wait, SIGKILL stragglers; copy what
is left in the pipes; close the pipes and files; remove the folder; close the slab last.

With ``shared_memory=(slots, slot_bytes)`` this object also owns the :class:`ferry.common.shm.Slab` that its
producers write batches into (see :mod:`ferry.common.shm`), and closes it last.
"""

from __future__ import annotations

import logging
import selectors
import threading
import time
from typing import Any, Callable

from ferry.common import shm
from ferry.common.constants import (JOIN_TIMEOUT_S, POLL_SLICE_S, RESPAWN_FIRST_DELAY_S, RESPAWN_MAX_DELAY_S,
                                    RESPAWN_WINDOW_S, RESPAWNS_PER_WINDOW)
from ferry.common.errors import ConfigError, ProducerDiedError, ProducerStartupError
from ferry.common.settings import shared_values
from ferry.common.waker import Waker

from ferry.consumer.local import folder as local_folder
from ferry.consumer.local.children import Child, describe_exit
from ferry.consumer.local.launchers import ObjectLauncher, SpecLauncher
from ferry.consumer.local.respawn import Replacements, RespawnBudget
from ferry.consumer.options import LocalOptions, TransportOptions

log = logging.getLogger("ferry.consumer")

#: How often the watch thread polls exit codes where the platform gives no sentinel (no pidfd). [Unit: second]
EXIT_POLL_S = 0.1


class LocalProducers:
    """N producer processes on this machine; see the module docstring."""

    def __init__(self, local: LocalOptions, transport: TransportOptions, dataset: Any, *,
                 dataset_args: dict[str, Any] | None, shared_memory: tuple[int, int] | None = None,
                 base_seed: int | None = None) -> None:
        """``local.count`` producers of ``dataset``, configured by the options they share with the loader.

        Args:
            shared_memory: ``(slots, slot_bytes)`` of the slab to create, or None for none.
            base_seed: producer i seeds its random streams with ``base_seed + i``, as DataLoader's workers do
                (a replacement: see ``ferry.common.sampleinfo.producer_seed``).

        Raises:
            ConfigError: a producer hook that is not a spec with a dataset spec.
            Exception: what starting a producer raised (the others are stopped first).
        """
        self.base_seed = base_seed
        self.folder = local_folder.create()
        self.endpoint = f"ipc://{self.folder}/consumer.sock"
        self.children: list[Child] = []  # the current process of each producer index, in index order
        self.slab: shm.Slab | None = None
        self._lock = threading.Lock()  # guards children, exit codes, _closing and the replacement plans
        self._closing = False
        self._replacements = Replacements(RespawnBudget(limit=RESPAWNS_PER_WINDOW, window=RESPAWN_WINDOW_S,
                                                        first_delay=RESPAWN_FIRST_DELAY_S,
                                                        max_delay=RESPAWN_MAX_DELAY_S))
        self._stop = threading.Event()
        self._waker = Waker()
        self._started = threading.Event()
        self._start_failure: BaseException | None = None
        self._watch = threading.Thread(target=self._own, args=(local.count,), name="ferry-local-watch", daemon=True)
        #: called from the watch thread with (pid, why) for each death it sees, so that the io thread loses
        #: that producer at once instead of after the liveness window; set by the pipeline
        self.on_death: Callable[[int, str], None] | None = None
        #: whether any producer has served this loader yet (set by the pipeline): until then a death is a
        #: start-up failure, reported and not replaced
        self.served: Callable[[], bool] = lambda: False
        try:
            if shared_memory is not None and shm.available():
                try:
                    self.slab = shm.Slab(*shared_memory)
                except OSError as exc:  # e.g. a seccomp profile without memfd_create: the socket still works
                    log.warning("no shared memory for local producers (%s); batches go over the socket", exc)
            config = self._config(local, transport, dataset, dataset_args)
            self._launcher = (SpecLauncher(self.folder, config, base_seed=base_seed) if isinstance(dataset, str)
                              else ObjectLauncher(self.folder, config, dataset, mp_context=local.mp_context,
                                                  base_seed=base_seed))
            self._watch.start()
            self._wait_started()
        except BaseException:
            self.close()
            raise

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

    def _wait_started(self) -> None:
        """Until the watch thread has started every producer (bounded by that thread: it sets the event or ends).

        Raises:
            Exception: what starting a producer raised there.
        """
        while not self._started.wait(POLL_SLICE_S) and self._watch.is_alive():
            pass
        failure, self._start_failure = self._start_failure, None
        if failure is not None:
            raise failure

    @property
    def pids(self) -> list[int]:
        """The current process of each producer, in index order (a replacement takes its producer's place)."""
        with self._lock:
            return [c.pid for c in self.children]

    # --- the watch thread ---------------------------------------------------------------------------
    def _own(self, count: int) -> None:
        """Start the producers, then watch them until close; see the module docstring."""
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._waker.fileno(), selectors.EVENT_READ, None)
            try:
                for index in range(count):
                    child = self._launcher.launch(index, 0)
                    with self._lock:
                        self.children.append(child)
                    self._register(selector, child)
            except BaseException as exc:  # the constructor re-raises it
                self._start_failure = exc
                return
            finally:
                self._started.set()
            self._watch_loop(selector)
        except BaseException:  # a bug: say so; check() still sees deaths through exit codes
            log.exception("ferry local-producer watch thread failed")
        finally:
            for child in self._current():  # what they wrote last, before close() releases the pipes
                child.pump()
            selector.close()

    def _watch_loop(self, selector: selectors.BaseSelector) -> None:
        while not self._stop.is_set():
            for key, _ in selector.select(timeout=self._select_timeout()):
                if key.data is None:
                    self._waker.drain()
                    continue
                child, what = key.data
                if what == "exit":
                    selector.unregister(key.fd)  # readable for good; the exit code is read below, once
                    # reaped: a process's sentinel pipe closes as it exits, a moment before it can be waited for
                    child.wait(JOIN_TIMEOUT_S)
                elif not child.pump():
                    selector.unregister(key.fd)
            self._note_deaths(replace=True)
            self._replace_due(selector)

    def _select_timeout(self) -> float:
        with self._lock:
            polling = any(child.sentinel is None for child in self.children)
            first_due = self._replacements.next_due()
        timeout = EXIT_POLL_S if polling else 1.0
        return timeout if first_due is None else max(0.0, min(timeout, first_due - time.monotonic()))

    @staticmethod
    def _register(selector: selectors.BaseSelector, child: Child) -> None:
        selector.register(child.stderr_fd, selectors.EVENT_READ, (child, "stderr"))
        if child.sentinel is not None:
            selector.register(child.sentinel, selectors.EVENT_READ, (child, "exit"))

    def _current(self) -> list[Child]:
        with self._lock:
            return list(self.children)

    def _note_deaths(self, *, replace: bool) -> None:
        """Record new deaths, plan their replacements (``replace``), tell the io thread and log each."""
        with self._lock:
            if self._closing:
                return
            dead = []
            for child in self.children:
                if child.exit_code is None:
                    code = child.exitcode()
                    if code is not None:
                        child.pump()  # all it wrote is in the pipe now: captured before anyone reports it
                        child.exit_code = code
                        dead.append(child)
        if not dead:
            return
        served = replace and self.served()  # outside our lock: it reads the io thread's state under its own
        now = time.monotonic()
        with self._lock:
            plans = [self._plan(child, served, now) for child in dead]
            live = sum(child.exit_code is None for child in self.children)
            n = len(self.children)
        for child, (plan, level) in zip(dead, plans):
            if self.on_death is not None:
                self.on_death(child.pid, f"died ({describe_exit(child.exit_code)})")
            what = "its tasks go to the others" if live else "none is left"
            log.log(level, "ferry: local %s\n%d of %d local producers live, %s; %s", child.report(), live, n, what,
                    plan)

    def _plan(self, child: Child, served: bool, now: float) -> tuple[str, int]:
        """Whether and when ``child`` is replaced, in words, and the log level of its death. Under the lock."""
        if self._closing:
            return "the loader is closing", logging.WARNING
        return self._replacements.plan(child.index, child.exit_code, served=served, now=now)

    def _replace_due(self, selector: selectors.BaseSelector) -> None:
        """Start the replacements whose back-off has passed, each in its producer's place."""
        now = time.monotonic()
        with self._lock:  # starting ones stay pending: until they have, check() must not take them for lost
            ready = [] if self._closing else self._replacements.take_ready(now)
        for index in ready:
            old = self.children[index]
            try:
                child = self._launcher.launch(index, old.generation + 1)
            except Exception as exc:  # out of memory, out of pids: try again later, within the same bound
                with self._lock:
                    self._replacements.done(index)
                    plan, _ = self._plan(old, True, time.monotonic())
                log.error("ferry: local producer %d could not be restarted (%s: %s); %s", index,
                          type(exc).__name__, exc, plan)
                continue
            with self._lock:
                self._replacements.done(index)
                closing = self._closing
                if not closing:  # swapped only under the lock: close() never sees a released child
                    for fd in (old.stderr_fd, old.sentinel):
                        if fd is not None and fd in selector.get_map():
                            selector.unregister(fd)
                    old.pump()
                    old.release()
                    self.children[index] = child
            if closing:  # it started while the loader closed: stopped here, as close() stops the others
                child.stop(JOIN_TIMEOUT_S)
                child.pump()
                child.release()
                return
            self._register(selector, child)
            log.info("ferry: local producer %d restarted (pid %d, restart %d)", index, child.pid, child.generation)

    # --- called from the training thread ------------------------------------------------------------
    def check(self, *, served: bool = False) -> None:
        """Raise if every local producer has exited and none is due for replacement.

        Args:
            served: whether any producer has ever joined this loader (then a death is mid-run).

        Raises:
            ProducerStartupError: all exited and none ever served.
            ProducerDiedError: all exited after serving, and none will be replaced.
        """
        if not self._watch.is_alive():  # not started, or failed: read the exit codes here; nothing replaces them
            self._note_deaths(replace=False)
            with self._lock:
                self._replacements.clear()
        with self._lock:
            if (not self.children or self._closing or self._replacements.pending
                    or any(c.exit_code is None for c in self.children)):
                return
            reports = "\n".join(child.report() for child in self.children)
            bound = self._replacements.bound_note()
        n = len(self.children)
        who = "the local producer" if n == 1 else f"all {n} local producers"
        if served:
            raise ProducerDiedError(f"{who} died mid-run{bound}:\n{reports}")
        raise ProducerStartupError(f"{who} exited before serving:\n{reports}")

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._replacements.clear()
        self._stop.set()
        self._waker.wake()
        if self._watch.is_alive():
            self._watch.join(JOIN_TIMEOUT_S)
        children = self._current()
        for child in children:
            child.signal_stop()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for child in children:
            if not child.wait(max(0.0, deadline - time.monotonic())):
                child.kill()
                child.wait(JOIN_TIMEOUT_S)
        self._waker.close()
        for child in children:
            child.pump()  # what they wrote as they stopped
            child.release()
        with self._lock:
            self.children.clear()
        local_folder.remove(self.folder)
        if self.slab is not None:
            self.slab.close()


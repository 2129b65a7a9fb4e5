"""The ``ferry-local-watch`` thread (docs/ARCHITECTURE.md#local-mode): it starts, watches, replaces and stops a
loader's local producers.

It starts every one of them: Linux sends a producer its parent-death signal (``PR_SET_PDEATHSIG``) when the
*thread* that forked it ends, so they are forked from this thread, which lives until ``close``, and not from the
thread that built the loader (which may end at once). A trainer that dies, SIGKILL included, still takes them
with it. The thread waits on every stderr pipe and every process sentinel (``Process.sentinel``, or a ``pidfd``
for a subprocess) at once: it copies what a producer writes both to this process's stderr (shown live) and to its
capture file in the folder, and sees a death the moment it happens. A death is logged at WARNING with the exit
code or signal and the tail of that output, and the io thread re-issues the dead producer's tasks to the others
(``on_death``).

The dead producer is then replaced, after a back-off, at most ``RESPAWNS_PER_WINDOW`` times within
``RESPAWN_WINDOW_S`` (:mod:`ferry.consumer.local.respawn`; past the bound it stays dead, said at ERROR), unless
the loader is closing, no producer has served the loader yet (a start-up failure would only repeat), or it was
asked to stop (it exits 0 on SIGTERM or SIGINT, or dies of one). A replacement keeps the producer's place (its
``worker_id``) and gets a seed of its own (``ferry.common.sampleinfo.producer_seed``).

With ``local_producers="auto"`` the set grows and shrinks to the count that
:meth:`~ferry.consumer.local.LocalProducers.scale_to` asked for (:mod:`.members` plans it). Missing producers
start in the lowest free places, each as a new generation of its place (so with a seed of its own). The surplus
leaves: dead places first (their replacement is called off), then the live producers of the highest places. A
producer asked to stop leaves its place at once, so it is never replaced. The io thread lets it go first
(``on_leave``: its tasks go back to the queue without costing an attempt, and no TASK is sent to it any more;
sent to a producer whose socket had closed, one would find no one and cost its tasks an attempt while its BYE
still waited to be read). Then it gets SIGTERM, says BYE and exits 0, or is killed after ``JOIN_TIMEOUT_S``; its
orderly exit is not reported as a death.
"""

from __future__ import annotations

import logging
import selectors
import threading
import time
from typing import Any

from ferry.common.constants import JOIN_TIMEOUT_S, POLL_SLICE_S
from ferry.common.waker import Waker

from ferry.consumer.local.children import Child, describe_exit
from ferry.consumer.local.members import Members
from ferry.consumer.local.respawn import STOPPED

__all__ = ["Watch", "EXIT_POLL_S"]

log = logging.getLogger("ferry.consumer")

#: How often the watch thread polls exit codes where the platform gives no sentinel (no pidfd). [Unit: second]
EXIT_POLL_S = 0.1


class Watch:
    """The thread that owns the processes; see the module docstring.

    Args:
        launcher: starts one producer (:mod:`ferry.consumer.local.launchers`).
        lock: guards ``members`` and the children's exit codes.
        members: the places and their plans.
        hooks: an object whose ``on_death(pid, why)``, ``on_leave(pid)`` (each or None) and ``served()`` are read
            at each use: the owner, whose pipeline sets them once the io thread runs.
    """

    def __init__(self, launcher: Any, lock: threading.Lock, members: Members, hooks: Any) -> None:
        self._launcher, self._lock, self._members, self._hooks = launcher, lock, members, hooks
        self._generations: dict[int, int] = {}  # place -> the generation of its latest start (this thread only)
        self._stop = threading.Event()
        self._closed_here = False  # stop() was called on this thread itself (the gc, through the loader's finalizer)
        self._waker = Waker()
        self._started = threading.Event()
        self._start_failure: BaseException | None = None
        self.thread = threading.Thread(target=self._own, name="ferry-local-watch", daemon=True)

    def start(self) -> None:
        """Start the thread and wait until it has started the first producers, as many as the members' target
        (bounded by that thread: it sets the event or ends).

        Raises:
            Exception: what starting a producer raised there.
        """
        self.thread.start()
        while not self._started.wait(POLL_SLICE_S) and self.thread.is_alive():
            pass
        failure, self._start_failure = self._start_failure, None
        if failure is not None:
            raise failure

    def wake(self) -> None:
        """From any thread: look at the plans now (a new count)."""
        self._waker.wake()

    def stop(self, timeout: float) -> None:
        """End the thread (the loader closes; the members are marked closing first), and close its waker."""
        self._stop.set()
        if self.thread is threading.current_thread():  # the gc ran the loader's shutdown on this thread
            self._closed_here = True  # it closes its waker as it ends, after this
            return
        self._waker.wake()
        if self.thread.is_alive():
            self.thread.join(timeout)
        self._waker.close()

    # --- the thread ---------------------------------------------------------------------------------
    def _own(self) -> None:
        """Start the producers, then watch them until close."""
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._waker.fileno(), selectors.EVENT_READ, None)
            with self._lock:
                count = self._members.target
            try:
                for index in range(count):
                    if not self._adopt(selector, self._launch(index)):
                        return
            except BaseException as exc:  # start() re-raises it
                self._start_failure = exc
                return
            finally:
                self._started.set()
            self._loop(selector)
        except BaseException:  # a bug: say so; check() still sees deaths through exit codes
            log.exception("ferry local-producer watch thread failed")
        finally:
            with self._lock:
                children = self._members.every()
            for child in children:  # what they wrote last, before close() releases the pipes
                child.pump()
            selector.close()
            if self._closed_here:  # nobody joins this thread to close it
                self._waker.close()

    def _loop(self, selector: selectors.BaseSelector) -> None:
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
            self.note_deaths(replace=True)
            self._replace_due(selector)
            self._reap_retired(selector)
            self._rescale(selector)

    def _select_timeout(self) -> float:
        with self._lock:
            timeout = EXIT_POLL_S if self._members.polling() else 1.0
            first_due = self._members.next_due()
        return max(0.0, min(timeout, first_due - time.monotonic()))

    def _launch(self, index: int) -> Child:
        """Start the next generation of place ``index`` (its first start is generation 0)."""
        generation = self._generations.get(index, -1) + 1
        child = self._launcher.launch(index, generation)
        self._generations[index] = generation
        return child

    @staticmethod
    def _register(selector: selectors.BaseSelector, child: Child) -> None:
        selector.register(child.stderr_fd, selectors.EVENT_READ, (child, "stderr"))
        if child.sentinel is not None:
            selector.register(child.sentinel, selectors.EVENT_READ, (child, "exit"))

    @staticmethod
    def _forget(selector: selectors.BaseSelector, child: Child) -> None:
        """Stop watching ``child``, which has exited: take its last output, close its pipe and sentinel."""
        for fd in (child.stderr_fd, child.sentinel):
            if fd is not None and fd in selector.get_map():
                selector.unregister(fd)
        child.pump()
        child.release()

    @staticmethod
    def _discard(child: Child) -> None:
        """A producer that started as the loader closed: stopped here, as close() stops the others."""
        child.stop(JOIN_TIMEOUT_S)
        child.pump()
        child.release()

    # --- deaths and replacements --------------------------------------------------------------------
    def note_deaths(self, *, replace: bool) -> None:
        """Record new deaths, plan their replacements (``replace``), tell the io thread and log each. Also called
        from the training thread once this thread is gone (then with ``replace=False``)."""
        members = self._members
        with self._lock:
            if members.closing:
                return
            dead = []
            for child in members.children.values():
                if child.exit_code is None:
                    code = child.exitcode()
                    if code is not None:
                        child.pump()  # all it wrote is in the pipe now: captured before anyone reports it
                        child.exit_code = code
                        dead.append(child)
        if not dead:
            return
        served = replace and self._hooks.served()  # outside our lock: it reads the io thread's state under its own
        now = time.monotonic()
        with self._lock:
            plans = [self._plan(child, served, now) for child in dead]
            live = sum(child.exit_code is None for child in members.children.values())
            n = len(members.children)
        on_death = self._hooks.on_death
        for child, (plan, level) in zip(dead, plans):
            if on_death is not None:
                on_death(child.pid, f"died ({describe_exit(child.exit_code)})")
            what = "its tasks go to the others" if live else "none is left"
            log.log(level, "ferry: local %s\n%d of %d local producers live, %s; %s", child.brief(), live, n, what,
                    plan)

    def _plan(self, child: Child, served: bool, now: float) -> tuple[str, int]:
        """Whether and when ``child`` is replaced, in words, and the log level of its death. Under the lock."""
        if self._members.closing:
            return "the loader is closing", logging.WARNING
        return self._members.replacements.plan(child.index, child.exit_code, served=served, now=now)

    def _replace_due(self, selector: selectors.BaseSelector) -> None:
        """Start the replacements whose back-off has passed, each in its producer's place."""
        members = self._members
        with self._lock:  # starting ones stay pending: until they have, check() must not take them for lost
            ready = [] if members.closing else members.replacements.take_ready(time.monotonic())
        for index in ready:
            old = members.children[index]
            try:
                child = self._launch(index)
            except Exception as exc:  # out of memory, out of pids: try again later, within the same bound
                with self._lock:
                    members.replacements.done(index)
                    plan, _ = self._plan(old, True, time.monotonic())
                log.error("ferry: local producer %d could not be restarted (%s: %s); %s", index,
                          type(exc).__name__, exc, plan)
                continue
            with self._lock:
                members.replacements.done(index)
                placed = members.place(child)  # swapped only under the lock: close() never sees a released child
                if placed:
                    self._forget(selector, old)
            if not placed:
                self._discard(child)
                return
            self._register(selector, child)
            log.info("ferry: local producer %d restarted (pid %d, restart %d)", index, child.pid, child.generation)

    # --- scaling ------------------------------------------------------------------------------------
    def _rescale(self, selector: selectors.BaseSelector) -> None:
        """Start or stop producers until the set has the count asked for."""
        with self._lock:
            leaving, free = self._members.rescale(time.monotonic(), JOIN_TIMEOUT_S)
        for child in leaving:
            if child.exit_code is not None:  # dead already: its replacement was called off
                self._forget(selector, child)
                continue
            on_leave = self._hooks.on_leave
            if on_leave is not None:  # the io thread lets it go first: no TASK is sent to it as it stops
                on_leave(child.pid)
            child.signal_stop()  # it says BYE and exits 0; let go of in _reap_retired
            log.info("ferry: local producer %d (pid %d) asked to stop: the loop needs fewer", child.index, child.pid)
        for index in free:
            try:
                child = self._launch(index)
            except Exception as exc:  # out of memory, out of pids: stay as we are until asked again
                with self._lock:
                    self._members.start_failed()
                log.error("ferry: local producer %d could not be started (%s: %s); staying at %d", index,
                          type(exc).__name__, exc, self._members.target)
                return
            if not self._adopt(selector, child):
                return
            log.info("ferry: local producer %d started (pid %d): the loop needs more", index, child.pid)

    def _adopt(self, selector: selectors.BaseSelector, child: Any) -> bool:
        """Place a started ``child`` among the members and watch it; False (the child discarded) when there is
        no place for it any more (the loader is closing)."""
        with self._lock:
            placed = self._members.place(child)
        if not placed:
            self._discard(child)
            return False
        self._register(selector, child)
        return True

    def _reap_retired(self, selector: selectors.BaseSelector) -> None:
        """Let go of the producers asked to stop that have exited; kill those past their time."""
        with self._lock:
            exited, late = self._members.reap(time.monotonic())
        for child in late:
            log.warning("ferry: local producer %d (pid %d) did not stop within %g s of SIGTERM; killing it",
                        child.index, child.pid, JOIN_TIMEOUT_S)
            child.kill()
        for child in exited:
            child.exit_code = child.exitcode()
            if child.exit_code not in STOPPED:  # STOPPED: it said BYE, its tasks went back without an attempt
                child.pump()  # all it wrote, before the report quotes it
                on_death = self._hooks.on_death
                if on_death is not None:  # no BYE: its tasks go back now, not after the liveness window
                    on_death(child.pid, f"died while stopping ({describe_exit(child.exit_code)})")
                log.warning("ferry: local %s", child.brief())
            self._forget(selector, child)

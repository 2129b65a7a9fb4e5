"""The thread that owns every Ray call of :class:`~ferry.ray.RayProducers`: ``ferry-ray-watch``.

It feeds the :class:`~ferry.ray.fleet.Fleet` its events and carries out its actions. Each turn: the commands of
other threads (a count asked for, close), the replacements due, a demand sample once a second (the loader's
gauge, or without a loader the demand its producers hear in their consumer's PINGs), then a wait on every call
still out (``ray.wait``, at most ``POLL_S``): each ``where()`` that answers locates an actor whose producer runs;
each ``serve()`` that ends says how (returned, raised, or its process died: ``ActorDiedError``, or
``ActorUnavailableError`` while Ray restarts it). A death is seen within a turn of the wait, and its ``Gone`` reaches the loader's io thread as a
command: its tasks are issued again at once.

The fleet and the actor handles are changed only here, under ``lock``; ``stats()`` and ``handles()`` read them under
the same lock from other threads.
Ray calls happen after the lock is released (decide under the lock, act after).

Shutdown (``close``): the fleet stops every actor (``stop()``: BYE, drain); each ``serve()`` that returns has its
actor killed; what has not returned within ``stop_timeout`` seconds is killed as it is. Then the thread removes the
key it authorized, lets the dataset's object go, and ends.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ferry.common.errors import LoaderClosedError, ProducerExitError

from ferry.ray.fleet import Action, Fleet, Gone, Kill, Log, Serve, Start, Stop
from ferry.ray.handover import Handover

__all__ = ["Crew", "DEMAND_INTERVAL_S", "POLL_S"]

log = logging.getLogger("ferry.ray")

#: How often the demand is sampled (the loader's gauge changes about once a second). [Unit: second]
DEMAND_INTERVAL_S = 1.0
#: The longest wait of a turn, for commands and the clock; a call that ends wakes it at once. [Unit: second]
POLL_S = 0.2
WHERE, SERVE, FIGURES, STOP = "where", "serve", "figures", "stop"


@dataclass
class _Calls:
    """One place's actor and its calls still out (object ref -> what it is)."""

    actor: Any
    refs: dict[Any, str] = field(default_factory=dict)
    demand: int | None = None  # what its last figures() said the consumers need (separate driver)


class Crew:
    """The watch thread and what it owns; see the module docstring.

    Args:
        fleet: the decisions.
        make_actor: ``place -> actor handle`` (a new actor of the configured class and options).
        handover: the endpoint and keys (its authorized key file is removed at the end).
        gone: ``(name, why)`` to the loader (``RemoteLoader.producer_gone``), or None without a loader.
        needed: the loader's demand gauge (``stats()["producers_needed"]``), or None: ask the producers.
        stop_timeout: how long stopped actors may take to return before they are killed. [Unit: second]
        keep: objects the actors need while they live (the dataset's object ref).
    """

    def __init__(self, fleet: Fleet, *, make_actor: Callable[[int], Any], handover: Handover,
                 gone: Callable[[str, str], None] | None, needed: Callable[[], int | None] | None,
                 stop_timeout: float, keep: Any = None) -> None:
        import ray

        self._ray = ray
        self.fleet = fleet
        self.lock = threading.Lock()
        self._make_actor, self._handover, self._gone, self._needed = make_actor, handover, gone, needed
        self._stop_timeout = stop_timeout
        self._keep = keep
        self._calls: dict[int, _Calls] = {}
        self._commands: queue.SimpleQueue[Callable[[float], list[Action]]] = queue.SimpleQueue()
        self._closing_since: float | None = None
        self.failure: BaseException | None = None  # what ended the thread, if anything did
        self._thread = threading.Thread(target=self._main, name="ferry-ray-watch", daemon=True)

    # --- other threads ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def command(self, event: Callable[[float], list[Action]]) -> None:
        """Have the watch thread feed the fleet ``event(now)`` (under the lock) and apply its actions."""
        self._commands.put(event)

    def close(self, timeout: float) -> bool:
        """Stop every actor and end the thread; wait at most ``timeout`` seconds. Returns whether it ended."""
        self.command(lambda now: self.fleet.close())
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("ferry.ray: the producer actors did not all stop within %g s; they end with this driver",
                        timeout)
        return not self._thread.is_alive()

    def handles(self) -> dict[int, Any]:
        """The actor handle of each place that has one now."""
        with self.lock:
            return {place: calls.actor for place, calls in self._calls.items()}

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # --- the thread ----------------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # kept for the manager to re-raise; the actors go with the driver anyway
            self.failure = exc
            log.exception("ferry.ray: the watch thread failed; killing its producer actors")
            self._kill_all()
        finally:
            self._handover.close()
            self._keep = None

    def _run(self) -> None:
        next_demand = time.monotonic()
        self._event(lambda now: self.fleet.scale_to(self.fleet.target, now))
        while True:
            now = time.monotonic()
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                self._event(command)
            if self.fleet.closing:
                if self._closing_since is None:
                    self._closing_since = now
                if not self.fleet.members:
                    return
                if now - self._closing_since > self._stop_timeout:
                    self._kill_all()
                    return
            self._event(self.fleet.tick)
            if now >= next_demand and not self.fleet.closing:
                next_demand = now + DEMAND_INTERVAL_S
                needed = self._sample_demand()
                self._event(lambda at: self.fleet.demand(needed, at))
            self._wait_calls()

    def _event(self, event: Callable[[float], list[Action]]) -> None:
        with self.lock:
            actions = event(time.monotonic())
        for action in actions:
            self._apply(action)

    def _apply(self, action: Action) -> None:
        if isinstance(action, Start):
            actor = self._make_actor(action.place)
            with self.lock:  # handles() reads it
                self._calls[action.place] = calls = _Calls(actor)
            self._call(calls, WHERE)
            self._call(calls, SERVE)
        elif isinstance(action, Serve):
            calls = self._calls[action.place]
            calls.refs.clear()  # the dead process's calls: none of them answers any more
            self._call(calls, WHERE)
            self._call(calls, SERVE)
        elif isinstance(action, Stop):
            calls = self._calls.get(action.place)
            if calls is not None:
                self._call(calls, STOP)
        elif isinstance(action, Kill):
            with self.lock:
                calls = self._calls.pop(action.place, None)
            if calls is not None:
                self._ray.kill(calls.actor, no_restart=True)
        elif isinstance(action, Gone):
            if self._gone is not None:
                try:
                    self._gone(action.name, action.why)
                except LoaderClosedError:  # the script closed its loader first: nobody to tell
                    pass
        elif isinstance(action, Log):
            log.log(action.level, "%s", action.message)

    def _call(self, calls: _Calls, method: str) -> None:
        calls.refs[getattr(calls.actor, method).remote()] = method

    def _wait_calls(self) -> None:
        refs = [ref for calls in self._calls.values() for ref in calls.refs]
        if not refs:
            time.sleep(POLL_S)
            return
        ready, _ = self._ray.wait(refs, num_returns=1, timeout=POLL_S, fetch_local=False)
        if ready:  # and every other one that has ended meanwhile
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        for ref in ready:
            place = next((p for p, c in self._calls.items() if ref in c.refs), None)
            if place is not None:
                self._answered(place, self._calls[place].refs.pop(ref), ref)

    def _answered(self, place: int, method: str, ref: Any) -> None:
        exceptions = self._ray.exceptions
        try:
            value = self._ray.get(ref)
        except exceptions.RayActorError as exc:
            if method == SERVE:
                why = _first_line(exc)
                if exc.actor_init_failed:  # its constructor raised (a dataset that does not unpickle there)
                    self._event(lambda now: self.fleet.failed(place, why))
                else:
                    restarting = isinstance(exc, exceptions.ActorUnavailableError)
                    self._event(lambda now: self.fleet.died(place, restarting=restarting, why=why, now=now))
            return  # where(), figures(), stop(): the serve() call says what happened
        except exceptions.RayTaskError as exc:
            if method == SERVE:
                if isinstance(exc.cause, ProducerExitError):  # its message and status, apart
                    reason, status = exc.cause.args[0], exc.cause.status
                else:
                    reason, status = _first_line(exc), 2
                self._event(lambda now: self.fleet.failed(place, reason, status))
            else:
                log.warning("ferry.ray: producer actor %d: %s() failed: %s", place, method, _first_line(exc))
            return
        if method == WHERE:
            if value["serving"]:  # else serve() ended (its call says how), or the producer is not up yet: ask again
                self._event(lambda now: self.fleet.located(place, value["name"], value["node"]))
            elif place in self._calls and SERVE in self._calls[place].refs.values():
                self._call(self._calls[place], WHERE)
        elif method == SERVE:
            self._event(lambda now: self.fleet.returned(place, value, now))
        elif method == FIGURES and place in self._calls:
            demand = (value or {}).get("pool_demand") or 0
            self._calls[place].demand = int(round(demand)) if demand >= 1 else None  # 0: its consumer does not know

    def _sample_demand(self) -> int | None:
        """The loader's gauge; without a loader the largest of what its producers last heard (and ask again)."""
        if self._needed is not None:
            return self._needed()
        with self.lock:
            serving = [m.place for m in self.fleet.serving]
        heard = [self._calls[p].demand for p in serving if p in self._calls and self._calls[p].demand is not None]
        for place in serving:
            calls = self._calls.get(place)
            if calls is not None and FIGURES not in calls.refs.values():
                self._call(calls, FIGURES)
        return max(heard, default=None)

    def _kill_all(self) -> None:
        for calls in self._calls.values():
            try:
                self._ray.kill(calls.actor, no_restart=True)
            except Exception as exc:  # a driver already disconnected: its actors go with it
                log.debug("ferry.ray: kill failed: %s", exc)
        with self.lock:
            self._calls.clear()
            self.fleet.members.clear()


def _first_line(exc: BaseException) -> str:
    """An error in one line: Ray's messages run to tracebacks."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()

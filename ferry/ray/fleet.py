"""What :class:`~ferry.ray.RayProducers` decides about its producer actors, without Ray: events in, actions out,
the time passed in (docs/ARCHITECTURE.md#ray).

Each actor has a *place* (0, 1, ...), as a local producer has: a new one takes the lowest free place, a
scale-down stops the highest places first. A place's life::

    Start ─► STARTING ─located─► SERVING ─returned 0─► (gone: it was asked to stop; Kill ends its process)
                 │                   │
                 │                   ├─died, Ray restarts it─► RESTARTING ─located─► SERVING   (Gone, Serve again)
                 │                   ├─died for good─► (gone; replaced after a back-off)        (Gone)
                 │                   └─failed (exit 2, 3)─► (gone, Kill; nothing is started any more)
                 └── the same events, before it located itself
    scale-down, close: ─Stop─► STOPPING ─returned 0 or died─► (gone; Kill)

The events, each from the watch thread that owns every Ray call: an actor said where it runs (``located``: its
producer's ``host:pid``, which the loader knows it by), its ``serve()`` returned (``returned``: 0, stopped as asked)
or raised (``failed``: a configuration error or a permanent rejection, which a restart would repeat), its process
died (``died``: Ray restarts it while its ``max_restarts`` allow, else it is dead for good), a demand sample
(``demand``), a count asked for (``scale_to``), the clock (``tick``), ``close``.

The count follows the loader's demand gauge through :class:`~ferry.consumer.local.autoscale.ScalePolicy`, the
rule of local ``"auto"``: the gauge's value within ``[low, high]``, at most one change per control period (5 s),
a change of direction at most once a minute. An actor dead for good is replaced in its place after a back-off
(:class:`~ferry.consumer.local.respawn.RespawnBudget`: 1 s, doubling, at most 5 in 2 minutes per place), as a
local producer is. A failure that a restart repeats stops all starting: the fleet keeps its ``failure`` for the
manager to raise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ferry.consumer.local.autoscale import ScalePolicy
from ferry.consumer.local.respawn import RespawnBudget

__all__ = ["Fleet", "Member", "Start", "Serve", "Stop", "Kill", "Gone", "Log", "STARTING", "SERVING", "RESTARTING",
           "STOPPING", "replacement_budget"]

STARTING, SERVING, RESTARTING, STOPPING = "starting", "serving", "restarting", "stopping"
#: States whose place counts towards the target (a stopping actor's does not).
WANTED = (STARTING, SERVING, RESTARTING)


@dataclass(frozen=True)
class Start:
    """Create the actor of ``place``, ask where it runs, call its ``serve()``."""

    place: int


@dataclass(frozen=True)
class Serve:
    """Ray restarts the actor of ``place``: ask again where it runs and call its ``serve()`` again (the calls wait
    for the restart)."""

    place: int


@dataclass(frozen=True)
class Stop:
    """Ask the actor of ``place`` to stop serving (its producer says BYE and drains; ``serve()`` returns 0)."""

    place: int


@dataclass(frozen=True)
class Kill:
    """End the actor of ``place`` for good (``ray.kill(no_restart=True)``): its process exits."""

    place: int


@dataclass(frozen=True)
class Gone:
    """Tell the loader that the producer ``name`` (``host:pid``) is gone: its tasks are issued again at once."""

    name: str
    why: str


@dataclass(frozen=True)
class Log:
    level: int
    message: str


Action = Start | Serve | Stop | Kill | Gone | Log


@dataclass
class Member:
    """One place's actor, as the fleet knows it."""

    place: int
    state: str
    name: str = ""  # its producer's host:pid, once located (a restart changes it)
    node: str = ""  # the address of the node it runs on


def replacement_budget() -> RespawnBudget:
    """Back-off and bound on replacing actors dead for good, per place."""
    return RespawnBudget(limit=5, window=120.0, first_delay=1.0, max_delay=30.0)


class Fleet:
    """See the module docstring.

    Args:
        low, high: the bounds of the count; ``low == high`` for a fixed count.
        policy: the rule that turns demand samples into counts; None: the count changes only by ``scale_to``.
        budget: the back-off of replacements.
    """

    def __init__(self, low: int, high: int, *, policy: ScalePolicy | None = None,
                 budget: RespawnBudget | None = None) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"bounds must satisfy 1 <= low <= high, got {low}, {high}")
        self.low, self.high = low, high
        self.policy = policy
        self.budget = budget or replacement_budget()
        self.target = low
        self.members: dict[int, Member] = {}
        self.due: dict[int, float] = {}  # place -> when its replacement starts [time.monotonic()]
        self.failure = ""  # a failure a restart repeats: nothing is started once it is set
        self.failure_status = 0  # its exit status (2 or 3)
        self.closing = False

    # --- figures -----------------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        """The actors wanted now: starting, serving or restarting, and replacements due."""
        return sum(m.state in WANTED for m in self.members.values()) + len(self.due)

    @property
    def serving(self) -> list[Member]:
        return [m for m in self.members.values() if m.state == SERVING]

    def next_due(self) -> float | None:
        return min(self.due.values(), default=None)

    def __repr__(self) -> str:
        states = [m.state for m in self.members.values()]
        return (f"<Fleet target {self.target} of {self.low}..{self.high} | " +
                ", ".join(f"{states.count(s)} {s}" for s in (STARTING, SERVING, RESTARTING, STOPPING)) +
                f", {len(self.due)} due{' | failed' if self.failure else ''}>")

    # --- what the manager asks -----------------------------------------------------------------------------
    def scale_to(self, count: int, now: float) -> list[Action]:
        """Go to ``count`` actors (within the bounds): the missing ones start in the lowest free places, the surplus
        stops, replacements due first, then the highest places."""
        count = min(self.high, max(self.low, count))
        self.target = count
        if self.closing or self.failure:
            return []
        actions: list[Action] = []
        missing = count - self.count
        for _ in range(max(0, missing)):
            place = self._free_place()
            self.members[place] = Member(place, STARTING)
            actions.append(Start(place))
        for _ in range(max(0, -missing)):
            if self.due:
                self.due.pop(max(self.due))
                continue
            place = max(p for p, m in self.members.items() if m.state in WANTED)
            self.members[place].state = STOPPING
            actions.append(Stop(place))
        return actions

    def demand(self, needed: int | None, now: float) -> list[Action]:
        """A sample of the loader's demand gauge (None: not known yet)."""
        if self.policy is None or self.closing or self.failure:
            return []
        target = self.policy.decide(now, self.target, needed)
        if target is None:
            return []
        log = Log(logging.INFO, f"ferry.ray: producer actors {self.target} -> {target} (the loop needs {needed} of "
                                f"the current speed; bounds {self.low}..{self.high})")
        return [log, *self.scale_to(target, now)]

    def tick(self, now: float) -> list[Action]:
        """Start the replacements that are due."""
        actions: list[Action] = []
        for place in [p for p, at in self.due.items() if at <= now]:
            del self.due[place]
            if place in self.members:  # a stopping actor still holds it: the lowest free place instead
                place = self._free_place()
            self.members[place] = Member(place, STARTING)
            actions.append(Start(place))
        return actions

    def close(self) -> list[Action]:
        """Stop every actor; nothing is started any more."""
        self.closing = True
        self.due.clear()
        actions: list[Action] = []
        for member in self.members.values():
            if member.state != STOPPING:
                member.state = STOPPING
                actions.append(Stop(member.place))
        return actions

    # --- what the actors did -------------------------------------------------------------------------------
    def located(self, place: int, name: str, node: str) -> list[Action]:
        member = self.members.get(place)
        if member is None:
            return []
        member.name, member.node = name, node
        if member.state in (STARTING, RESTARTING):
            member.state = SERVING
            return [Log(logging.INFO, f"ferry.ray: producer actor {place} serves as {name} on {node}")]
        return []

    def returned(self, place: int, code: int, now: float) -> list[Action]:
        """Its ``serve()`` returned ``code`` (0: stopped as asked)."""
        member = self.members.pop(place, None)
        if member is None:
            return []
        actions: list[Action] = [Kill(place)]
        if member.state != STOPPING:  # stopped by someone else: its place is empty, and the count short
            actions.append(Log(logging.WARNING, f"ferry.ray: producer actor {place} ({member.name or 'not located'}) "
                                                f"stopped serving (status {code}) without being asked to"))
            actions += self._replace(place, now)
        return actions

    def failed(self, place: int, reason: str, status: int = 2) -> list[Action]:
        """Its ``serve()`` raised a failure that a restart repeats (exit ``status``: 2, its configuration, or 3, a
        permanent rejection): end it, start nothing any more."""
        member = self.members.pop(place, None)
        if member is None:
            return []
        actions: list[Action] = [Kill(place)]
        if member.state == STOPPING or self.closing:
            return actions
        if member.name:
            actions.append(Gone(member.name, f"its Ray actor failed: {reason}"))
        if not self.failure:
            self.failure, self.failure_status = reason, status
            self.due.clear()
            actions.append(Log(logging.ERROR, f"ferry.ray: producer actor {place} failed, and a restart would fail "
                                              f"the same way, so no producer actor is started any more: {reason}"))
        return actions

    def died(self, place: int, *, restarting: bool, why: str, now: float) -> list[Action]:
        """Its process died; ``restarting``: Ray starts it again (its ``max_restarts`` allow)."""
        member = self.members.get(place)
        if member is None:
            return []
        actions: list[Action] = []
        if member.name and member.state != STOPPING:
            actions.append(Gone(member.name, f"its Ray actor died: {why}"))
        if member.state == STOPPING:
            del self.members[place]
            return [Kill(place)]  # while Ray would restart it, or to let go of its handle
        if restarting and member.state == RESTARTING:  # the calls made while Ray restarts it fail: ask again
            return [Serve(place)]
        if restarting:
            member.state, member.name = RESTARTING, ""
            return [*actions, Log(logging.WARNING, f"ferry.ray: producer actor {place} died ({why}); Ray restarts it"),
                    Serve(place)]
        del self.members[place]
        return [*actions, Kill(place), *self._replace(place, now, why)]

    # --- helpers ---------------------------------------------------------------------------------------------
    def _replace(self, place: int, now: float, why: str = "") -> list[Action]:
        if self.closing or self.failure or self.count >= self.target:
            return []
        delay = self.budget.next_delay(place, now)
        died = f"producer actor {place} is dead for good{f' ({why})' if why else ''}"
        if delay is None:
            return [Log(logging.ERROR, f"ferry.ray: {died}, and was replaced {self.budget.limit} times within "
                                       f"{self.budget.window:g} s: not again")]
        self.due[place] = now + delay
        return [Log(logging.WARNING, f"ferry.ray: {died}; a new one starts in {delay:g} s")]

    def _free_place(self) -> int:
        place = 0
        while place in self.members or place in self.due:
            place += 1
        return place

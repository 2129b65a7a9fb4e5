"""Weighted fair shares of a producer's time among the consumers it serves (docs/ARCHITECTURE.md#producer). Pure:
no threads, no clock (the time is a value), no sockets.

A producer runs at most ``limit`` batches at once (``--slots``: one consumer's worth, so that a producer serving one
consumer runs as it always did). Each consumer connection is a *flow* with its own FIFO queue of TASKs and a
*weight* (its WELCOME's, ``RemoteLoader(weight=)``). When a batch worker is free the scheduler starts the next
task of the flow with the smallest *virtual time*: the seconds of producer time it has received, divided by its
weight (start-time fair queueing). A flow is charged its expected cost (the mean of its recent batches) when a
task starts and corrected by the measured seconds when it ends, so that several of its tasks running at once are
counted as they start. A flow that becomes active again starts from the smallest virtual time of the active
flows: it cannot bank the time it left unused, and what it left went to the others (an idle or slow consumer's
share is given away, never lost). So, while demand exceeds the producer, each consumer gets producer time in
proportion to its weight; below that, everyone gets what they ask for.

A task's order within its flow never changes (a stream's batches stay in order). Per flow the scheduler keeps
the figures of the pool's metrics: queued and running tasks (its demand here), seconds served (its share) and
seconds its tasks waited for a worker (its stall).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FairShare", "Flow"]

#: Weight of the newest batch in a flow's expected cost (an exponential moving average).
_COST_SMOOTHING = 0.2


@dataclass
class Flow:
    """One consumer connection's queue and account."""

    weight: float = 1.0
    queue: deque = field(default_factory=deque)  # (item, enqueued at)
    running: int = 0
    virtual: float = 0.0  # producer seconds received / weight
    cost: float = 0.0  # expected seconds of one task (0: none measured yet)
    served_s: float = 0.0  # producer seconds its finished tasks took
    waited_s: float = 0.0  # seconds its tasks waited in the queue for a worker
    tasks: int = 0  # tasks finished
    forgotten: bool = False  # its connection is gone: removed once its running tasks end

    @property
    def active(self) -> bool:
        return bool(self.queue) or self.running > 0


class FairShare:
    """Weighted fair queueing of tasks over ``limit`` workers. See the module docstring."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.flows: dict[int, Flow] = {}
        self.running = 0
        self._started: dict[int, tuple[Any, int, float, float]] = {}  # id(item) -> (item, flow, charged, at)

    def add(self, flow: int, weight: float, item: Any, now: float) -> None:
        """Queue ``item`` (a task) of ``flow``, whose weight is now ``weight``."""
        state = self.flows.setdefault(flow, Flow())
        state.forgotten = False
        if not state.active:  # (re)joining: no credit for the time it was away
            state.virtual = max(state.virtual, self._floor(exclude=state))
        state.weight = weight
        state.queue.append((item, now))

    def take(self, now: float) -> list[tuple[int, Any]]:
        """The tasks to start now, ``(flow, item)``, fairest first, while a worker is free."""
        started = []
        while self.running < self.limit:
            waiting = [(state.virtual, key) for key, state in self.flows.items() if state.queue]
            if not waiting:
                break
            _, key = min(waiting)
            state = self.flows[key]
            item, enqueued = state.queue.popleft()
            charged = self._expected(state)
            state.virtual += charged / state.weight
            state.running += 1
            state.waited_s += max(0.0, now - enqueued)
            self.running += 1
            self._started[id(item)] = (item, key, charged, now)
            started.append((key, item))
        return started

    def finished(self, item: Any, now: float) -> None:
        """``item`` (the very object :meth:`take` returned: items are told apart by identity, a Job being unhashable)
        is done (answered, failed or dropped): its worker is free and its flow pays what it cost. An item never
        started is ignored."""
        entry = self._started.pop(id(item), None)
        if entry is None:
            return
        _, key, charged, at = entry
        self.running -= 1
        state = self.flows.get(key)
        if state is None:
            return
        spent = max(0.0, now - at)
        state.running -= 1
        state.virtual += (spent - charged) / state.weight
        state.served_s += spent
        state.tasks += 1
        state.cost = spent if state.tasks == 1 else (1 - _COST_SMOOTHING) * state.cost + _COST_SMOOTHING * spent
        if state.forgotten and not state.active:
            del self.flows[key]

    def started(self) -> list[tuple[int, Any, float]]:
        """The running items, ``(flow, item, started at)``, oldest first."""
        return sorted(((key, item, at) for item, key, _, at in self._started.values()), key=lambda entry: entry[2])

    def forget(self, flow: int) -> list[Any]:
        """``flow``'s connection is gone: its queued items are dropped (returned); running ones still end through
        :meth:`finished`."""
        state = self.flows.get(flow)
        if state is None:
            return []
        dropped = [item for item, _ in state.queue]
        state.queue.clear()
        state.forgotten = True
        if state.running == 0:
            del self.flows[flow]
        return dropped

    def _expected(self, state: Flow) -> float:
        """What a task of ``state`` is expected to cost: its own mean, else the mean of the others', else 0."""
        if state.tasks:
            return state.cost
        known = [f.cost for f in self.flows.values() if f.tasks]
        return sum(known) / len(known) if known else 0.0

    def _floor(self, exclude: Flow) -> float:
        """The smallest virtual time among the active flows but ``exclude``; 0 when none is active."""
        active = [f.virtual for f in self.flows.values() if f.active and f is not exclude]
        return min(active) if active else max((f.virtual for f in self.flows.values() if f is not exclude),
                                              default=0.0)

    def figures(self) -> dict[int, dict[str, float]]:
        """Per flow: weight, queued and running tasks, seconds served and waited, tasks finished. Safe from another
        thread (the figures may be a turn old)."""
        return {key: {"weight": f.weight, "queued": len(f.queue), "running": f.running, "served_s": f.served_s,
                      "waited_s": f.waited_s, "tasks": f.tasks}
                for key, f in list(self.flows.items())}  # a copy made at once: another thread may read (metrics)

    def __repr__(self) -> str:
        return (f"<FairShare [{self.running}/{self.limit} running | "
                + ", ".join(f"{k}: w={f.weight:g} q={len(f.queue)} r={f.running}" for k, f in self.flows.items())
                + "]>")

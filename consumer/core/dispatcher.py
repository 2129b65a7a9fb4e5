"""Who gets which task (docs/ARCHITECTURE.md#credits, #exactly-once): producers, tasks in flight, attempts.

* Producers are keyed by their ZeroMQ routing id (``peer``) and known by their *identity*:
  ``(producer id, nonce)``. A producer draws a new nonce whenever it drops its work, so a repeated HELLO
  (same identity) changes nothing, while a fresh one (new nonce) means its tasks are gone.
* Every issuance of a seq is a *task* with an id unique over the dispatcher's life (across runs). A result is
  accepted only for a task still in flight and only from the identity it was given to. Anything else is a
  late duplicate.
* New seqs come from the run's :class:`~ferry.consumer.core.sequencers.Sequencer`; the seqs of a lost
  producer go back to the *front* of a re-issue queue, which goes first, to a producer the sequencer lets take
  them (an iterable run's stream may be bound to its own producer: :mod:`.streams`).
* Credits: :meth:`assign` never lets ``in flight + held`` exceed the capacity, and never gives a producer
  more than its *window*: its ``slots`` (batches it builds at once) and the tasks it said it takes ``ahead``
  (HELLO), which it queues until a slot is free, so that a slot that finishes starts the next batch without
  waiting for a credit's round trip. A new task goes to a live producer with a free slot first (so that no task
  waits in one producer's queue while another's slot idles), then to the one with the most room; between
  equals, to the one given a task longest ago (in turn, as DataLoader hands tasks to its workers).
* Dealing: a loader that started N local producers deals its first tasks one to each producer, and the rest
  wait until N producers are live (or one of them died, or a deadline passed), as DataLoader hands its first
  tasks to every worker in turn: the first producer to start does not take every task before the others have
  started, so each of them serves (and its seed is seen, ``tests/test_producer_seeds.py``). It costs the
  producers that started first at most the others' start-up, once per loader.
* Attempts: each loss of a seq's task that may be the task's fault (its producer died or fell silent, it
  timed out, its answer was unusable) is an :class:`Attempt`, kept per seq for the run, across re-issues. A
  lost producer's tasks beyond its ``slots`` oldest were queued, not started, and cost nothing.
  A seq lost ``max_attempts`` times is *poisoned*: not queued again, but returned by :meth:`take_poisoned`
  to be raised in its place. An orderly leave (BYE) or a restart costs no attempt.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from ferry.common.constants import MAX_SLOTS
from ferry.consumer.core.sequencers import Sequencer

__all__ = ["ProducerInfo", "Attempt", "Poisoned", "Task", "Dispatcher"]


@dataclass
class ProducerInfo:
    peer: bytes
    producer_id: str
    nonce: int
    name: str  # host:pid, for messages and stats
    slots: int
    last_heard: float
    joined: float
    in_flight: set[int] = field(default_factory=set)  # task ids
    shared: bool = False  # mapped this consumer's shared-memory slab (a local producer)
    remote: bool = False  # on another machine (neither shared memory, ipc nor loopback): "auto" may compress
    pickle_ok: bool = False  # over ipc as this process's user (a local producer): may send pickled values
    pid: int = 0
    batches: int = 0
    bytes: int = 0
    last_task: int = 0  # the id of the latest task it was given (ids only grow): ties go to the longest idle
    worker: tuple[int, int] | None = None  # an iterable dataset's producer: its [id, count] place (HELLO worker)
    tasks_per_message: int = 1  # the most tasks it takes in one TASK (HELLO tasks)
    ahead: int = 0  # the tasks it takes beyond its slots, queued until a slot is free (HELLO ahead)
    serial: bool = False  # it loads a user's dataset class one sample at a time, no --threads given (HELLO serial)

    @property
    def identity(self) -> tuple[str, int]:
        return (self.producer_id, self.nonce)

    @property
    def window(self) -> int:
        """The most tasks it holds at once: its slots, and those it takes ahead (together at most MAX_SLOTS)."""
        return min(MAX_SLOTS, self.slots + self.ahead)

    @property
    def room(self) -> int:
        """The tasks it may take now: its window less those it holds."""
        return self.window - len(self.in_flight)

    @property
    def may_run(self) -> set[int]:
        """The tasks it may have started: its ``slots`` oldest. It starts a consumer's tasks in the order given, at
        most ``slots`` at once, so the later ones wait in its queue (task ids only grow: the oldest came first)."""
        return self.in_flight if len(self.in_flight) <= self.slots else set(sorted(self.in_flight)[:self.slots])


@dataclass(frozen=True)
class Attempt:
    """One lost issuance of a seq: who held it, and why it was lost."""

    producer: str  # host:pid
    cause: str


@dataclass(frozen=True)
class Poisoned:
    """A seq lost on ``max_attempts`` attempts: it is not issued again."""

    run: int
    seq: int
    attempts: tuple[Attempt, ...]


@dataclass(frozen=True)
class Task:
    task: int
    run: int
    seq: int
    identity: tuple[str, int]
    peer: bytes
    issued: float


class Dispatcher:
    """Args: ``capacity`` (credits), ``max_attempts``, and ``deal_to``: deal one task to each producer until that
    many producers are live, :meth:`end_dealing` is called or the time ``deal_until`` has passed (0: no dealing)."""

    def __init__(self, capacity: int, max_attempts: int, *, deal_to: int = 0, deal_until: float = 0.0) -> None:
        self.capacity = capacity
        self.max_attempts = max_attempts
        self._deal_to, self._deal_until = deal_to, deal_until
        self.producers: dict[bytes, ProducerInfo] = {}
        self.tasks: dict[int, Task] = {}  # in flight, by task id
        self._ids = itertools.count(1)  # never restarted: a late answer of an older run is never a current task
        self.sequencer: Sequencer | None = None
        self._requeued: deque[int] = deque()  # seqs to issue again, first
        self._attempts: dict[int, list[Attempt]] = {}  # seq -> its lost attempts in this run
        self._poisoned: list[Poisoned] = []  # not yet taken
        # task id -> when it reached its producer's first ``slots`` (the earliest it could start): its hold's clock
        self._turns: dict[int, float] = {}
        # producer time in use, for the demand gauge: how many producers had every slot holding a task, over time
        self.busy_s = 0.0  # full-producer seconds
        self._busy_now = 0.0  # full producers in use since the last change
        self._busy_at = 0.0
        self.reissued = 0

    # --- runs -----------------------------------------------------------------------------------------
    def start_run(self, sequencer: Sequencer | None) -> None:
        """Forget the old run's tasks (their late results become duplicates) and issue from ``sequencer``
        (None: no run)."""
        self.sequencer = sequencer
        self._requeued.clear()
        self._attempts, self._poisoned = {}, []
        for producer in self.producers.values():
            producer.in_flight.clear()
            if sequencer is not None:
                sequencer.peer_joined(producer.peer, producer.worker)
        self.tasks.clear()

    @property
    def run(self) -> int:
        return self.sequencer.run if self.sequencer is not None else -1

    @property
    def in_flight(self) -> int:
        return len(self.tasks)

    @property
    def queued(self) -> int:
        """Seqs waiting for a producer: re-issues, and what the sequencer can issue now."""
        return len(self._requeued) + (self.sequencer.waiting if self.sequencer is not None else 0)

    # --- producers ------------------------------------------------------------------------------------
    def find_identity(self, identity: tuple[str, int]) -> ProducerInfo | None:
        return next((p for p in self.producers.values() if p.identity == identity), None)

    def add(self, info: ProducerInfo) -> None:
        self.producers[info.peer] = info
        if self.sequencer is not None:
            self.sequencer.peer_joined(info.peer, info.worker)

    def move(self, old_peer: bytes, new_peer: bytes) -> ProducerInfo:
        """The same producer reconnected under a new routing id: keep its tasks."""
        info = self.producers.pop(old_peer)
        info.peer = new_peer
        self.producers[new_peer] = info
        for task_id in info.in_flight:
            old = self.tasks[task_id]
            self.tasks[task_id] = Task(old.task, old.run, old.seq, old.identity, new_peer, old.issued)
        if self.sequencer is not None:
            self.sequencer.peer_moved(old_peer, new_peer)
        return info

    def lose(self, peer: bytes, cause: str | None = None, charged: Iterable[int] | None = None) -> ProducerInfo | None:
        """Remove a producer; its in-flight seqs go to the front of the re-issue queue, in seq order.

        With a ``cause``, each task it may have started (or only those of them in ``charged``, by task id) costs
        its seq an attempt; a seq out of attempts is poisoned instead of queued again. A producer starts a
        consumer's tasks in the order given, at most ``slots`` at once: the tasks it held beyond its ``slots``
        oldest were still queued (taken ahead), could not be at fault, and go back free."""
        info = self.producers.pop(peer, None)
        if info is None:
            return None
        if self.sequencer is not None:
            self.sequencer.peer_lost(peer)
        started = info.may_run
        charge = (started if charged is None else started & set(charged)) if cause is not None else set()
        seqs = []
        for task_id in info.in_flight:
            task = self.tasks.pop(task_id)
            if task_id not in charge or not self._charge(task.seq, Attempt(info.name, cause or "")):
                seqs.append(task.seq)
        self._reissue_first(seqs)
        info.in_flight.clear()
        return info

    def take_back(self, task_ids: Iterable[int]) -> None:
        """Tasks whose TASK never reached their producer (it went, or came back on a new connection, before it was
        sent): their seqs go to the front of the re-issue queue, free of any attempt. Ids no longer in flight are
        ignored."""
        seqs = []
        for task_id in task_ids:
            task = self.tasks.pop(task_id, None)
            if task is None:
                continue
            producer = self.producers.get(task.peer)
            if producer is not None:
                producer.in_flight.discard(task_id)
            seqs.append(task.seq)
        self._reissue_first(seqs)

    def _reissue_first(self, seqs: list[int]) -> None:
        """``seqs`` go to the front of the re-issue queue, in seq order."""
        seqs.sort()
        self._requeued.extendleft(reversed(seqs))
        self.reissued += len(seqs)

    def _charge(self, seq: int, attempt: Attempt) -> bool:
        """Count a lost attempt of ``seq``; True if that was its last (it is poisoned, not to be queued)."""
        attempts = self._attempts.setdefault(seq, [])
        attempts.append(attempt)
        if len(attempts) < self.max_attempts:
            return False
        self._poisoned.append(Poisoned(self.run, seq, tuple(attempts)))
        return True

    def take_poisoned(self) -> list[Poisoned]:
        """The seqs poisoned since the last call (each given once)."""
        taken, self._poisoned = self._poisoned, []
        return taken

    def drop(self, task_id: int) -> Task | None:
        """Remove a task in flight without a result and without re-issue (its seq ends in an error)."""
        task = self.tasks.pop(task_id, None)
        if task is not None:
            producer = self.producers.get(task.peer)
            if producer is not None:
                producer.in_flight.discard(task_id)
        return task

    # --- occupancy ------------------------------------------------------------------------------------
    def occupancy(self, now: float) -> None:
        """Account producer time in use up to ``now``, then take the occupancy anew. Called at the end of every
        event of the core: occupancy changes only within events, so it held since the last call."""
        self.busy_s = self.busy_until(now)
        self._busy_at = now
        self._busy_now = sum(min(len(p.in_flight), p.slots) / p.slots for p in self.producers.values())
        self._stamp_turns(now)

    def _stamp_turns(self, now: float) -> None:
        """Start the clock of each task that moved up to its producer's ``slots`` oldest during this event (one
        before it was answered or dropped): from now it may be running. Clocks of tasks no longer in flight are
        let go by :meth:`overdue_tasks`, every heartbeat, not here on every event."""
        turns = self._turns
        for p in self.producers.values():
            for task_id in p.may_run:
                if task_id not in turns:
                    turns[task_id] = now

    def busy_until(self, now: float) -> float:
        """``busy_s`` with the time since the last event counted in."""
        return self.busy_s + max(0.0, now - self._busy_at) * self._busy_now

    # --- tasks ----------------------------------------------------------------------------------------
    def overdue_tasks(self, deadline: float) -> dict[bytes, set[int]]:
        """By peer, the ids of its tasks held since before ``deadline``: counted from the moment each reached its
        producer's ``slots`` oldest (its issue, for most), since a task queued ahead waits for a slot first and a
        slow batch before it is not its delay. A task still queued is never overdue: those before it are first."""
        self._turns = {task_id: since for task_id, since in self._turns.items() if task_id in self.tasks}
        out: dict[bytes, set[int]] = {}
        for task_id, since in self._turns.items():
            if since < deadline:
                out.setdefault(self.tasks[task_id].peer, set()).add(task_id)
        return out

    def assign(self, held: int, now: float) -> list[Task]:
        """Issue as many tasks as credits and producers' room allow: ``in flight + held`` stays within capacity."""
        sequencer = self.sequencer
        out: list[Task] = []
        if sequencer is None:
            return out
        dealing = self._dealing(now)
        while self.in_flight + held < self.capacity:
            speculate = self.in_flight + held < self.capacity - 1
            for producer in sorted(self.producers.values(), key=lambda p: _preference(p, dealing)):
                if _room(producer, dealing) <= 0:
                    return out
                seq = self._next_for(producer.peer, speculate)
                if seq is not None:
                    break
            else:
                return out
            task = Task(next(self._ids), sequencer.run, seq, producer.identity, producer.peer, now)
            self.tasks[task.task] = task
            producer.in_flight.add(task.task)
            if len(producer.in_flight) <= producer.slots:
                self._turns[task.task] = now  # a slot is free for it: it may start at once
            producer.last_task = task.task
            sequencer.issued(producer.peer, seq)
            out.append(task)
        return out

    def _dealing(self, now: float) -> bool:
        """Whether the first tasks are still dealt one to each producer; once over, over for good."""
        if self._deal_to and (len(self.producers) >= self._deal_to or now >= self._deal_until):
            self._deal_to = 0
        return bool(self._deal_to)

    def end_dealing(self) -> None:
        """Stop dealing (a local producer died: the one it waits for may never come)."""
        self._deal_to = 0

    def _next_for(self, peer: bytes, speculate: bool) -> int | None:
        """A re-issue first, the first one ``peer`` may take (those that became stale are dropped), then a new seq
        from the sequencer."""
        sequencer = self.sequencer
        assert sequencer is not None
        live = self.producers.keys()
        for seq in list(self._requeued):
            if sequencer.stale(seq):
                self._requeued.remove(seq)
            elif sequencer.may_take(peer, seq, live):
                self._requeued.remove(seq)
                return seq
        return sequencer.next_seq(peer, live, speculate)

    def complete(self, task_id: int, peer: bytes) -> Task | None:
        """Accept the result of ``task_id`` from ``peer``, or return None for a duplicate / stranger."""
        task = self.tasks.get(task_id)
        producer = self.producers.get(peer)
        if task is None or producer is None or task.identity != producer.identity:
            return None
        del self.tasks[task_id]
        producer.in_flight.discard(task_id)
        return task

    def requeue(self, task: Task, attempt: Attempt) -> None:
        """A task's result was unusable: issue its seq again, first (unless that ``attempt`` was its last)."""
        if self._charge(task.seq, attempt):
            return
        self._requeued.appendleft(task.seq)
        self.reissued += 1


def _preference(producer: ProducerInfo, dealing: bool) -> tuple[int, int, int]:
    """The order producers are offered a task in: a free slot first (a task queued ahead while another
    producer's slot idles would wait for nothing), then the most room, then the one given a task longest ago."""
    room = _room(producer, dealing)
    return -min(room, max(0, producer.slots - len(producer.in_flight))), -room, producer.last_task


def _room(producer: ProducerInfo, dealing: bool) -> int:
    """Tasks ``producer`` may take now: its room; while dealing, one if it has never had a task, else none."""
    if dealing:
        return 1 if producer.last_task == 0 else 0
    return producer.room

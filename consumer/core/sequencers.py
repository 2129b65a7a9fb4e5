"""The order of a run: which seqs to issue next, and in which order their results reach the training loop.

A run (one iteration of the loader) is planned by one :class:`Sequencer`, chosen once by :func:`sequencer_for`
from the kind of plan (docs/ARCHITECTURE.md#epoch-plan):

* :class:`MapSequencer`, a map-style dataset's :class:`~ferry.common.plan.EpochPlan`: the seqs are known up
  front (``first_seq .. len(plan) - 1``) and delivered in plan order, or as they arrive with ``in_order=False``;
* :class:`~ferry.consumer.core.shards.ShardSequencer`, a sharded dataset's
  :class:`~ferry.common.shardplan.ShardPlan`: the number of batches of each shard is discovered from the
  answers, and producers keep an affinity to the shard they read (docs/ARCHITECTURE.md#streaming-sources);
* :class:`~ferry.consumer.core.streams.StreamSequencer`, an iterable dataset's
  :class:`~ferry.common.streamplan.StreamPlan`: N streams read one batch after another, delivered round robin
  as DataLoader interleaves its workers; a producer may be bound to its stream
  (docs/ARCHITECTURE.md#iterable-datasets).

All keep the reorder buffer of their run and its ``held`` count: batches put and not yet released by the
training loop. The :class:`~ferry.consumer.core.dispatcher.Dispatcher` issues a new task only while
``in_flight + held < capacity``. Nothing here is shared with another thread: the core owns the sequencer of its
run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Collection

from ferry.common.errors import ProtocolError
from ferry.common.plan import EpochPlan
from ferry.common.shardplan import ShardPlan
from ferry.common.streamplan import StreamPlan

from ferry.consumer.core.delivery import Delivery, EndOfRun

__all__ = ["Answer", "Sequencer", "MapSequencer", "sequencer_for"]


@dataclass(frozen=True)
class Answer:
    """What a BATCH answers, as the core needs it: the samples it must hold (``indices``, for the structure
    checks), and for a sharded run whether it is empty (no batch ``k``) or its shard's last."""

    indices: list[int]
    empty: bool = False
    last: bool = False


class Sequencer:
    """One run's order (see the module docstring). ``first_seq`` is the plan position of the run's first batch
    (past 0 after a resume); ``total`` the batches of the run, None when not known in advance."""

    run: int
    first_seq: int
    total: int | None
    #: an iterable run's batches of each stream already delivered when it began (a resume): the start of what
    #: :meth:`streams_after` folds; () for the other kinds
    resume_streams: tuple[int, ...] = ()

    def __init__(self) -> None:
        self.held = 0  # batches put and not yet released by the training loop
        self._items: dict[int, Delivery] = {}
        self._eof_given = False

    # --- issue ------------------------------------------------------------------------------------------
    def next_seq(self, peer: bytes, live: Collection[bytes], speculate: bool) -> int | None:
        """A new seq for ``peer`` (never issued in this run), or None. ``speculate``: credits allow a task that
        the batch the loop waits for does not depend on."""
        raise NotImplementedError

    def issued(self, peer: bytes, seq: int) -> None:
        """``seq`` went to ``peer``."""

    def stale(self, seq: int) -> bool:
        """``seq`` can never be delivered any more (a queued re-issue of it is dropped)."""
        return False

    @property
    def waiting(self) -> int:
        """New seqs this run can still issue now."""
        raise NotImplementedError

    def peer_joined(self, peer: bytes, worker: tuple[int, int] | None) -> None:
        """``peer`` is registered (before this run, or during it); ``worker``: the ``[id, count]`` place its HELLO
        said, or None."""

    def peer_lost(self, peer: bytes) -> None:
        pass

    def peer_moved(self, old: bytes, new: bytes) -> None:
        pass

    def may_take(self, peer: bytes, seq: int, live: Collection[bytes]) -> bool:
        """Whether ``peer`` may be given ``seq`` (a re-issue): any producer, but an iterable run's stream may be
        bound to its own producers."""
        return True

    # --- what a task carries, what an answer must hold ------------------------------------------------
    def indices(self, seq: int) -> list[int]:
        raise NotImplementedError

    def task_fields(self, seq: int) -> dict[str, Any]:
        """TASK fields beyond ``indices``."""
        return {}

    def index_range(self, dataset_len: int | None) -> int | None:
        """What a TASK's ``indices`` must lie below (None: unchecked): the dataset's length (a sharded dataset's
        shard count); an iterable run's stream count."""
        return dataset_len

    def read_answer(self, header: dict[str, Any], seq: int, epoch: int) -> Answer:
        """Check a BATCH against the kind of run it answers.

        Raises:
            ProtocolError: the answer does not fit this kind of run.
        """
        raise NotImplementedError

    def ended(self, seq: int, *, empty: bool) -> None:
        """The answer to ``seq`` said its shard ends: at ``seq``, or (``empty``) before it. A failed or
        poisoned batch ends its shard too (its iterator is broken)."""

    # --- the reorder buffer ---------------------------------------------------------------------------
    def put(self, item: Delivery) -> bool:
        """Keep ``item`` until its turn; False (not kept, holds no credit) if its seq is already here or stale."""
        if item.seq in self._items or self.stale(item.seq):
            return False
        self._items[item.seq] = item
        if not item.skipped:
            self.held += 1
        self._arrived(item.seq)
        return True

    def take(self) -> Delivery | EndOfRun | None:
        """The next item for the training loop, EndOfRun once after the last, or None: not here yet."""
        while True:
            seq = self._next_ready()
            if seq is None:
                if self._exhausted() and not self._eof_given:
                    self._eof_given = True
                    return EndOfRun(self.run)
                return None
            item = self._items.pop(seq)
            if not item.skipped:
                return item

    def release(self) -> None:
        """The training loop took a batch of this run: a credit back."""
        self.held -= 1

    @staticmethod
    def shard_after(seq: int) -> tuple[int, int]:
        """Where a resume goes on within its shard once ``seq`` was delivered ((0, 0) without shards). A pure
        function: the training thread calls it, with no reference to the sequencer the io thread owns."""
        return (0, 0)

    @staticmethod
    def streams_after(streams: tuple[int, ...], seq: int) -> tuple[int, ...]:
        """An iterable run's batches of each stream delivered, once ``seq`` was delivered after ``streams`` (()
        for the other kinds). A pure function, as :meth:`shard_after`."""
        return streams

    def _arrived(self, seq: int) -> None:
        pass

    def _next_ready(self) -> int | None:
        raise NotImplementedError

    def _exhausted(self) -> bool:
        raise NotImplementedError


class MapSequencer(Sequencer):
    """The seqs ``first_seq .. len(plan) - 1`` of a map-style plan, issued in order, delivered in plan order
    (``in_order``) or as they arrive."""

    def __init__(self, run: int, plan: EpochPlan, first_seq: int, *, in_order: bool) -> None:
        super().__init__()
        self.run, self.plan = run, plan
        self.first_seq = min(first_seq, len(plan))
        self.total = len(plan) - self.first_seq
        self._in_order = in_order
        self._next_new = self.first_seq  # the lowest seq never issued
        self._position = self.first_seq  # in order: the next seq to deliver
        self._arrivals: deque[int] = deque()  # out of order: arrival order
        self._delivered = 0

    def next_seq(self, peer: bytes, live: Collection[bytes], speculate: bool) -> int | None:
        if self._next_new >= len(self.plan):
            return None
        self._next_new += 1
        return self._next_new - 1

    @property
    def waiting(self) -> int:
        return len(self.plan) - self._next_new

    def indices(self, seq: int) -> list[int]:
        return self.plan.batch(seq)

    def task_fields(self, seq: int) -> dict[str, Any]:
        return {"unbatched": self.plan.unbatched} if self.plan.unbatched else {}

    def read_answer(self, header: dict[str, Any], seq: int, epoch: int) -> Answer:
        if "count" in header or "last" in header:
            raise ProtocolError("BATCH count/last must come exactly with the tasks of a sharded or iterable dataset")
        return Answer(self.plan.batch(seq))

    def _arrived(self, seq: int) -> None:
        if not self._in_order:
            self._arrivals.append(seq)

    def _next_ready(self) -> int | None:
        if self._in_order:
            if self._position not in self._items:
                return None
            self._position += 1
            self._delivered += 1
            return self._position - 1
        if not self._arrivals:
            return None
        self._delivered += 1
        return self._arrivals.popleft()

    def _exhausted(self) -> bool:
        return self._delivered >= self.total


def sequencer_for(run: int, plan: Any, first_seq: int, shard: tuple[int, int], *, in_order: bool,
                  streams: tuple[int, ...] = ()) -> Sequencer:
    """The sequencer of ``plan``'s kind, starting at ``first_seq`` (and within a sharded plan at ``shard``:
    position and batch; in an iterable plan at ``streams``: each stream's batches delivered). The one place where
    the kind of plan is looked at.

    Raises:
        ConfigError: ``streams`` (a resume) counts other streams than the iterable plan has.
    """
    if isinstance(plan, ShardPlan):
        from ferry.consumer.core.shards import ShardSequencer

        return ShardSequencer(run, plan, first_seq, shard)
    if isinstance(plan, StreamPlan):
        from ferry.consumer.core.streams import StreamSequencer

        return StreamSequencer(run, plan, first_seq, streams, in_order=in_order)
    return MapSequencer(run, plan, first_seq, in_order=in_order)

"""Consumer-side sequencing of a sharded dataset (docs/ARCHITECTURE.md#streaming-sources).

A run of a sharded dataset is a :class:`ShardRun`: positions ``0..positions-1`` (this rank's shards in plan
order), delivered from ``(start_position, start_batch)``. How many batches a shard has is learned from the
answers: a BATCH marked ``last`` ends its shard (a short tail, or a full batch followed by nothing), and an
empty answer (``count`` 0) says the shard ended before batch ``k``.

* :class:`ShardBuffer` is the reorder buffer with a dynamic order: it hands out ``(p, k)`` after
  ``(p, k - 1)``, and ``(p + 1, 0)`` once shard ``p`` is known to end at ``k - 1`` (:meth:`~ShardBuffer.end_shard`,
  called by the io thread for an answer marked ``last`` or empty). Items of a shard already passed, or beyond
  its known end, are refused, so they never hold a credit. Delivery is always in plan order.
* :class:`ShardDispatcher` is the dispatcher with a generated queue. Each producer keeps an *affinity* shard
  and gets its consecutive batches (its cursor is already there: no re-reading). Tasks of the shard being
  delivered may use every credit; tasks of later shards (speculation) only while one credit stays free, so
  the batch the training loop waits for can always be issued: no deadlock in the window.
* Re-issue is the dispatcher's own: a lost producer's tasks go back to the front of the queue, and the
  producer that gets ``(p, k)`` opens shard ``p`` and skips ``k * batch_size`` samples.

Both read and write the one :class:`ShardRun` of the run: the buffer moves its delivery position (under the
buffer's lock), the dispatcher reads it (one int) and records shard ends (io thread).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ferry.common.errors import ProtocolError
from ferry.common.shardplan import ShardPlan, decode_seq, encode_seq

from ferry.consumer.buffer import Delivery, EndOfRun, ReorderBuffer
from ferry.consumer.dispatcher import Dispatcher, ProducerInfo, Task

__all__ = ["ShardRun", "ShardBuffer", "ShardDispatcher", "Answer", "read_answer", "task_fields"]


@dataclass(eq=False)
class ShardRun:
    """The shared state of one run over shard positions (the ``order`` of a StartRun)."""

    positions: int
    start_position: int = 0
    start_batch: int = 0
    position: int = 0  # the shard being delivered (the buffer moves it)
    batch: int = 0  # the next batch of it to deliver
    ends: dict[int, int] = field(default_factory=dict)  # position -> its last batch k (inclusive), once known
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.position, self.batch = self.start_position, self.start_batch

    def __len__(self) -> int:  # the seqs still to deliver are not known in advance
        return 0

    def stale(self, seq: int) -> bool:
        """``seq`` can never be delivered: its shard was passed, or it lies beyond the shard's known end."""
        p, k = decode_seq(seq)
        with self.lock:
            if p < self.position or (p == self.position and k < self.batch) or p >= self.positions:
                return True
            end = self.ends.get(p)
            return end is not None and k > end

    def end_at(self, p: int, k: int) -> None:
        """Shard ``p`` has no batch after ``k`` (``k`` = -1: it has none at all)."""
        with self.lock:
            self.ends[p] = min(k, self.ends.get(p, k))

    def delivered(self, seq: int, last: bool) -> None:
        p, k = decode_seq(seq)
        with self.lock:
            self.position, self.batch = (p + 1, 0) if last else (p, k + 1)


class ShardBuffer(ReorderBuffer):
    """A :class:`ReorderBuffer` that also runs a :class:`ShardRun` (see the module docstring)."""

    def __init__(self, *, in_order: bool, on_release: Any) -> None:
        super().__init__(in_order=in_order, on_release=on_release)
        self._shards: ShardRun | None = None

    def reset(self, run: int, order: Sequence[int] | ShardRun) -> None:
        if not isinstance(order, ShardRun):
            self._shards = None
            super().reset(run, order)
            return
        super().reset(run, [])
        with self._cond:
            self._shards = order

    def put(self, item: Delivery) -> bool:
        with self._cond:  # re-entrant: the check and the insertion are one step against _take
            shards = self._shards
            if shards is not None and item.run == self._run and shards.stale(item.seq):
                return False  # passed or beyond the shard's end: never holds a credit
            return super().put(item)

    def end_shard(self, run: int, seq: int, *, last: bool, empty: bool) -> None:
        """An answer told where a shard ends (io thread, before it puts the item): batch ``k`` of ``seq`` is
        its last, or (``empty``) the shard has no batch ``k``. Wakes a ``get`` waiting on that shard."""
        with self._cond:
            if self._shards is None or run != self._run or not (last or empty):
                return
            p, k = decode_seq(seq)
            self._shards.end_at(p, k - 1 if empty else k)
            self._cond.notify_all()

    def _take(self) -> Delivery | EndOfRun | None:
        shards = self._shards
        if shards is None:
            return super()._take()
        while True:
            if shards.position >= shards.positions:
                if self._run < 0 or self._eof_given:
                    return None
                self._eof_given = True
                return EndOfRun(self._run)
            end = shards.ends.get(shards.position)
            if end is not None and shards.batch > end:  # the shard ended before this batch
                shards.delivered(encode_seq(shards.position, shards.batch), last=True)
                self._drop_passed(shards)
                continue
            seq = encode_seq(shards.position, shards.batch)
            item = self._items.pop(seq, None)
            if item is None:
                return None
            self._arrivals.remove(seq)
            shards.delivered(seq, last=False)  # where the shard ends, end_shard said (the check above moves on)
            if not item.skipped:
                return item

    def _drop_passed(self, shards: ShardRun) -> None:
        """Forget items of shards already passed (late speculation); they never count as held."""
        for seq in [s for s in self._items if decode_seq(s)[0] < shards.position]:
            item = self._items.pop(seq)
            self._arrivals.remove(seq)
            if not item.skipped:
                self._held -= 1


class ShardDispatcher(Dispatcher):
    """A :class:`Dispatcher` that also issues the tasks of a :class:`ShardRun` (see the module docstring)."""

    def __init__(self, capacity: int, max_attempts: int = 3) -> None:
        super().__init__(capacity, max_attempts)
        self._shards: ShardRun | None = None
        self._next_batch: dict[int, int] = {}  # position -> next batch k to issue
        self._next_position = 0  # the lowest position not started
        self._affinity: dict[bytes, int] = {}  # peer -> the position it reads

    def start_run(self, run: int, order: Iterable[int] | ShardRun) -> None:
        if not isinstance(order, ShardRun):
            self._shards = None
            super().start_run(run, order)
            return
        super().start_run(run, [])
        self._shards = order
        self._next_batch = {order.start_position: order.start_batch}
        self._next_position = order.start_position + 1
        self._affinity.clear()

    def lose(self, peer: bytes, cause: str | None = None, charged: Iterable[int] | None = None) -> ProducerInfo | None:
        self._affinity.pop(peer, None)
        return super().lose(peer, cause, charged)

    def move(self, old_peer: bytes, new_peer: bytes) -> ProducerInfo:
        if old_peer in self._affinity:  # the same producer, reconnected: its cursor is still there
            self._affinity[new_peer] = self._affinity.pop(old_peer)
        return super().move(old_peer, new_peer)

    def assign(self, held: int, now: float = 0.0) -> list[Task]:
        if self._shards is None:
            return super().assign(held, now)
        out: list[Task] = []
        while self.in_flight + held < self.capacity:
            speculate = self.in_flight + held < self.capacity - 1
            for producer in sorted(self.producers.values(), key=lambda p: -p.free_slots):
                if producer.free_slots <= 0:
                    continue
                seq = self._pick(producer, speculate)
                if seq is not None:
                    break
            else:
                break
            task = Task(next(self._ids), self.run, seq, producer.identity, producer.peer, now)
            self.tasks[task.task] = task
            producer.in_flight.add(task.task)
            self._affinity[producer.peer] = decode_seq(seq)[0]
            out.append(task)
        return out

    def _pick(self, producer: ProducerInfo, speculate: bool) -> int | None:
        """The next seq for ``producer``: a re-issue first, then its own shard, then an unowned or new one.
        Without ``speculate`` only the shard being delivered may be issued."""
        shards = self._shards
        assert shards is not None
        while self._queue and shards.stale(self._queue[0]):
            self._queue.popleft()
        if self._queue:
            return self._queue.popleft()
        current = shards.position
        owners = {p: peer for peer, p in self._affinity.items() if peer in self.producers}
        mine = self._affinity.get(producer.peer)
        candidates = [mine] if mine is not None else []
        candidates += [p for p in sorted(self._next_batch) if p not in owners or owners[p] == producer.peer]
        for p in candidates:
            if p is None or (p != current and not speculate):
                continue
            seq = self._take_batch(p)
            if seq is not None:
                return seq
        while speculate or self._next_position == current:
            p = self._next_position
            if p >= shards.positions:
                return None
            self._next_position += 1
            self._next_batch[p] = 0
            seq = self._take_batch(p)
            if seq is not None:
                return seq
        return None

    def _take_batch(self, p: int) -> int | None:
        shards = self._shards
        assert shards is not None
        k = self._next_batch.get(p)
        if k is None:
            return None
        seq = encode_seq(p, k)
        if shards.stale(seq):
            del self._next_batch[p]  # ended (or passed): nothing more to issue
            return None
        self._next_batch[p] = k + 1
        return seq

    @property
    def queued(self) -> int:
        """Re-issues waiting, plus one while the shard being delivered has batches not yet issued. Speculation
        held back by the reserve is not counted: producers idle then are not the consumer's fault."""
        shards = self._shards
        if shards is None:
            return len(self._queue)
        current = self._next_batch.get(shards.position)
        waiting = current is not None and not shards.stale(encode_seq(shards.position, current))
        return len(self._queue) + int(waiting or self._next_position == shards.position < shards.positions)


@dataclass(frozen=True)
class Answer:
    """What a BATCH answers, as the io thread needs it: the samples it must hold (``indices``, for the
    structure checks), and for a sharded run whether it is empty (no batch ``k``) or its shard's last."""

    indices: list[int]
    sharded: bool = False
    empty: bool = False
    last: bool = False


def read_answer(header: dict[str, Any], plan: Any, seq: int, epoch: int) -> Answer:
    """Check a BATCH against the kind of run it answers.

    Raises:
        ProtocolError: a sharded answer (``count``) to a map task or the reverse, ``count`` without ``last``,
            more samples than the batch size, or an empty answer with a tree or of another seq.
    """
    sharded = isinstance(plan, ShardPlan)
    if ("count" in header) != sharded or ("last" in header) != sharded:
        raise ProtocolError("BATCH count/last must come exactly with the tasks of a sharded dataset")
    if not sharded:
        return Answer(plan.batch(seq))
    count = header["count"]
    if count > plan.batch_size:
        raise ProtocolError(f"BATCH holds {count} samples, more than the batch size {plan.batch_size}")
    if count == 0:
        if header["tree"] is not None or header["errors"] or (header["epoch"], header["seq"]) != (epoch, seq):
            raise ProtocolError("an empty BATCH must have no tree, no errors and its task's seq")
        return Answer([], sharded=True, empty=True, last=True)
    return Answer(plan.batch(seq) * count, sharded=True, last=header["last"])


def task_fields(plan: Any, seq: int) -> dict[str, Any]:
    """The TASK fields beyond ``indices``: a sharded dataset's ``shard``."""
    return plan.task_fields(seq) if isinstance(plan, ShardPlan) else {}

"""The sequencer of a sharded dataset's run (docs/ARCHITECTURE.md#streaming-sources).

A run covers shard positions ``0..positions-1`` (this rank's shards in plan order), delivered from
``(start_position, start_batch)``; ``seq = position * SHARD_STRIDE + batch``. How many batches a shard has is
learned from the answers: a BATCH marked ``last`` ends its shard (a short tail, or a full batch followed by
nothing), an empty answer (``count`` 0) says the shard ended before batch ``k``, and a failed or poisoned
batch ends its shard too.

* **Delivery** is always in plan order: ``(p, k)`` after ``(p, k - 1)``, and ``(p + 1, 0)`` once shard ``p`` is
  known to end at ``k - 1``. Items of a shard already passed, or beyond its known end, are refused (stale), so
  they never hold a credit.
* **Issue.** Each producer keeps an *affinity* shard and gets its consecutive batches (its cursor is already
  there: no re-reading); a producer whose shard ended starts the lowest unstarted position. Tasks past a
  shard's end may be issued before the end is known; they come back empty.
* **The speculation reserve.** Tasks of the shard being delivered may use every credit; tasks of later shards
  only while one credit stays free (``speculate``), so the batch the training loop waits for can always be
  issued: items of later shards hold at most ``C - 1`` credits, and the window cannot deadlock.
"""

from __future__ import annotations

from typing import Any, Collection

from ferry.common.errors import ProtocolError
from ferry.common.shardplan import ShardPlan, decode_seq, encode_seq

from ferry.consumer.core.sequencers import Answer, Sequencer

__all__ = ["ShardSequencer", "read_counted"]


def read_counted(header: dict[str, Any], seq: int, epoch: int, batch_size: int, indices: list[int]) -> Answer:
    """A BATCH that answers a task of a discovered length (a shard's or a stream's batch ``k``): its ``count``
    samples, each told by ``indices`` (the shard or stream), or empty (no batch ``k``).

    Raises:
        ProtocolError: no ``count``/``last``, more samples than the batch size, or an empty answer with a tree or
            errors, or of another seq.
    """
    if "count" not in header or "last" not in header:
        raise ProtocolError("BATCH count/last must come exactly with the tasks of a sharded or iterable dataset")
    count = header["count"]
    if count > batch_size:
        raise ProtocolError(f"BATCH holds {count} samples, more than the batch size {batch_size}")
    if count == 0:
        if header["tree"] is not None or header["errors"] or (header["epoch"], header["seq"]) != (epoch, seq):
            raise ProtocolError("an empty BATCH must have no tree, no errors and its task's seq")
        return Answer([], empty=True, last=True)
    return Answer(indices * count, last=header["last"])


class ShardSequencer(Sequencer):
    """A run over the shard positions of ``plan``; see the module docstring."""

    def __init__(self, run: int, plan: ShardPlan, first_seq: int, start: tuple[int, int]) -> None:
        super().__init__()
        self.run, self.plan = run, plan
        self.first_seq = first_seq  # batches of the epoch delivered before this run (a resume)
        self.total = len(plan) - first_seq if plan.lengths is not None else None
        self.positions = plan.positions
        self.position, self.batch = start  # the shard being delivered, and its next batch
        self.ends: dict[int, int] = {}  # position -> its last batch k (inclusive; -1: none), once known
        self._next_batch: dict[int, int] = {self.position: self.batch}  # position -> next batch k to issue
        self._next_position = self.position + 1  # the lowest position not started
        self._affinity: dict[bytes, int] = {}  # peer -> the position it reads

    # --- issue ------------------------------------------------------------------------------------------
    def stale(self, seq: int) -> bool:
        p, k = decode_seq(seq)
        if p < self.position or (p == self.position and k < self.batch) or p >= self.positions:
            return True
        end = self.ends.get(p)
        return end is not None and k > end

    def next_seq(self, peer: bytes, live: Collection[bytes], speculate: bool) -> int | None:
        """Its own shard first, then one no live producer reads, then a new one. Without ``speculate`` only
        the shard being delivered may be issued."""
        owners = {p: owner for owner, p in self._affinity.items() if owner in live}
        mine = self._affinity.get(peer)
        candidates = [mine] if mine is not None else []
        candidates += [p for p in sorted(self._next_batch) if owners.get(p, peer) == peer]
        for p in candidates:
            if p != self.position and not speculate:
                continue
            seq = self._take_batch(p)
            if seq is not None:
                return seq
        while speculate or self._next_position == self.position:
            p = self._next_position
            if p >= self.positions:
                return None
            self._next_position += 1
            self._next_batch[p] = 0
            seq = self._take_batch(p)
            if seq is not None:
                return seq
        return None

    def _take_batch(self, p: int) -> int | None:
        k = self._next_batch.get(p)
        if k is None:
            return None
        seq = encode_seq(p, k)
        if self.stale(seq):
            del self._next_batch[p]  # ended (or passed): nothing more to issue
            return None
        self._next_batch[p] = k + 1
        return seq

    def issued(self, peer: bytes, seq: int) -> None:
        self._affinity[peer] = decode_seq(seq)[0]

    def peer_lost(self, peer: bytes) -> None:
        self._affinity.pop(peer, None)

    def peer_moved(self, old: bytes, new: bytes) -> None:
        if old in self._affinity:  # the same producer, reconnected: its cursor is still there
            self._affinity[new] = self._affinity.pop(old)

    @property
    def waiting(self) -> int:
        """One while the shard being delivered has batches not yet issued. Speculation held back by the
        reserve is not counted: producers idle then are not the consumer's fault."""
        if self.position >= self.positions:
            return 0
        current = self._next_batch.get(self.position)
        if current is not None:
            return int(not self.stale(encode_seq(self.position, current)))
        return int(self._next_position == self.position)

    # --- what a task carries, what an answer must hold ------------------------------------------------
    def indices(self, seq: int) -> list[int]:
        return self.plan.batch(seq)

    def task_fields(self, seq: int) -> dict[str, Any]:
        return self.plan.task_fields(seq)

    def read_answer(self, header: dict[str, Any], seq: int, epoch: int) -> Answer:
        return read_counted(header, seq, epoch, self.plan.batch_size, self.plan.batch(seq))

    def ended(self, seq: int, *, empty: bool) -> None:
        p, k = decode_seq(seq)
        last = k - 1 if empty else k
        self.ends[p] = min(last, self.ends.get(p, last))

    # --- delivery ---------------------------------------------------------------------------------------
    def _next_ready(self) -> int | None:
        while self.position < self.positions:
            end = self.ends.get(self.position)
            if end is not None and self.batch > end:  # the shard ended before this batch: on to the next
                self.position, self.batch = self.position + 1, 0
                self._drop_passed()
                continue
            seq = encode_seq(self.position, self.batch)
            if seq not in self._items:
                return None
            self.batch += 1
            return seq
        return None

    def _exhausted(self) -> bool:
        return self.position >= self.positions

    def _drop_passed(self) -> None:
        """Forget items of shards already passed (late speculation); they no longer count as held."""
        for seq in [s for s in self._items if decode_seq(s)[0] < self.position]:
            if not self._items.pop(seq).skipped:
                self.held -= 1

    @staticmethod
    def shard_after(seq: int) -> tuple[int, int]:
        p, k = decode_seq(seq)
        return (p, k + 1)  # an empty answer past it moves a resume on to the next shard

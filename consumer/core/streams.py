"""The sequencer of an iterable dataset's run (docs/ARCHITECTURE.md#iterable-datasets).

A run covers streams ``0..N-1`` (``plan.streams``); ``seq = stream * SHARD_STRIDE + batch``. How many batches a
stream has is learned from the answers, as a shard's: a BATCH marked ``last`` ends its stream, an empty answer
(``count`` 0) says it ended before batch ``k``, and a failed or poisoned batch ends it too (its iterator is broken).

* **Delivery**, in order: round robin, as DataLoader hands on its workers' batches: ``(w, k)`` after
  ``(w - 1, k)``, ``(0, k + 1)`` after ``(N - 1, k)``; a stream that ended is passed over, and so is a batch a
  resumed run's ``resume_streams`` says was delivered before. Items beyond a stream's known end are refused, or
  dropped when the end becomes known after them, so they never hold a credit. With ``in_order=False`` batches are
  handed on as they arrive.
* **Issue.** A stream's batches are issued one after another (tasks past its end may go out before the end is
  known; they come back empty). A producer whose HELLO said ``worker == [w, N]`` is *bound* to stream ``w``: it
  gets that stream's tasks only, re-issues included, and no other producer gets them while it is live (its
  dataset copy is the one ``producer_init`` prepared for worker ``w``; a replacement of a local producer has the
  same place); where several live producers have one place (producers started by hand all say ``[0, 1]``), the
  one that read the stream last goes on reading it. Other producers are *free*: a stream without a live
  producer of its own is read by the free producer that read it last (its cursor is open there); one without
  such a reader goes to the free producer that asks first. A free producer issues the stream whose next batch is
  needed first, of those it reads before the others.
* **The speculation reserve**, in order: only the batch the training loop waits for may take the last credit;
  every other task is issued while one stays free (``speculate``). Items other than the next hold at most
  ``C - 1`` credits, so the next can always be issued and the window cannot deadlock.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Collection

from ferry.common.errors import ConfigError
from ferry.common.shardplan import decode_seq, encode_seq
from ferry.common.streamplan import StreamPlan

from ferry.consumer.core.sequencers import Answer, Sequencer
from ferry.consumer.core.shards import read_counted

__all__ = ["StreamSequencer"]


class StreamSequencer(Sequencer):
    """A run over the streams of ``plan``, each from its ``starts`` entry (batches delivered before: a resume);
    see the module docstring.

    Raises:
        ConfigError: ``starts`` counts another number of streams than ``plan``.
    """

    def __init__(self, run: int, plan: StreamPlan, first_seq: int, starts: tuple[int, ...], *,
                 in_order: bool) -> None:
        super().__init__()
        n = plan.streams
        if starts and len(starts) != n:
            raise ConfigError(f"the state was saved by an iterable run of {len(starts)} streams, and this loader "
                              f"splits the dataset into {n} (iterable_streams, by default local_producers)")
        self.run, self.plan, self.first_seq, self.total = run, plan, first_seq, None
        self.resume_streams = tuple(int(k) for k in starts) if starts else (0,) * n
        self.ends: dict[int, int] = {}  # stream -> its last batch k (inclusive; -1: none), once known
        self._in_order = in_order
        self._next_batch = list(self.resume_streams)  # stream -> the next batch k to issue
        self._round, self._stream = min(self.resume_streams), 0  # in order: the next (k, w) to hand on
        self._handed = list(self.resume_streams)  # stream -> its lowest batch not handed on yet
        self._handed_above: list[set[int]] = [set() for _ in range(n)]  # ... and those above it handed on
        self._arrivals: deque[int] = deque()  # out of order: arrival order
        self._bound: dict[bytes, int] = {}  # peer -> its own stream (HELLO worker == [w, N])
        self._reader: dict[int, bytes] = {}  # stream -> the peer that read it last

    # --- producers ----------------------------------------------------------------------------------------
    def peer_joined(self, peer: bytes, worker: tuple[int, int] | None) -> None:
        if worker is not None and worker[1] == self.plan.streams:
            self._bound[peer] = worker[0]

    def peer_lost(self, peer: bytes) -> None:
        self._bound.pop(peer, None)
        self._reader = {w: p for w, p in self._reader.items() if p != peer}

    def peer_moved(self, old: bytes, new: bytes) -> None:  # the same producer, reconnected: same streams, cursors
        if old in self._bound:
            self._bound[new] = self._bound.pop(old)
        self._reader = {w: new if p == old else p for w, p in self._reader.items()}

    def may_take(self, peer: bytes, seq: int, live: Collection[bytes]) -> bool:
        """A re-issue goes by the rules of new batches (see :meth:`_candidates`), whether or not the stream has
        batches left to issue."""
        stream = decode_seq(seq)[0]
        reader = self._reader.get(stream)
        another_reads = reader not in (None, peer) and reader in live
        own = self._bound.get(peer)
        if own is not None:
            return own == stream and not (another_reads and self._bound.get(reader) == stream)
        return not another_reads and not any(s == stream and p in live for p, s in self._bound.items())

    def issued(self, peer: bytes, seq: int) -> None:
        self._reader[decode_seq(seq)[0]] = peer

    # --- issue ----------------------------------------------------------------------------------------------
    def stale(self, seq: int) -> bool:
        w, k = decode_seq(seq)
        if w >= self.plan.streams or k < self.resume_streams[w]:
            return True
        end = self.ends.get(w)
        return (end is not None and k > end) or k < self._handed[w] or k in self._handed_above[w]

    def next_seq(self, peer: bytes, live: Collection[bytes], speculate: bool) -> int | None:
        """The next batch of the peer's own stream (bound), else of the stream needed first among those it read,
        then among those no live producer reads. In order without ``speculate``, only the batch the loop waits
        for."""
        cursor = self._settle() if self._in_order else None
        if self._in_order and cursor is None:
            return None  # every stream ended
        for w in self._candidates(peer, live):
            k = self._next_batch[w]
            if self.stale(encode_seq(w, k)):  # the stream ended: nothing more to issue
                continue
            if self._in_order and not speculate and (w, k) != cursor:
                continue
            self._next_batch[w] = k + 1
            return encode_seq(w, k)
        return None

    def _candidates(self, peer: bytes, live: Collection[bytes]) -> list[int]:
        own = self._bound.get(peer)
        if own is not None:  # its own stream, unless another live producer of that stream reads it
            reader = self._reader.get(own)
            taken = reader not in (None, peer) and reader in live and self._bound.get(reader) == own
            return [] if taken else [own]
        bound = {s for p, s in self._bound.items() if p in live}
        mine, nobodys = [], []
        for w in range(self.plan.streams):
            if w in bound or not self._open(w):
                continue
            reader = self._reader.get(w)
            if reader == peer:
                mine.append(w)
            elif reader is None or reader not in live:
                nobodys.append(w)
        need = lambda w: (self._next_batch[w], w)  # noqa: E731  (the order the loop needs them in)
        return sorted(mine, key=need) + sorted(nobodys, key=need)

    def _open(self, w: int) -> bool:
        end = self.ends.get(w)
        return end is None or self._next_batch[w] <= end

    @property
    def waiting(self) -> int:
        """In order: one while the batch the loop waits for is not issued yet (speculation held back by the
        reserve is not counted). Out of order: the streams with batches left to issue."""
        if not self._in_order:
            return sum(1 for w in range(self.plan.streams) if self._open(w))
        cursor = self._settle()
        return 0 if cursor is None else int(self._next_batch[cursor[0]] == cursor[1])

    # --- what a task carries, what an answer must hold ------------------------------------------------
    def indices(self, seq: int) -> list[int]:
        return self.plan.batch(seq)

    def task_fields(self, seq: int) -> dict[str, Any]:
        return self.plan.task_fields(seq)

    def index_range(self, dataset_len: int | None) -> int | None:
        return self.plan.streams

    def read_answer(self, header: dict[str, Any], seq: int, epoch: int) -> Answer:
        return read_counted(header, seq, epoch, self.plan.batch_size, self.plan.batch(seq))

    def ended(self, seq: int, *, empty: bool) -> None:
        w, k = decode_seq(seq)
        last = k - 1 if empty else k
        end = self.ends[w] = min(last, self.ends.get(w, last))
        beyond = [s for s in self._items if decode_seq(s)[0] == w and decode_seq(s)[1] > end]
        for s in beyond:  # put before the end was known (a re-issue answered first): never delivered
            if not self._items.pop(s).skipped:
                self.held -= 1
        if beyond and not self._in_order:
            self._arrivals = deque(s for s in self._arrivals if s not in beyond)

    # --- delivery ---------------------------------------------------------------------------------------
    def _arrived(self, seq: int) -> None:
        if not self._in_order:
            self._arrivals.append(seq)

    def _next_ready(self) -> int | None:
        if not self._in_order:
            seq = self._arrivals.popleft() if self._arrivals else None
        else:
            cursor = self._settle()
            seq = encode_seq(*cursor) if cursor is not None else None
            if seq is None or seq not in self._items:
                return None
            self._step()
        if seq is not None:
            self._hand_on(*decode_seq(seq))
        return seq

    def _exhausted(self) -> bool:
        if self._in_order:
            return self._settle() is None
        return not self._arrivals and self._all_ended(lambda w: self._handed[w])

    def _hand_on(self, w: int, k: int) -> None:
        if k != self._handed[w]:
            self._handed_above[w].add(k)
            return
        k += 1
        while k in self._handed_above[w]:
            self._handed_above[w].discard(k)
            k += 1
        self._handed[w] = k

    # --- the round-robin cursor (in order) --------------------------------------------------------------
    def _settle(self) -> tuple[int, int] | None:
        """Move the cursor past positions with nothing to hand on; the ``(stream, batch)`` it rests on, or None
        once every stream ended before it."""
        while True:
            w, k = self._stream, self._round
            end = self.ends.get(w)
            if k >= self.resume_streams[w] and (end is None or k <= end):
                return w, k
            if self._all_ended(self._from_cursor):
                return None
            self._step()

    def _step(self) -> None:
        self._stream += 1
        if self._stream == self.plan.streams:
            self._stream = 0
            self._round = self._next_round(self._round + 1)

    def _next_round(self, r: int) -> int:
        """The first round from ``r`` in which some stream may have a batch (a resume may start streams late)."""
        rounds = []
        for w in range(self.plan.streams):
            first, end = max(r, self.resume_streams[w]), self.ends.get(w)
            if end is None or first <= end:
                rounds.append(first)
        return min(rounds, default=r)

    def _from_cursor(self, w: int) -> int:
        """Stream ``w``'s first batch at or after the cursor."""
        return max(self.resume_streams[w], self._round + (1 if w < self._stream else 0))

    def _all_ended(self, next_of: Any) -> bool:
        """Every stream's end is known and lies before ``next_of(stream)``."""
        return len(self.ends) == self.plan.streams and all(self.ends[w] < next_of(w) for w in self.ends)

    @staticmethod
    def streams_after(streams: tuple[int, ...], seq: int) -> tuple[int, ...]:
        if not streams:
            return streams
        w, k = decode_seq(seq)
        return (*streams[:w], max(streams[w], k + 1), *streams[w + 1:])

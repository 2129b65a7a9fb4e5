"""Serving a sharded dataset's tasks: one cursor per shard, a shard's batches read in order.

A streaming TASK names a shard (``indices == [shard index]``) and ``shard == [k, batch_size, drop_last,
shuffle]``: "batch ``k`` of that shard" (with ``shuffle``, of the shard passed through the dataset's
``shuffle_buffer``, seeded from the task's seed and epoch and the shard index). The answer is a BATCH carrying
``count`` (its samples) and ``last`` (nothing follows in this shard), or an empty BATCH (``count`` 0, no tree) when
the shard has no batch ``k`` (it ended, or ``drop_last`` dropped its short tail). See
docs/ARCHITECTURE.md#streaming-sources. An iterable dataset's streams run the same way (:mod:`.streams`).

* **Cursors.** After batch ``k`` the shard's iterator stays open, positioned at sample ``(k + 1) * B``, so
  the consumer's next task for that shard costs no re-reading. A task at another position (a re-issue after
  a producer died) opens the shard afresh and skips ``k * B`` samples: a cost paid only after a failure.
  At most :data:`MAX_CURSORS` iterators stay open; the least recently used is closed.
* **Ends.** Where a shard was seen to end is remembered (at most :data:`MAX_KNOWN_ENDS`): a task past it, which
  the consumer issued before it knew the end, is answered empty at once, where it opened the shard again and
  read it through (a whole shard's reading, for nothing, and the next epoch's tasks of that shard behind it).
* **Order.** The batches of one shard run one after another, lowest ``k`` first, on one worker of the batch
  pool at a time (:class:`ShardRunner`); different shards run in parallel. Nothing ever waits on another
  task, so the pool cannot deadlock.
* **Errors.** An exception from ``iter_shard`` is a FAIL naming the shard index: the consumer treats the
  shard as ending there (its iterator is broken).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
from collections import OrderedDict
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator

from ferry.common import protocol
from ferry.common.encoder import encode_tree
from ferry.common.sampleinfo import loading
from ferry.common.shardplan import SHARD_STRIDE, is_sharded, shard_names, shuffle_buffer, shuffled
from ferry.common.streamplan import is_iterable
from ferry.producer.loading.convert import convert as default_convert
from ferry.producer.core.jobs import Outcome

__all__ = ["MAX_CURSORS", "ShardRunner", "runner_for"]

#: Open shard iterators a producer keeps, at most (one per shard it is reading, normally).
MAX_CURSORS = 64
#: Shard ends a producer remembers, at most (least recently learned forgotten first).
MAX_KNOWN_ENDS = 4096


@dataclass
class _Cursor:
    iterator: Iterator[Any]
    position: int  # samples already taken from it
    tag: tuple[int, ...] = ()  # (epoch, seed, shuffle buffer): a shuffled stream differs per epoch


@dataclass(order=True)
class _Queued:
    k: int
    order: int
    job: Any = field(compare=False)


class ShardRunner:
    """Runs streaming jobs: per shard in ``k`` order, one worker per shard at a time.

    An iterable dataset's streams run the same way (:class:`ferry.producer.loading.streams.StreamRunner`), through the
    hooks :meth:`_key` (which jobs share a cursor and run in turn), :meth:`_open` (a fresh iterator), :meth:`_tag`
    (what else a cursor must match) and :meth:`_reading` (around a batch's reading).
    """

    def __init__(self, dataset: Any, *, pool: Executor, collate: Callable[[list[Any]], Any], batch_first: bool = True,
                 convert: Callable[[Any], Any] = default_convert,
                 finish: Callable[[Any, Any], None], fail: Callable[[Any, list[dict[str, Any]]], Any],
                 error_record: Callable[[int, BaseException], dict[str, Any]],
                 compress: Callable[[Any, Any, list[Any]], tuple[Any, list[Any]]] | None = None) -> None:
        self._dataset = dataset
        self._setup(dataset)
        self._pool = pool
        self._collate = collate
        self._batch_first = batch_first  # False: the user's collate_fn, whose output the BATCH marks so
        self._convert = convert  # an unbatched task's one sample: the user's collate_fn, else default_convert's
        self._finish = finish  # (job, outcome): hand the message to the main loop
        self._fail = fail
        self._error_record = error_record
        self._compress = compress  # (job, spec, frames) -> (spec, frames): the job's codec, if it has one
        self._lock = threading.Lock()
        self._queues: dict[Any, list[_Queued]] = {}  # key (a shard index) -> jobs waiting, lowest k first
        self._busy: set[Any] = set()  # keys a worker is draining
        self._cursors: OrderedDict[Any, _Cursor] = OrderedDict()
        self._ends: OrderedDict[Any, tuple[tuple[Any, ...], int]] = OrderedDict()  # key -> (tag, samples), if known
        self._order = itertools.count()

    # --- what a sharded dataset's runner does its own way -----------------------------------------------
    def _setup(self, dataset: Any) -> None:
        self._names = shard_names(dataset)
        self._buffer = shuffle_buffer(dataset)  # within-shard shuffle, when a task asks for it

    def _key(self, job: Any) -> Any:
        """The jobs that share a cursor and run one after another: a shard's."""
        return job.indices[0]

    def _tag(self, job: Any) -> tuple[Any, ...]:
        """What a cursor must match beyond its position: a shuffled stream differs per (epoch, seed, buffer)."""
        buffer = self._buffer if job.shard[3] else 0
        return (job.epoch, job.seed, buffer) if buffer else ()

    def _open(self, job: Any) -> Iterator[Any]:
        """A fresh iterator over the job's shard (shuffled where the job asks)."""
        shard, buffer = job.indices[0], self._buffer if job.shard[3] else 0
        samples = iter(self._dataset.iter_shard(self._names[shard]))
        if buffer:
            samples = _Closing(shuffled(samples, buffer, seed=job.seed, epoch=job.epoch, shard=shard), samples)
        return samples

    def _where(self, job: Any) -> str:
        """What a job's error names first: its source, and that source's batch."""
        return f"{self._source(job)}, its batch {job.shard[0] if job.shard else '?'}"

    def _source(self, job: Any) -> str:
        """The job's shard, by name (a shard out of range by its number)."""
        shard = job.indices[0]
        return f"shard {self._names[shard]!r}" if isinstance(shard, int) and 0 <= shard < len(self._names) else \
            f"shard {shard}"

    def _reading(self, job: Any) -> ContextManager[Any]:
        """Around the reading of a job's samples (opening, skipping, the batch)."""
        return contextlib.nullcontext()

    # --- running jobs -------------------------------------------------------------------------------------
    def submit(self, job: Any) -> None:
        key = self._key(job)
        with self._lock:
            heapq.heappush(self._queues.setdefault(key, []), _Queued(job.shard[0], next(self._order), job))
            if key in self._busy:
                return
            self._busy.add(key)
        self._pool.submit(self._drain, key)

    def _drain(self, key: Any) -> None:
        while True:
            with self._lock:
                queue = self._queues.get(key)
                if not queue:
                    self._queues.pop(key, None)
                    self._busy.discard(key)
                    return
                job = heapq.heappop(queue).job
            try:
                outcome = self._answer(job)
            except BaseException as exc:  # never lose a job: a bug here becomes a FAIL the consumer sees
                self._drop_cursor(key)
                record = self._error_record(job.indices[0], exc)
                record["message"] = f"{self._where(job)}: {record['message']}"  # the index is the shard's, or stream's
                outcome = self._fail(job, [record])
            self._finish(job, outcome)

    def _answer(self, job: Any) -> Any:
        k, batch_size, drop_last, _ = job.shard
        with self._reading(job):
            samples = self._read(self._key(job), k, batch_size, job)
        last = len(samples) < batch_size
        if not samples or (last and drop_last):
            header = protocol.pack(protocol.BATCH, session=job.session, task=job.task, epoch=job.epoch, seq=job.seq,
                                   tree=None, errors=[], count=0, last=True)
            return _outcome(job, [header])
        unbatched = job.unbatched is not None  # one sample (batch_size 1): not collated
        tree = self._convert(samples[0]) if unbatched else self._collate(samples)
        spec, frames = encode_tree(tree, chunk_bytes=job.frame_bytes, slot=job.slot, pickle_ok=job.pickle_ok)
        if self._compress is not None:
            spec, frames = self._compress(job, spec, frames)
        header = protocol.pack(protocol.BATCH, session=job.session, task=job.task, epoch=job.epoch, seq=job.seq,
                               tree=spec, errors=[], count=len(samples), last=last,
                               **({} if self._batch_first and not unbatched else {"batch_first": False}))
        return _outcome(job, [header, *frames])

    def _read(self, key: Any, k: int, batch_size: int, job: Any) -> list[Any]:
        start = k * batch_size
        tag = self._tag(job)
        with self._lock:
            end = self._ends.get(key)
            if end is not None and end[0] == tag and start >= end[1]:
                return []  # past where it was seen to end (a task issued before the consumer knew): no re-reading
            cursor = self._cursors.pop(key, None)
        origin = job.indices[0] * SHARD_STRIDE  # sample_info().index of a streamed sample: shard and position
        if cursor is None or cursor.position != start or cursor.tag != tag:
            _close(cursor)
            cursor = _Cursor(self._open(job), 0, tag)
            try:
                skipped = _skip(cursor.iterator, start, job, origin)  # re-issue or resume: skip what was delivered
            except BaseException:
                _close(cursor)
                raise
            cursor.position = skipped
            if skipped < start:
                _close(cursor)
                self._ended(key, tag, skipped)
                return []
        samples = []
        try:
            for offset in range(start, start + batch_size):
                with loading(job.seed, job.epoch, origin + offset):
                    sample = next(cursor.iterator, _END)
                if sample is _END:
                    break
                samples.append(sample)
        except BaseException:
            _close(cursor)  # a broken iterator: its file closes now, not whenever it is collected
            # it ends here (its FAIL ends it for the consumer): the tasks past it that were issued before the consumer
            # knew are answered empty, not by reading it again to the same error, each a skipped sample more. The end
            # is after the failed sample: its own batch, re-issued, is read and fails again
            self._ended(key, tag, start + len(samples) + 1)
            raise
        cursor.position += len(samples)
        if len(samples) == batch_size:
            with self._lock:
                self._cursors[key] = cursor
                while len(self._cursors) > MAX_CURSORS:
                    _close(self._cursors.popitem(last=False)[1])
        else:
            _close(cursor)
            self._ended(key, tag, cursor.position)
        return samples

    def _ended(self, key: Any, tag: tuple[Any, ...], position: int) -> None:
        """The iterator of ``key`` (with ``tag``) ends after ``position`` samples."""
        with self._lock:
            self._ends[key] = (tag, position)
            self._ends.move_to_end(key)
            while len(self._ends) > MAX_KNOWN_ENDS:
                self._ends.popitem(last=False)

    def _drop_cursor(self, key: Any) -> None:
        with self._lock:
            _close(self._cursors.pop(key, None))

    def close(self) -> None:
        with self._lock:
            while self._cursors:
                _close(self._cursors.popitem()[1])


_END = object()


class _Closing:
    """An iterator over a wrapped one, whose ``close`` also closes the source (a shard's file)."""

    def __init__(self, iterator: Iterator[Any], source: Iterator[Any]) -> None:
        self._iterator, self._source = iterator, source

    def __iter__(self) -> "_Closing":
        return self

    def __next__(self) -> Any:
        return next(self._iterator)

    def close(self) -> None:
        for it in (self._iterator, self._source):
            close = getattr(it, "close", None)
            if callable(close):
                close()


def _skip(iterator: Iterator[Any], count: int, job: Any, origin: int) -> int:
    """Read and drop the first ``count`` samples of a stream or shard (``origin``: its first sample's index), each
    under the :func:`~ferry.common.sampleinfo.sample_info` it had when it was delivered, so that a dataset that draws
    from it (an augmentation, a shuffle seeded in ``__iter__``) reads the same samples again. Returns how many
    there were (fewer: the stream ended)."""
    skipped = 0
    while skipped < count:
        with loading(job.seed, job.epoch, origin + skipped):
            if next(iterator, _END) is _END:
                break
        skipped += 1
    return skipped


def _close(cursor: _Cursor | None) -> None:
    close = getattr(cursor.iterator, "close", None) if cursor is not None else None
    if callable(close):
        close()


def runner_for(dataset: Any, **parts: Any) -> ShardRunner | None:
    """The runner of a streaming dataset's tasks, with the batcher's ``parts`` (see :class:`ShardRunner`): a
    ShardRunner for a sharded dataset, a StreamRunner for an iterable one; None for a map-style dataset."""
    if is_sharded(dataset):
        return ShardRunner(dataset, **parts)
    if is_iterable(dataset):
        from ferry.producer.loading.streams import StreamRunner

        return StreamRunner(dataset, **parts)
    return None


def _outcome(job: Any, frames: list[Any]) -> Outcome:
    return Outcome(job, frames)

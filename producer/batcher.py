"""Turns a TASK's index list into a ready-to-send BATCH or FAIL message, off the main loop.

A dataset that offers the *fast path* (``array_layout()`` and ``read_into(index, out) -> label``, as the
built-in ``npy-folder`` and ``synthetic`` do) has each sample written straight into its row of a reused
batch buffer: no per-sample array, no collation copy. Its batches are ``[array, int64 labels]``, exactly
what default_collate makes of ``(array, int)`` samples. Any other dataset takes the general path:
``dataset[i]``, then :func:`ferry.producer.collate.collate`.

Two thread pools, so that one never waits on itself:

* the *sample pool* (``threads`` workers) runs ``dataset[i]``: the samples of one batch load
  concurrently (file reads and numpy release the GIL, and an SSD wants a deep queue);
* the *batch pool* (one worker per slot) waits for a task's samples, collates, encodes the tree and packs
  the header.

A finished message goes into ``done`` (a queue the main loop drains) and the main loop is woken through
its :class:`~ferry.common.waker.Waker`. Only the main loop touches sockets.
"""

from __future__ import annotations

import queue
import threading
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ferry.common import protocol
from ferry.common.codec import encode_tree
from ferry.common.constants import FRAME_CHUNK_BYTES, REMOTE_MESSAGE_CHARS, REMOTE_TRACEBACK_CHARS
from ferry.common.sampleinfo import loading
from ferry.common.shardplan import is_sharded
from ferry.common.waker import Waker

from ferry.producer.buffers import BufferPool
from ferry.producer.collate import collate


@dataclass
class Job:
    """One TASK received from one consumer connection."""

    conn_key: int  # which connection it came from
    session: int
    task: int
    epoch: int
    seq: int
    indices: list[int]
    on_error: str
    slot: Any = None  # a ferry.common.shm.SlotWriter: the consumer's shared memory to write this batch into
    seed: int = 0  # the loader's seed: sample_info().seed derives from (seed, epoch, index)
    shard: Any = None  # a sharded dataset's task: [k, batch_size, drop_last] of shard indices[0] (producer/shards.py)


@dataclass
class Outcome:
    """A message ready for the main loop to send back on ``conn_key``."""

    job: Job
    frames: list[Any] = field(default_factory=list)  # header first, then array frames
    failed: bool = False
    buffer: Any = None  # a pooled batch buffer to give back once ZeroMQ has sent it
    buffer_frames: int = 0  # how many frames after the header are views of `buffer`


def _load(dataset: Any, index: int, job: Job) -> Any:
    with loading(job.seed, job.epoch, index):
        return dataset[index]


def _read_into(dataset: Any, index: int, row: Any, job: Job) -> Any:
    with loading(job.seed, job.epoch, index):
        return dataset.read_into(index, row)


def _error_record(index: int, exc: BaseException) -> dict[str, Any]:
    return {
        "index": index,
        "exc_type": type(exc).__name__,
        "message": str(exc)[:REMOTE_MESSAGE_CHARS],
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-REMOTE_TRACEBACK_CHARS:],
    }


class Batcher:
    """Loads and collates batches on thread pools. ``close()`` waits for running work, bounded."""

    def __init__(self, dataset: Any, *, threads: int, batch_workers: int, done: "queue.SimpleQueue[Outcome]",
                 waker: Waker, collate_fn: Any = None) -> None:
        self._dataset = dataset
        self._collate = collate_fn or collate
        layout = dataset.array_layout() if callable(getattr(dataset, "array_layout", None)) else None
        # the fast path makes default_collate's [array, labels] itself: not with the user's own collate_fn
        self._layout = layout if callable(getattr(dataset, "read_into", None)) and collate_fn is None else None
        self.pool = BufferPool(limit=batch_workers + 2)
        self._samples = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ferry-sample")
        self._batches = ThreadPoolExecutor(max_workers=batch_workers, thread_name_prefix="ferry-batch")
        self._done = done
        self._waker = waker
        self._lock = threading.Lock()
        self.pending = 0  # jobs submitted and not yet in `done`
        self._shards = None  # a sharded dataset's tasks run through producer/shards.py
        if is_sharded(dataset):
            from ferry.producer.shards import ShardRunner

            self._shards = ShardRunner(dataset, pool=self._batches, collate=self._collate, finish=self._finish,
                                       fail=self._fail, error_record=_error_record)

    def submit(self, job: Job) -> None:
        with self._lock:
            self.pending += 1
        if self._shards is not None:
            if job.shard is None:  # the consumer planned a map-style dataset: answer, never crash the loop
                self._finish(job, self._fail(job, [_error_record(job.indices[0], TypeError(
                    "this producer serves a sharded dataset; the consumer sent a map-style task (was it given "
                    "dataset_len? a sharded dataset needs none)"))]))
                return
            self._shards.submit(job)
            return
        self._batches.submit(self._run, job)

    def _finish(self, job: Job, outcome: Outcome) -> None:
        with self._lock:
            self.pending -= 1
        self._done.put(outcome)
        self._waker.wake()

    def _run(self, job: Job) -> None:
        try:
            outcome = self._assemble(job)
        except BaseException as exc:  # never lose a job: a bug here becomes a FAIL the consumer sees
            outcome = self._fail(job, [_error_record(job.indices[0], exc)])
        with self._lock:
            self.pending -= 1
        self._done.put(outcome)
        self._waker.wake()

    def _assemble(self, job: Job) -> Outcome:
        if self._layout is not None:
            return self._assemble_fast(job)
        futures: list[Future] = [self._samples.submit(_load, self._dataset, i, job) for i in job.indices]
        samples, errors = [], []
        for index, future in zip(job.indices, futures):
            try:
                samples.append(future.result())
            except Exception as exc:
                errors.append(_error_record(index, exc))
        if errors and (job.on_error == "raise" or not samples):
            return self._fail(job, errors)
        try:
            tree = self._collate(samples)
            spec, array_frames = encode_tree(tree, chunk_bytes=FRAME_CHUNK_BYTES, slot=job.slot)
        except Exception as exc:
            return self._fail(job, [_error_record(job.indices[0], exc)])
        header = protocol.pack(
            protocol.BATCH, session=job.session, task=job.task, epoch=job.epoch, seq=job.seq, tree=spec, errors=errors
        )
        return Outcome(job, [header, *array_frames])

    def _assemble_fast(self, job: Job) -> Outcome:
        shape, dtype = self._layout
        batch_shape = (len(job.indices), *shape)
        room = job.slot.reserve(int(np.prod(batch_shape)) * np.dtype(dtype).itemsize) if job.slot else None
        # straight into the consumer's shared memory if there is a slot, else a pooled buffer. release() below
        # ignores what the pool did not hand out, so a slot view needs no special case there
        buffer = room.view(dtype).reshape(batch_shape) if room is not None else self.pool.acquire(batch_shape, dtype)
        futures = [self._samples.submit(_read_into, self._dataset, i, buffer[row], job)
                   for row, i in enumerate(job.indices)]
        labels, good, errors = [], [], []
        for row, (index, future) in enumerate(zip(job.indices, futures)):
            try:
                labels.append(future.result())
                good.append(row)
            except Exception as exc:
                errors.append(_error_record(index, exc))
        if errors and (job.on_error == "raise" or not good):
            self.pool.release(buffer)
            return self._fail(job, errors)
        if errors:  # skip: a rare path, so a compacting copy is fine
            array, pooled = buffer[good], None
            self.pool.release(buffer)
        else:
            array, pooled = buffer, (buffer if room is None else None)
        spec, array_frames = encode_tree([array, np.asarray(labels, dtype=np.int64)], chunk_bytes=FRAME_CHUNK_BYTES,
                                         slot=job.slot)
        header = protocol.pack(
            protocol.BATCH, session=job.session, task=job.task, epoch=job.epoch, seq=job.seq, tree=spec, errors=errors
        )
        return Outcome(job, [header, *array_frames], buffer=pooled, buffer_frames=len(array_frames) - 1)

    @staticmethod
    def _fail(job: Job, errors: list[dict[str, Any]]) -> Outcome:
        header = protocol.pack(
            protocol.FAIL, session=job.session, task=job.task, epoch=job.epoch, seq=job.seq, errors=errors
        )
        return Outcome(job, [header], failed=True)

    def close(self) -> None:
        self._batches.shutdown(wait=True, cancel_futures=True)
        self._samples.shutdown(wait=True, cancel_futures=True)
        if self._shards is not None:
            self._shards.close()

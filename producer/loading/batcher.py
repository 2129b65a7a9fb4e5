"""Turns a TASK's index list into a ready-to-send BATCH or FAIL message, off the main loop.

A dataset that offers the *fast path* (``array_layout()`` and ``read_into(index, out) -> label``, as the
built-in ``npy-folder`` and ``synthetic`` do) has each sample written straight into its row of a reused
batch buffer: no per-sample array, no collation copy. Its batches are ``[array, int64 labels]``, exactly
what default_collate makes of ``(array, int)`` samples.

Any other dataset takes the *general path*. Its first batch is ``dataset[i]`` then
:func:`~ferry.producer.loading.collate.collate`, which teaches a :class:`~ferry.producer.loading.collate.RowLayout`. From the
next batch on, each loading thread copies its sample's arrays into their row of the batch's destination (the
task's shared-memory slot, else one pooled buffer) as soon as ``dataset[i]`` returns, so the per-sample arrays
die at once and the batch needs no stacking copy. A sample that does not fit the layout sends its batch back
to ``collate``: the results are the same either way.

When a batch does not collate, the samples to blame are named (:mod:`ferry.producer.loading.culprits`).

With the user's own ``collate_fn`` its output is sent as it is, marked ``batch_first: False`` in the BATCH: the
consumer then checks its structure, not its sample counts (a detection model's ``tuple(zip(*batch))``, a
``PackedSequence``). So is each sample of an unbatched loader's task (``unbatched`` in the TASK,
``batch_size=None``): ``dataset[i]`` (or ``dataset[list]``) through the user's ``collate_fn``, or else
:func:`~ferry.producer.loading.convert.convert`, no collation.

Two thread pools, so that one never waits on itself:

* the *sample pool* (``threads`` workers) runs ``dataset[i]``: the samples of one batch load
  concurrently (file reads and numpy release the GIL, and an SSD wants a deep queue);
* the *batch pool* (one worker per slot) waits for a task's samples, collates, encodes the tree and packs
  the header.

A finished message goes into ``done`` (a queue the main loop drains) and the main loop is woken through
its :class:`~ferry.common.waker.Waker`. Only the main loop touches sockets.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ferry.common import protocol
from ferry.common.encoder import encode_tree
from ferry.common.errors import BatchTooLarge, BatchTypeError
from ferry.common.shm import SLOT_ALIGN
from ferry.common.waker import Waker

from ferry.producer.io.buffers import BufferPool, tracked
from ferry.producer.loading.collate import RowLayout, collate
from ferry.producer.loading.convert import convert
from ferry.producer.loading.culprits import collate_or_blame, whole_batch
from ferry.producer.core.jobs import Job, Outcome
from ferry.producer.loading.samples import BatchFailed, error_record, load_item, load_row, read_row, written_first
from ferry.producer.loading.samplepool import SamplePool, Turns
from ferry.producer.loading.shards import runner_for

__all__ = ["Batcher", "Job", "Outcome"]


class Batcher:
    """Loads and collates batches on thread pools. ``close()`` waits for running work, bounded."""

    def __init__(self, dataset: Any, *, threads: int, batch_workers: int, done: "queue.SimpleQueue[Outcome]",
                 waker: Waker, collate_fn: Any = None, compressor: Any = None,
                 shared: "tuple[SamplePool | None, BufferPool] | None" = None,
                 seed_per_sample: bool | None = None) -> None:
        """``shared``: the sample pool and the buffer pool of another batcher, to use instead of its own (a
        producer pool's datasets share them: producer/loading/pool.py); ``close()`` then leaves them to their owner. A
        sample pool of None there: this batcher's own, of one thread (a dataset whose loads must not overlap)."""
        self._dataset = dataset
        self._collate_fn = collate_fn  # the user's own: then samples reach it as they are, no row layout
        layout = dataset.array_layout() if callable(getattr(dataset, "array_layout", None)) else None
        # the fast path makes default_collate's [array, labels] itself: not with the user's own collate_fn
        self._layout = layout if callable(getattr(dataset, "read_into", None)) and collate_fn is None else None
        self.pool = BufferPool(limit=batch_workers + 2) if shared is None else shared[1]
        self._rows: RowLayout | None = None  # the general path's sample layout, learned from a batch
        self._populated: set[tuple[int, int]] = set()  # slot regions this process has faulted in
        serial = shared is not None and shared[0] is None  # its loads must not overlap: its own one-thread pool
        self._owns_samples = shared is None or serial
        self._samples = SamplePool(1 if serial else threads) if self._owns_samples else shared[0]
        # one loading thread: batches submit their samples in the order they were started (samplepool.Turns)
        self._turns = Turns() if self._samples.threads == 1 else None
        # a dataset that may not load concurrently loads on its one loading thread only, as in a DataLoader worker
        # (a connection it opened there may be bound to that thread); others may load a one-sample batch inline
        self._load_one = self._samples.submit if serial else self._samples.run_or_submit
        self._batches = ThreadPoolExecutor(max_workers=batch_workers, thread_name_prefix="ferry-batch")
        self._done = done
        self._waker = waker
        self._compressor = compressor  # a ferry.producer.loading.compressing.FrameCompressor, owned by the service
        self._lock = threading.Lock()
        self.pending = 0  # jobs submitted and not yet in `done`
        # a sharded or iterable dataset's tasks run through producer/loading/shards.py (and streams.py); None: map-style
        self._shards = runner_for(dataset, pool=self._batches, collate=collate_fn or collate,
                                  batch_first=collate_fn is None, convert=collate_fn or convert,
                                  finish=self._finish, fail=self._fail, error_record=error_record,
                                  compress=lambda job, spec, frames: self._compress(job, spec, frames, None, 0)[:2])
        # a map-style dataset whose samples load one at a time (a sharded or iterable one's run on the batch pool)
        self.serial = serial and self._shards is None
        # each sample under generators seeded from (seed, epoch, index): only where loads never overlap, since the
        # generators are the process's (--seed-per-sample: by default where loads are serial; 1 made them serial)
        self._seed_globals = self.serial and seed_per_sample is not False

    @property
    def samples(self) -> SamplePool:
        """The pool its samples load on: its own, or one it shares with other datasets (producer/loading/pool.py)."""
        return self._samples

    def submit(self, job: Job) -> None:
        job.seed_globals = self._seed_globals
        with self._lock:
            self.pending += 1
        if self._shards is not None:
            if job.shard is None:  # the consumer planned a map-style dataset: answer, never crash the loop
                self._finish(job, self._fail(job, [error_record(job.indices[0], TypeError(
                    "this producer serves a sharded or iterable dataset; the consumer sent a map-style task (was it "
                    "given dataset_len, or a sampler? such a dataset takes neither)"))]))
                return
            self._shards.submit(job)
            return
        if self._turns is None:
            self._batches.submit(self._run, job, None)
            return
        ticket = self._turns.ticket()
        turns = self._turns
        self._batches.submit(self._run, job, ticket).add_done_callback(
            lambda future: turns.passed(ticket) if future.cancelled() else None)

    def _finish(self, job: Job, outcome: Outcome) -> None:
        with self._lock:
            self.pending -= 1
        self._done.put(outcome)
        self._waker.wake()

    def _run(self, job: Job, ticket: int | None) -> None:
        """``ticket``: the job's turn at a one-thread sample pool (None: no turns)."""
        try:
            outcome = self._assemble_one(job, ticket) if job.unbatched else self._assemble(job, ticket)
        except (BatchTooLarge, BatchTypeError) as exc:  # one record, whatever on_error: raised, never skipped
            outcome = self._fail(job, [error_record(job.indices[0], exc)])
        except BaseException as exc:  # never lose a job: a bug here becomes a FAIL the consumer sees
            outcome = self._fail(job, whole_batch(job, job.indices, exc))
        finally:
            if ticket is not None:
                self._turns.passed(ticket)  # if its turn never came (it failed first): the next job's comes
        self._finish(job, outcome)

    def _turn(self, ticket: int | None) -> Any:
        """While held, this job alone submits samples (every job started before it has submitted its own)."""
        return self._turns.turn(ticket) if ticket is not None else contextlib.nullcontext()

    def _assemble_one(self, job: Job, ticket: int | None) -> Outcome:
        """An unbatched loader's task: one sample, ``dataset[i]`` (``dataset[indices]`` for a sampler's list),
        through the user's collate_fn or else :func:`convert`, as DataLoader with ``batch_size=None``."""
        item = job.indices if job.unbatched == "list" else job.indices[0]
        try:
            with self._turn(ticket):
                loading = self._load_one(load_item, self._dataset, item, job)
            sample = loading.result()
            tree = (self._collate_fn or convert)(sample)
        except Exception as exc:
            return self._fail(job, [error_record(job.indices[0], exc)])
        return self._message(job, tree, [], None, untracked=0, batch_first=False)

    def _assemble(self, job: Job, ticket: int | None) -> Outcome:
        if self._layout is not None:
            return self._assemble_fast(job, ticket)
        with self._turn(ticket):
            layout = self._rows  # learned from an earlier batch; None until then (or when samples defeat it)
            futures: list[Future] = []
            if layout is None and self._collate_fn is None:  # learn it from this batch's first sample, so that even the first batch takes rows
                futures.append(self._samples.submit(load_row, self._dataset, job.indices[0], job, None, [], 0))
                layout = self._learn_first(futures[0])
            dests, pooled = self._destinations(layout, job) if layout is not None else ([], None)
            fresh = pooled is None and self._fresh(job)
            if futures and layout is not None:
                futures[0] = written_first(futures[0], layout, dests, fresh)
            load = self._load_one if len(job.indices) == 1 else self._samples.submit  # see SamplePool
            futures += [load(load_row, self._dataset, i, job, layout, dests, row, fresh)
                        for row, i in enumerate(job.indices) if row >= len(futures)]
        samples, indices, errors, fitted = [], [], [], 0
        for index, future in zip(job.indices, futures):
            try:
                sample, fits = future.result()
            except Exception as exc:
                errors.append(error_record(index, exc))
                continue
            samples.append(sample)
            indices.append(index)
            fitted += fits
        if errors and (job.on_error == "raise" or not samples):
            self.pool.release(pooled)
            return self._fail(job, errors)
        if layout is not None and fitted == len(samples) == len(job.indices):
            tree = layout.assemble(samples, dests)  # the rows are written: no stacking copy
        else:
            # a sample did not fit the layout (or failed to load): collate() as usual; it copies the rows
            # it stacks, so the destination is free for the encoder to reuse
            try:
                tree, samples, odd = collate_or_blame(self._collate_fn or collate, self._dataset, job, samples,
                                                      indices)
            except BatchFailed as failed:
                self.pool.release(pooled)
                return self._fail(job, errors + failed.errors)
            errors += odd
            del dests
            self.pool.release(pooled)
            pooled = None
            if job.slot is not None:
                job.slot.used = 0
            if samples:  # relearn, should the layout be an odd sample's or the data have changed shape
                self._learn(samples[0])
        # every frame is tracked: the array frames are views of the pooled buffer, the rest small. The user's
        # collate_fn may make anything of the samples: the consumer checks its structure, not its sample counts
        return self._message(job, tree, errors, pooled, untracked=0, batch_first=self._collate_fn is None)

    def _learn_first(self, first: Future) -> RowLayout | None:
        """The layout of the sample ``first`` loads (None if it raised or has no layout); kept for later batches."""
        try:
            sample, _ = first.result()
        except Exception:
            return None  # the error is reported with the batch's other results
        self._learn(sample)
        return self._rows

    def _learn(self, sample: Any) -> None:
        """Take the layout of a batch that collated normally for the next ones."""
        if self._collate_fn is not None:
            return
        layout = RowLayout.learn(sample)
        if layout is not None and (self._rows is None or layout.signature != self._rows.signature):
            self._rows = layout

    def _destinations(self, layout: RowLayout, job: Job) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Where the batch's arrays go: the task's shared-memory slot when they fit in it, else one pooled
        buffer. Returns the arrays and the pooled buffer (None for the slot)."""
        rows = len(job.indices)
        if job.slot is not None:
            before = job.slot.used
            sizes = [rows * n for n in layout.row_nbytes()]
            rooms = [job.slot.reserve(n) for n in sizes]
            if all(room is not None for room in rooms):
                rooms_iter = iter(rooms)
                return layout.destinations(rows, lambda n: next(rooms_iter)), None
            job.slot.used = before
        aligned = [-(-rows * n // SLOT_ALIGN) * SLOT_ALIGN for n in layout.row_nbytes()]
        pooled = self.pool.acquire((sum(aligned),), np.dtype(np.uint8))
        offsets = iter(np.cumsum([0, *aligned[:-1]]).tolist())

        def room(nbytes: int) -> np.ndarray:
            start = next(offsets)
            return pooled[start : start + nbytes]

        return layout.destinations(rows, room), pooled

    def _fresh(self, job: Job) -> bool:
        """True the first time this process writes the part of the task's slot that the batch takes: its rows
        are then populated as they are written. Later batches find those pages mapped."""
        if job.slot is None or not job.slot.used:
            return False
        key = (job.slot.region.ctypes.data, job.slot.used)
        if key in self._populated:
            return False
        self._populated.add(key)
        return True

    def _assemble_fast(self, job: Job, ticket: int | None) -> Outcome:
        shape, dtype = self._layout
        batch_shape = (len(job.indices), *shape)
        with self._turn(ticket):
            room = job.slot.reserve(int(np.prod(batch_shape)) * np.dtype(dtype).itemsize) if job.slot else None
            # straight into the consumer's shared memory if there is a slot, else a pooled buffer. release() below
            # ignores what the pool did not hand out, so a slot view needs no special case there
            buffer = room.view(dtype).reshape(batch_shape) if room is not None else self.pool.acquire(batch_shape,
                                                                                                     dtype)
            fresh = room is not None and self._fresh(job)
            load = self._load_one if len(job.indices) == 1 else self._samples.submit  # see SamplePool
            futures = [load(read_row, self._dataset, i, buffer[row], job, fresh) for row, i in enumerate(job.indices)]
        labels, good, errors = [], [], []
        for row, (index, future) in enumerate(zip(job.indices, futures)):
            try:
                labels.append(future.result())
                good.append(row)
            except Exception as exc:
                errors.append(error_record(index, exc))
        if errors and (job.on_error == "raise" or not good):
            self.pool.release(buffer)
            return self._fail(job, errors)
        if errors:  # skip: a rare path, so a compacting copy is fine
            array, pooled = buffer[good], None
            self.pool.release(buffer)
        else:
            array, pooled = buffer, (buffer if room is None else None)
        return self._message(job, [array, np.asarray(labels, dtype=np.int64)], errors, pooled, untracked=1)

    def _message(self, job: Job, tree: Any, errors: list[dict[str, Any]], pooled: Any, untracked: int,
                 batch_first: bool = True) -> Outcome:
        """The BATCH for ``tree``: encoded, compressed as the job says, packed. Its array frames but the last
        ``untracked`` are views of ``pooled``. Should any step raise, ``pooled`` goes back to the pool first.
        ``batch_first`` False: the tree is not Ferry's collation (the BATCH says so; see the module docstring)."""
        try:
            spec, frames = encode_tree(tree, chunk_bytes=job.frame_bytes, slot=job.slot, pickle_ok=job.pickle_ok)
            spec, frames, pooled, views = self._compress(job, spec, frames, pooled, len(frames) - untracked)
            header = protocol.pack(protocol.BATCH, session=job.session, task=job.task, epoch=job.epoch, seq=job.seq,
                                   tree=spec, errors=errors, **({} if batch_first else {"batch_first": False}))
        except BaseException:
            if pooled is not None:
                self.pool.release(pooled)
            raise
        tracker = None
        if pooled is not None and views:  # made here, not on the main loop: it only sends them
            frames, tracker = tracked([header, *frames], views)
            frames = frames[1:]
        return Outcome(job, [header, *frames], buffer=pooled, buffer_frames=views, tracker=tracker)

    def _compress(self, job: Job, spec: Any, frames: list[Any], pooled: Any, views: int) -> tuple[Any, list[Any], Any, int]:
        """Compress the batch's frames as the job says (common/compression.py). The first ``views``
        frames are views of ``pooled``: once every one of them is replaced by compressed bytes, the buffer is
        back in the pool at once (nothing sent reads it); else it stays tracked. Slot leaves have no frames.

        Raises:
            BatchTooLarge: the frames hold more than the consumer's ``max_batch_bytes``. The job's runner answers
                the task with it: the consumer raises it in the loop.
        """
        size = sum(len(f) for f in frames)
        if job.max_batch_bytes is not None and size > job.max_batch_bytes:  # the caller gives ``pooled`` back
            raise BatchTooLarge(f"a batch of {size} bytes ({len(job.indices)} samples) exceeds the consumer's "
                                f"max_batch_bytes={job.max_batch_bytes}: raise max_batch_bytes or lower batch_size")
        if self._compressor is None or not frames or job.compress is None:
            return spec, frames, pooled, views
        result = self._compressor.apply(job.compress, spec, frames)
        if pooled is not None and all(i in result.compressed for i in range(views) if len(frames[i])):
            self.pool.release(pooled)
            pooled, views = None, 0
        return result.spec, result.frames, pooled, views

    @staticmethod
    def _fail(job: Job, errors: list[dict[str, Any]]) -> Outcome:
        header = protocol.pack(
            protocol.FAIL, session=job.session, task=job.task, epoch=job.epoch, seq=job.seq, errors=errors
        )
        return Outcome(job, [header], failed=True)

    @property
    def shared(self) -> "tuple[SamplePool, BufferPool]":
        """The sample pool and buffer pool, for another batcher to share (see ``__init__``)."""
        return self._samples, self.pool

    def close(self) -> None:
        if self._turns is not None:
            self._turns.close()  # a job waiting for its turn fails instead (its consumer is gone or re-issues)
        self._batches.shutdown(wait=True, cancel_futures=True)
        if self._owns_samples:
            self._samples.shutdown()
        if self._shards is not None:
            self._shards.close()

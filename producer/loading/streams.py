"""Serving an iterable dataset's tasks: stream ``w`` of ``N`` is the dataset iterated as DataLoader's worker ``w``
of ``N`` iterates it (docs/ARCHITECTURE.md#iterable-datasets).

A TASK names a stream (``indices == [w]``, ``streams == N``) and ``shard == [k, batch_size, drop_last, 0]``:
"batch ``k`` of stream ``w``". It runs as a shard's task does (:class:`~ferry.producer.loading.shards.ShardRunner`: a
counted answer, one open cursor per stream, a stream's batches in ``k`` order, a re-issue that skips ``k * B``
samples), but the stream is ``iter(dataset)``, and every sample of it is drawn while
``torch.utils.data.get_worker_info()`` reports ``id=w, num_workers=N``:

* A producer started as worker ``w`` of ``N`` (a local producer, seeded by ``seed_process``) reads stream ``w``
  under its own WorkerInfo: its seed, and its dataset copy, the one ``producer_init`` prepared. Any other stream
  is read under a WorkerInfo of that stream's id and count, with the process's seed and dataset.
* torch keeps one WorkerInfo per process, not per thread, so a stream is read under the process's one lock
  (:func:`as_worker`): a producer reads one stream's batch at a time (as a DataLoader worker does), while
  collation and encoding still run in parallel.
* Cursors are kept per consumer session, stream and stream count, and tagged with the epoch: each epoch is a new
  pass over the dataset.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, ContextManager, Iterator

from ferry.producer.loading.shards import ShardRunner

__all__ = ["StreamRunner", "as_worker"]

#: Held while a stream is read: the WorkerInfo torch reports is the process's, not the thread's.
_AS_WORKER = threading.Lock()


@contextlib.contextmanager
def as_worker(worker_id: int, num_workers: int, dataset: Any) -> Iterator[None]:
    """Within, this process reads as DataLoader's worker ``worker_id`` of ``num_workers``:
    ``get_worker_info()`` reports them (where torch is loaded), with the process's seed and dataset copy. One
    thread of the process at a time."""
    with _AS_WORKER:
        if "torch" not in sys.modules:  # not a torch dataset: nothing can ask
            yield
            return
        import torch
        from torch.utils.data._utils import worker

        current = worker._worker_info
        if current is not None and (current.id, current.num_workers) == (worker_id, num_workers):
            yield  # this producer's own place: its own WorkerInfo
            return
        worker._worker_info = worker.WorkerInfo(
            id=worker_id, num_workers=num_workers, seed=current.seed if current is not None else torch.initial_seed(),
            dataset=current.dataset if current is not None else dataset)
        try:
            yield
        finally:
            worker._worker_info = current


class StreamRunner(ShardRunner):
    """Runs an iterable dataset's tasks: per stream in ``k`` order, one worker per stream at a time."""

    def _setup(self, dataset: Any) -> None:
        pass  # no shard names, no shuffle buffer

    def _key(self, job: Any) -> Any:
        return (job.session, job.indices[0], job.streams)

    def _tag(self, job: Any) -> tuple[Any, ...]:
        return (job.epoch,)

    def _open(self, job: Any) -> Iterator[Any]:
        return iter(self._dataset)

    def _source(self, job: Any) -> str:
        return f"stream {job.indices[0]} of {job.streams}"

    def _reading(self, job: Any) -> ContextManager[Any]:
        """Raises (answered by a FAIL) TypeError for a task without ``streams``, IndexError for a stream outside
        them."""
        if job.streams is None:
            raise TypeError("this producer serves an iterable dataset; the consumer sent a task without its stream "
                            "count (streams)")
        if not 0 <= job.indices[0] < job.streams:
            raise IndexError(f"stream {job.indices[0]} is out of range for {job.streams} streams")
        return as_worker(job.indices[0], job.streams, self._dataset)

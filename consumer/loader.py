"""RemoteLoader: the consumer inside the training script.

Lifecycle::

    RemoteLoader(...)          check every option (consumer/options/); start local producers (if any);
                               bind the ROUTER; start the io thread and the staging thread
    for batch in loader:       __iter__ starts a *run* (one epoch's plan) on the io thread and returns an
                               EpochIterator (consumer/epoch.py): staged batches, bounded waits, remote errors
    loader.close()             (also `with`, and a weakref.finalize fallback)

Threads and queues::

    io thread (ferry-io) --ReorderBuffer--> staging thread (ferry-staging) --Queue(2)--> training thread

The threads, the local producers and their start and shutdown order live in consumer/pipeline.py;
``close`` (idempotent) runs the pipeline's shutdown.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import weakref
from typing import Any, Callable

import torch

from ferry.common import validate as check
from ferry.common.constants import DEFAULT_BUFFER_BATCHES, DEFAULT_LOG_EVERY_S, POLL_SLICE_S
from ferry.common.errors import LoaderClosedError
from ferry.common.shardplan import ShardPlan, decode_seq

from ferry.consumer.buffer import Delivery, is_eof
from ferry.consumer.epoch import EpochHooks, EpochIterator
from ferry.consumer.health import LoaderHealth
from ferry.consumer.figures.observer import EpochObserver
from ferry.consumer.planning import EpochPlanner
from ferry.consumer.resume import RESUME_OPTIONS, ResumePoint, capture_state, restore_state
from ferry.consumer.io_thread import StartRun
from ferry.consumer.options import (
    UNSET, CurveOptions, LocalOptions, Option, TransportOptions, check_unknown_keywords, document_keywords,
    resolve_options,
)
from ferry.consumer.pipeline import Pipeline, resolve_device
from ferry.consumer.staging.stagers import iter_tensors
from ferry.consumer.figures.counters import Counters, WeakStats, stats_figures
from ferry.consumer.streaming import ShardRun

__all__ = ["RemoteLoader"]

log = logging.getLogger("ferry.consumer")


@document_keywords  # Args: from each keyword's declaration (consumer/options/keywords.py)
class RemoteLoader:
    """An iterable over training batches that producers stream in over ZeroMQ.

    Batches are the collated structure (dict / list / tuple) with torch tensors as leaves, equal to what
    ``DataLoader(ds, batch_size, drop_last, sampler=DistributedSampler(ds, world_size, rank, shuffle,
    seed, drop_last))`` yields after ``set_epoch(e)``. Options are keyword-only, all checked here before any
    thread or process starts; they cannot be changed afterwards (assigning one raises ConfigError).

    Raises:
        ConfigTypeError: an option of the wrong type (a ConfigError and a TypeError).
        ConfigError: an invalid option or combination, or the endpoint cannot be bound (the port is in use).
    """

    # the options, read-only: each reads the resolved options (consumer/options/read_only.py), nothing is copied
    batch_size, shuffle, seed, drop_last = Option(), Option(), Option(), Option()
    sampler, batch_sampler, rank, world_size = Option(), Option(), Option(), Option()
    buffer_batches, in_order, no_producer_timeout = Option(), Option(), Option()  # math.inf: wait forever
    timeout = Option(lambda loader: loader._options.no_producer_timeout)  # its old name
    device, pin_memory, device_transform, on_error, log_every = Option(), Option(), Option(), Option(), Option()
    endpoints = Option(lambda loader: loader._endpoints)  # bound: the given ones and local mode's ipc socket

    def __init__(
        self, *,
        endpoint: str | list[str] | None | Any = UNSET,
        batch_size: int | None = 1, shuffle: bool | None = False, seed: int = UNSET, drop_last: bool = False,
        generator: torch.Generator | None = None,
        sampler: Any = None, batch_sampler: Any = None,
        rank: int | None = None, world_size: int | None = None,
        buffer_batches: int = DEFAULT_BUFFER_BATCHES, in_order: bool = True,
        no_producer_timeout: float | None = UNSET, timeout: float | None = UNSET,
        dataset: Any = None, dataset_args: dict[str, Any] | None = None, dataset_len: int | None = None,
        device: str | torch.device | None = None, pin_memory: bool | None = None,
        device_transform: Callable[[Any], Any] | None = None,
        on_error: str = "raise", log_every: float | None = DEFAULT_LOG_EVERY_S, metrics_port: int | None = None,
        local: LocalOptions | None = None, transport: TransportOptions | None = None, curve: CurveOptions | None = None,
        # the flat shorthand of the groups above, as accepted before the groups existed
        local_producers: int = UNSET, producer_threads: int = UNSET, producer_slots: int = UNSET,
        mp_context: str | None = UNSET, producer_transform: Any = UNSET, shared_memory: bool = UNSET,
        collate_fn: Any = UNSET, producer_init: Any = UNSET,
        heartbeat: float = UNSET, liveness: int = UNSET, task_timeout: float = UNSET, max_batch_bytes: int = UNSET,
        max_attempts: int = UNSET, compression: str | None = UNSET,
        curve_secret_key: str | None = UNSET, curve_authorized_keys: str | None = UNSET,
        **dataloader_options: Any,
    ) -> None:
        check_unknown_keywords(dataloader_options)
        # the signature is the keywords' one list (their names and defaults); locals() is that list as given
        given = {name: value for name, value in locals().items() if name not in ("self", "dataloader_options")}
        self._closed = True  # until fully built, so that close() on a half-built loader is safe
        opts = resolve_options(given)
        device, pin_memory = resolve_device(opts.device, opts.pin_memory)
        self._options = opts = dataclasses.replace(opts, device=device, pin_memory=bool(pin_memory))

        self._counters = Counters()
        self._epoch = 0  # the epoch the next iteration runs
        self._resume_from = 0  # seqs of that epoch already delivered (from load_state_dict)
        # a sharded dataset (common/shardplan.py): where the next run starts, and where the loop is now
        self._resume_shard = (0, 0)  # (shard position, batch k)
        self._shard_next = (0, 0)  # after the last batch the training loop got
        self._sharded_run = False  # the current run is over shards
        self._run = 0
        self._active: EpochIterator | None = None
        # starts local producers, the io and staging threads; nothing it holds references `self`
        pipeline = Pipeline(opts, self._counters, device=self.device, pin_memory=self.pin_memory,
                            figures=WeakStats(self))
        self._endpoints = pipeline.endpoints
        self._local, self._io, self._staging = pipeline.local, pipeline.io, pipeline.staging
        self._stop, self._staged, self._staging_failure = pipeline.stop, pipeline.staged, pipeline.staging_failure
        self._buffer, self._staging_stager = pipeline.buffer, pipeline.stager
        self._planner = EpochPlanner(opts, self._io)
        self._health = LoaderHealth(self._io, self._local, self._staging_failure, self.endpoints, self.timeout)
        self._observer = EpochObserver(self._counters, self._io.snapshot, WeakStats(self),
                                       capacity=self.buffer_batches, log_every=self.log_every,
                                       threads=(self._io._thread, self._staging))
        self._closed = False
        self._finalizer = weakref.finalize(self, pipeline.shutdown)

    # --- iteration ----------------------------------------------------------------------------------
    def __iter__(self) -> EpochIterator:
        self._check_open()
        plan = self._planner.build(self._epoch, self._health_until_timeout())
        self._sharded_run = isinstance(plan, ShardPlan)
        if self._sharded_run:  # batches are discovered shard by shard (consumer/streaming.py)
            order: Any = ShardRun(plan.positions, *self._resume_shard)
            first_seq, self._shard_next = self._resume_from, self._resume_shard
            total = len(plan) - first_seq if plan.lengths is not None else None
            self._resume_shard = (0, 0)
        else:
            order = list(range(self._resume_from, len(plan)))
            first_seq, total = (order[0] if order else len(plan)), len(order)
        self._resume_from = 0
        self._run += 1
        hooks = EpochHooks(  # built per iteration: a loader that is never iterated holds no cycle
            counters=self._counters, is_current=self._is_current, next_delivery=self._next_delivery,
            deliver=self._deliver, began=self._observer.started, ended=self._epoch_ended,
            progress=self._observer.progress, first_wait=self._observer.first_wait,
        )
        self._active = EpochIterator(hooks, self._run, self._epoch, first_seq, total)
        self._io.start_run(StartRun(run=self._run, epoch=self._epoch, plan=plan, order=order))
        return self._active

    def _is_current(self, run: int) -> bool:
        return self._active is not None and self._active.run == run

    def _epoch_ended(self, epoch: int) -> None:
        """The iterator of ``epoch`` ran out: the next iteration runs the next epoch; say what bound this one."""
        self._epoch = epoch + 1
        self._observer.ended(epoch, self._active)

    def __len__(self) -> int:
        """Batches per epoch. For a sharded dataset only when it gives ``shard_len``, else TypeError."""
        return self._planner.length(self._epoch, self._health_until_timeout())

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next iteration (the shuffle is seeded with ``seed + epoch``)."""
        self._epoch = check.integer("epoch", epoch, low=0)
        self._resume_from = 0
        self._resume_shard = (0, 0)

    @property
    def epoch(self) -> int:
        return self._epoch

    def _health_until_timeout(self) -> Callable[[], None]:
        """A check for a wait that needs a producer: the loader's health, and at most ``timeout`` seconds."""
        return self._health.until_timeout(self._check_health)

    # --- waiting for a batch (training thread) -------------------------------------------------------
    def _next_delivery(self, run: int) -> Delivery | None:
        """The next item of ``run``; None at its end. Every wait is bounded."""
        waited = False
        while True:
            try:
                item = self._staged.get(timeout=POLL_SLICE_S) if waited else self._staged.get_nowait()
            except queue.Empty:
                if not waited:
                    waited = True
                    self._observer.note_wait()
                    continue
                self._check_health()
                continue
            if is_eof(item):
                if item.run == run:
                    return None
                continue
            if item.run != run:
                continue  # left over from an abandoned iteration
            return item

    def _check_health(self) -> None:
        """Raise if the loader is closed or cannot deliver any more (consumer/health.py)."""
        self._check_open()
        self._health.check()

    def diagnosis(self) -> str:
        """What bounds the current (or last) epoch: the producers, the window, or the consumer, and about how
        many producers would remove the stall. See :mod:`ferry.consumer.figures.diagnosis`."""
        return self._observer.diagnosis(self._active)

    def _deliver(self, item: Delivery) -> Any:
        self._buffer.release(item.run)
        if self._sharded_run:
            p, k = decode_seq(item.seq)
            self._shard_next = (p, k + 1)  # state_dict resumes after it (an empty answer moves on)
        if item.error is not None:
            raise item.error
        tree = item.tree
        if item.event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(item.event)
            for tensor in iter_tensors(tree):
                tensor.record_stream(stream)
        if self.device_transform is not None:
            tree = self.device_transform(tree)
        self._counters.batches += 1
        self._counters.bytes_yielded += item.nbytes
        return tree

    # --- figures, state -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Figures of this loader (lifetime counters; ``epoch_*`` for the current epoch)."""
        io = self._io.snapshot() if self._io is not None else {}
        epoch = self._active.epoch if self._active is not None else self._epoch
        return stats_figures(self._counters, io, capacity=self.buffer_batches, epoch=epoch)

    def state_dict(self) -> dict[str, Any]:
        """A small, JSON-serialisable state: resume with ``load_state_dict`` in a new process."""
        active = self._active
        if active is not None and not active.finished:
            position = ResumePoint(active.epoch, active.first_seq + active.yielded, self._shard_next)
        else:
            position = ResumePoint(self._epoch, self._resume_from, self._resume_shard)
        return capture_state(position, self._resume_options(), self._samplers())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields batch ``batches_delivered`` of ``epoch`` onwards.

        Raises:
            ConfigError: the state was saved by a loader with other options, or with ``in_order=False``.
        """
        position = restore_state(state, self._resume_options(), self._samplers())
        self._epoch, self._resume_from, self._resume_shard = position.epoch, position.delivered, position.shard

    def _resume_options(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in RESUME_OPTIONS}

    def _samplers(self) -> dict[str, Any]:
        return {"sampler": self.sampler, "batch_sampler": self.batch_sampler}

    # --- lifecycle ----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise LoaderClosedError("this RemoteLoader is closed")

    def close(self) -> None:
        """Stop the staging thread, the io thread (BYE to producers) and local producers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> "RemoteLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"<RemoteLoader [closed] {', '.join(getattr(self, 'endpoints', ()))}>"
        s = self.stats()
        return (f"<RemoteLoader [{s['producers']} producers | buffered {s['buffered']}, in flight "
                f"{s['in_flight']} of {self.buffer_batches} | {s['batches']} batches] {', '.join(self.endpoints)}>")

"""RemoteLoader: the consumer inside the training script.

Lifecycle::

    RemoteLoader(...)          check every option (consumer/options.py); start local producers (if any);
                               bind the ROUTER; start the io thread and the staging thread
    for batch in loader:       __iter__ plans a *run* (one epoch, from where it resumes), hands its sequencer
                               (consumer/core/sequencers.py) to the io thread and returns an EpochIterator
                               (consumer/epoch.py): staged batches, bounded waits, remote errors
    loader.close()             (also `with`, and a weakref.finalize fallback)

Threads and queues::

    io thread (ferry-io: the core, in order) --handoff--> staging thread (ferry-staging) --Queue(2)--> training thread

The threads, the local producers and their start and shutdown order live in consumer/pipeline.py;
``close`` (idempotent) runs the pipeline's shutdown.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable

import torch

from ferry.common import validate as check
from ferry.common.constants import DEFAULT_BUFFER_BATCHES
from ferry.common.errors import LoaderClosedError

from ferry.consumer.core import sequencer_for
from ferry.consumer.epoch import EpochIterator, EpochParts, RunCounter
from ferry.consumer.health import LoaderHealth
from ferry.consumer.figures.observer import EpochObserver
from ferry.consumer.planning import EpochPlanner
from ferry.consumer.read_only import ReadOnlyOptions
from ferry.consumer.resume import RESUME_OPTIONS, ResumePoint, capture_state, restore_state
from ferry.consumer.options import UNSET, check_unknown_keywords, CurveOptions, LocalOptions, TransportOptions, resolve_options
from ferry.consumer.pipeline import Pipeline, resolve_device
from ferry.consumer.figures.counters import Counters, WeakStats, stats_figures

__all__ = ["RemoteLoader"]

log = logging.getLogger("ferry.consumer")


class RemoteLoader(ReadOnlyOptions):
    """An iterable over training batches that producers stream in over ZeroMQ.

    Batches are the collated structure (dict / list / tuple) with torch tensors as leaves, equal to what
    ``DataLoader(ds, batch_size, drop_last, sampler=DistributedSampler(ds, world_size, rank, shuffle,
    seed, drop_last))`` yields after ``set_epoch(e)``. Options are keyword-only, all checked here before any
    thread or process starts; they cannot be changed afterwards (assigning one raises ConfigError).

    Args:
        endpoint: where the consumer binds its ROUTER, or a list of them. Default ``tcp://*:5555``; in
            local mode the default binds only the private ipc socket. A tcp port is shifted by
            ``LOCAL_RANK`` under torchrun.
        batch_size: samples per batch.
        shuffle: shuffle with DistributedSampler's permutation (seed + epoch).
        seed: the shuffle seed (default 0). ``sample_info().seed`` on the producers derives from it too.
        generator: a ``torch.Generator`` to draw the shuffle seed (and the local producers' base seed) from,
            as DataLoader draws its shuffle from one; instead of ``seed``.
        drop_last: drop the tail that does not fill a batch (and the uneven tail across ranks).
        sampler: a torch sampler (or any iterable of indices) instead of the default plan.
        batch_sampler: an iterable of index lists, used as given; excludes batch_size / sampler /
            shuffle / drop_last.
        rank, world_size: this trainer's shard. Default: torchrun's RANK and WORLD_SIZE, else 0 and 1.
        buffer_batches: capacity C. Batches buffered + tasks in flight never exceed it.
        in_order: yield in plan order (default) or as batches arrive.
        no_producer_timeout: seconds without any live producer before ``__next__`` raises
            NoProducersError; ``None`` or 0: wait forever. Default 60. Unlike DataLoader's ``timeout``, a
            limit on each batch, it counts only while no producer is alive: a slow batch from a live
            producer never times out here (``task_timeout`` guards against a hung one). It also fires when no
            batch arrives for that long while producers keep joining and leaving. [Unit: second]
        timeout: the same option under its old name; give one of the two.
        dataset_len: the dataset length, if known up front (else learned from the first producer).
        device: ``None`` / ``"cpu"`` (tensors over the received bytes, no copy) or a CUDA device.
        pin_memory: stage through page-locked memory. Default: True on CUDA, False otherwise.
        device_transform: a callable applied to each batch on the device, in the training thread.
        dataset: a dataset object or a spec string (see ``ferry.common.datasets``), served by local producers.
            Without them it says what remote producers must serve: an object gives the dataset length and its
            fingerprint, a spec admits only producers announcing that spec (the first one sets the length and
            fingerprint; ``dataset_args`` are not compared). Others are refused for good, with the reason.
            A *sharded* dataset (``shards()`` and
            ``iter_shard(name)``, optionally ``shard_len(name)`` and ``shuffle_buffer``; a torch
            ``IterableDataset`` must have them) is planned over its shards: see ``ferry.common.shardplan`` and
            docs/datasets.md. ``len()`` then needs ``shard_len``, else raises TypeError.
        dataset_args: keyword arguments of a dataset spec.
        on_error: ``"raise"`` (RemoteSampleError in the loop) or ``"skip"`` (drop the failed samples).
        metrics_port: serve ``stats()`` as Prometheus metrics on this port (needs ``ferry[metrics]``).
        log_every: seconds between one-line progress logs (logger ``ferry.consumer``, INFO); None: never.
            Each epoch's diagnosis is logged at INFO; at WARNING only when the stall stays above 10 % for two
            epochs in a row (see :mod:`ferry.consumer.figures.diagnosis`). [Unit: second]
        local: a :class:`LocalOptions`: start producer processes here (local mode). Needs ``dataset``.
            Flat shorthand: ``local_producers`` (the count; 0: none), ``producer_threads``,
            ``producer_slots``, ``mp_context``, ``producer_transform``, ``shared_memory``.
        transport: a :class:`TransportOptions`: heartbeats, liveness, the task timeout, the batch size bound,
            compression. Flat shorthand: ``heartbeat``, ``liveness``, ``task_timeout``, ``max_batch_bytes``,
            ``max_attempts``, ``compression`` (``"auto"``, the default; ``"lz4"``, ``"zstd"`` or None: see
            :class:`TransportOptions`; ``stats()`` counts ``compressed_bytes`` and ``uncompressed_bytes``).
        curve: a :class:`CurveOptions`: encrypt, and let in only authorized producers.
            Flat shorthand: ``curve_secret_key``, ``curve_authorized_keys``.

        Each flat shorthand means what the group's field of the same meaning says; a group and one of its
        flat keywords together are a ConfigError.

    Raises:
        ConfigTypeError: an option of the wrong type (a ConfigError and a TypeError).
        ConfigError: an invalid option or combination, or the endpoint cannot be bound (the port is in use).
    """

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
        on_error: str = "raise", log_every: float | None = 60.0, metrics_port: int | None = None,
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
        given = {name: value for name, value in locals().items() if name not in ("self", "dataloader_options")}
        self._closed = True  # until fully built, so that close() on a half-built loader is safe
        opts = resolve_options(given)
        self._options = opts
        self.device, pin_memory = resolve_device(opts.device, opts.pin_memory)

        self.batch_size = opts.batch_size
        self.shuffle = opts.shuffle
        self.seed = opts.seed
        self.drop_last = opts.drop_last
        self.sampler = opts.sampler
        self.batch_sampler = opts.batch_sampler
        self.rank = opts.rank
        self.world_size = opts.world_size
        self.buffer_batches = opts.buffer_batches
        self.in_order = opts.in_order
        self.no_producer_timeout = opts.no_producer_timeout  # math.inf: wait forever
        self.timeout = opts.no_producer_timeout  # its old name
        self.pin_memory = bool(pin_memory)
        self.device_transform = opts.device_transform
        self.on_error = opts.on_error
        self.log_every = opts.log_every

        self._counters = Counters()
        self._runs = RunCounter()
        self._active: EpochIterator | None = None  # the newest iteration
        self._pending: ResumePoint | None = None  # where set_epoch or load_state_dict said the next one starts
        # starts local producers, the io and staging threads; nothing it holds references `self`
        pipeline = Pipeline(opts, self._counters, device=self.device, pin_memory=self.pin_memory,
                            figures=WeakStats(self))
        self.endpoints = pipeline.endpoints
        self._local, self._io, self._staging = pipeline.local, pipeline.io, pipeline.staging
        self._staging_stager = pipeline.stager
        self._planner = EpochPlanner(opts, self._io)
        self._health = LoaderHealth(self._io, self._local, pipeline.staging_failure, self.endpoints, self.timeout,
                                    pipeline.stop)
        self._observer = EpochObserver(self._counters, self._io.snapshot,
                                       capacity=self.buffer_batches, log_every=self.log_every,
                                       threads=(self._io.thread, self._staging))
        device = self.device
        self._parts = EpochParts(
            staged=pipeline.staged, release=self._io.release, check_health=self._health.check,
            observer=self._observer, counters=self._counters, runs=self._runs,
            stream_for=lambda: torch.cuda.current_stream(device), device_transform=self.device_transform,
        )
        self._closed = False
        self._finalizer = weakref.finalize(self, pipeline.shutdown)
        self._freeze()  # from here on the options are read-only (consumer/read_only.py)

    # --- iteration ----------------------------------------------------------------------------------
    def __iter__(self) -> EpochIterator:
        """A new iteration (a *run*): the next epoch, or where set_epoch / load_state_dict said. An iteration
        abandoned before its end is started again from the beginning of its epoch."""
        self._check_open()
        start = self._next_start()
        plan = self._planner.build(start.epoch, self._health.until_timeout())
        self._runs.current += 1
        sequencer = sequencer_for(self._runs.current, plan, start.delivered, start.shard, in_order=self.in_order)
        self._active, self._pending = EpochIterator(self._parts, sequencer, start), None
        self._io.start_run(sequencer, start.epoch)
        return self._active

    def _next_start(self) -> ResumePoint:
        """Where the next iteration starts."""
        if self._pending is not None:
            return self._pending
        active = self._active
        if active is None:
            return ResumePoint(0, 0, (0, 0))
        return ResumePoint(active.epoch + 1 if active.finished else active.epoch, 0, (0, 0))

    def __len__(self) -> int:
        """Batches per epoch. For a sharded dataset only when it gives ``shard_len``, else TypeError."""
        return self._planner.length(self.epoch, self._health.until_timeout())

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next iteration (the shuffle is seeded with ``seed + epoch``)."""
        self._pending = ResumePoint(check.integer("epoch", epoch, low=0), 0, (0, 0))

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the next one once it ran out."""
        return self._next_start().epoch

    def diagnosis(self) -> str:
        """What bounds the current (or last) epoch: the producers, the window, or the consumer, and about how
        many producers would remove the stall. See :mod:`ferry.consumer.figures.diagnosis`."""
        return self._observer.diagnosis(self._active)

    # --- figures, state -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Figures of this loader (lifetime counters; ``epoch_*`` for the current epoch)."""
        io = self._io.snapshot() if self._io is not None else {}
        epoch = self._active.epoch if self._active is not None else self.epoch
        return stats_figures(self._counters, io, capacity=self.buffer_batches, epoch=epoch)

    def state_dict(self) -> dict[str, Any]:
        """A small, JSON-serialisable state: resume with ``load_state_dict`` in a new process."""
        active = self._active
        position = active.position if active is not None and not active.finished else self._next_start()
        return capture_state(position, self._resume_options(), self._samplers())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields batch ``batches_delivered`` of ``epoch`` onwards.

        Raises:
            ConfigError: the state was saved by a loader with other options, or with ``in_order=False``.
        """
        self._pending = restore_state(state, self._resume_options(), self._samplers())

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

"""RemoteLoader: the consumer inside the training script.

Lifecycle::

    RemoteLoader(...)          check every option (consumer/options/); start local producers (if any);
                               bind the ROUTER; start the io thread and the staging thread
    for batch in loader:       __iter__ plans a *run* (one epoch, from where it resumes), hands its sequencer
                               (consumer/core/sequencers.py) to the io thread and returns an EpochIterator
                               (consumer/epoch.py): staged batches, bounded waits, remote errors
    loader.close()             (also `with`; else when the loader and all its iterators are dropped, or at exit)

Threads and queues::

    io thread (ferry-io: the core, in order) --handoff--> staging thread (ferry-staging) --Queue(2)--> training thread

The threads, the local producers and their start and shutdown order live in consumer/pipeline.py;
``close`` (idempotent) runs the pipeline's shutdown. So does dropping the last reference to the loader and its
iterators, as DataLoader's iterator stops its workers when it is dropped: both hold a :class:`_Lease`, a
``weakref.finalize`` on which runs the shutdown (by reference counting: nothing holds the loader in a cycle),
and so does the interpreter's exit, in a ``multiprocessing`` child too (``multiprocessing.util.Finalize``,
which runs before ``multiprocessing`` stops the daemonic children and joins the others).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import multiprocessing.util
import types
import weakref
from typing import Any, Callable

import torch

from ferry.common import validate as check
from ferry.common.constants import DEFAULT_BUFFER_BATCHES, DEFAULT_LOG_EVERY_S
from ferry.common.errors import ConfigError, ConfigTypeError, LoaderClosedError

from ferry.consumer.core import sequencer_for
from ferry.consumer.epoch import EpochIterator, EpochParts, RunCounter
from ferry.consumer.health import LoaderHealth, start_hint_for
from ferry.consumer.figures.observer import EpochObserver
from ferry.consumer.local.autoscale import usable_cpus
from ferry.consumer.planning import EpochPlanner
from ferry.consumer.resume import RESUME_OPTIONS, ResumePoint, capture_state, check_dataset_len, restore_state
from ferry.consumer.options import (
    UNSET, CurveOptions, LocalOptions, Option, TransportOptions, check_unknown_keywords, document_keywords,
    resolve_options, warn_excessive_producers, warn_unknown_environment,
)
from ferry.consumer.pipeline import Pipeline, resolve_device
from ferry.consumer.figures.counters import Counters, WeakStats, stats_figures

__all__ = ["RemoteLoader"]

log = logging.getLogger("ferry.consumer")

#: multiprocessing runs its exit finalizers of priority >= 0 before it stops daemonic children (local producers)
#: and joins the others: a loader's shutdown is one of them.
FINALIZE_PRIORITY = 10


class _Lease:
    """Held by a loader and by each of its iterators: the pipeline runs while any of them is referenced."""


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

    # RemoteLoader[list[torch.Tensor]] in annotations, as DataLoader[...] (a Generic) allows
    __class_getitem__ = classmethod(types.GenericAlias)

    # the options, read-only: each reads the resolved options (consumer/options/read_only.py), nothing is copied
    batch_size, shuffle, seed, drop_last = Option(), Option(), Option(), Option()
    sampler, batch_sampler, rank, world_size = Option(), Option(), Option(), Option()  # None: not given
    dataset, generator = Option(), Option()  # as given: an object or a spec string; the user's torch.Generator
    dataset_args = Option()  # a spec's keyword arguments, as given (None: none)
    collate_fn = Option(lambda loader: loader._options.local.collate if loader._options.local else None)
    buffer_batches, in_order, no_producer_timeout = Option(), Option(), Option()  # math.inf: wait forever
    timeout = Option()  # DataLoader's: seconds for each batch; 0: no limit
    device, pin_memory, device_transform, on_error, log_every = Option(), Option(), Option(), Option(), Option()
    endpoints = Option(lambda loader: loader._endpoints)  # bound: the given ones and local mode's ipc socket
    local, transport, curve = Option(), Option(), Option()  # the groups as resolved (local and curve: None if off)

    def __new__(cls, *args: Any, **kwargs: Any) -> "RemoteLoader":
        if args:  # DataLoader's call shape, RemoteLoader(ds, batch_size=8): say what to write instead
            raise ConfigTypeError(
                f"RemoteLoader takes keyword arguments only, and got {len(args)} positional "
                f"({', '.join(type(a).__name__ for a in args[:3])}): write RemoteLoader(dataset=ds, batch_size=..., "
                f"local_producers=N), or port with `from ferry import DataLoader`, which takes DataLoader's own "
                f"arguments as they are (DataLoader(ds, 8, shuffle=True, num_workers=4); docs/porting.md)")
        return super().__new__(cls)

    def __init__(
        self, *,
        endpoint: str | list[str] | None | Any = UNSET,
        batch_size: int | None = 1, shuffle: bool | None = False, seed: int = UNSET, drop_last: bool = False,
        generator: torch.Generator | None = None,
        sampler: Any = None, batch_sampler: Any = None,
        rank: int | None = None, world_size: int | None = None,
        buffer_batches: int = DEFAULT_BUFFER_BATCHES, in_order: bool = True,
        no_producer_timeout: float | None = UNSET, timeout: float | None = 0,
        dataset: Any = None, dataset_args: dict[str, Any] | None = None, dataset_len: int | None = None,
        iterable_streams: int | None = None,
        device: str | torch.device | None = None, pin_memory: bool | None = None,
        device_transform: Callable[[Any], Any] | None = None,
        on_error: str = "raise", log_every: float | None = DEFAULT_LOG_EVERY_S, metrics_port: int | None = None,
        local: LocalOptions | None = None, transport: TransportOptions | None = None, curve: CurveOptions | None = None,
        # the flat shorthand of the groups above, as accepted before the groups existed
        local_producers: int | str = UNSET, local_producers_min: int | None = UNSET,
        local_producers_max: int | None = UNSET, producer_threads: int = UNSET, producer_slots: int = UNSET,
        mp_context: str | None = UNSET, producer_transform: Any = UNSET, shared_memory: bool = UNSET,
        collate_fn: Any = UNSET, producer_init: Any = UNSET,
        collate_args: dict[str, Any] | None = UNSET, producer_transform_args: dict[str, Any] | None = UNSET,
        producer_ahead: int | None = UNSET, seed_per_sample: bool | None = UNSET,
        heartbeat: float = UNSET, liveness: int = UNSET, task_timeout: float = UNSET, max_batch_bytes: int = UNSET,
        max_attempts: int = UNSET, compression: str | None = UNSET, weight: float = UNSET,
        curve_secret_key: str | None = UNSET, curve_authorized_keys: str | None = UNSET,
        **dataloader_options: Any,
    ) -> None:
        check_unknown_keywords(dataloader_options)
        # the signature is the keywords' one list (their names and defaults); locals() is that list as given
        given = {name: value for name, value in locals().items() if name not in ("self", "dataloader_options")}
        self._closed = True  # until fully built, so that close() on a half-built loader is safe
        opts = resolve_options(given)
        warn_excessive_producers(opts.local, stacklevel=2)  # the script's line, as DataLoader's warning
        warn_unknown_environment()
        device, pin_memory = resolve_device(opts.device, opts.pin_memory)
        self._options = opts = dataclasses.replace(opts, device=device, pin_memory=bool(pin_memory))

        self._counters = Counters()
        self._runs = RunCounter()
        self._active: EpochIterator | None = None  # the newest iteration
        self._pending: ResumePoint | None = None  # where set_epoch or load_state_dict said the next one starts
        self._pending_by = ""  # which of them said so, for a conflict with the sampler's own epoch
        self._told_restart = False  # whether the restart of an abandoned shuffled epoch was logged (once)
        lease = _Lease()
        # starts local producers, the io and staging threads; nothing it holds references `self`
        pipeline = Pipeline(opts, self._counters, device=self.device, pin_memory=self.pin_memory,
                            figures=WeakStats(self))
        self._endpoints = pipeline.endpoints
        self._local, self._io, self._staging = pipeline.local, pipeline.io, pipeline.staging
        self._staging_stager = pipeline.stager
        self._planner = EpochPlanner(opts, self._io)
        self._health = LoaderHealth(self._io, self._local, pipeline.staging_failure, self.endpoints,
                                    self.no_producer_timeout, pipeline.stop,
                                    start_hint_for(self.endpoints, opts.dataset, opts.dataset_args,
                                                   local=self._local is not None,
                                                   collate=opts.local.collate if opts.local else None,
                                                   collate_args=opts.local.collate_args if opts.local else None))
        self._observer = EpochObserver(self._counters, self._io.snapshot,
                                       capacity=self.buffer_batches, log_every=self.log_every,
                                       threads=(self._io.thread, self._staging), on_demand=pipeline.autoscale,
                                       on_load=self._io.report_load,
                                       local_cpus=usable_cpus())
        device = self.device
        self._parts = EpochParts(
            staged=pipeline.staged, release=self._io.release, flush_credits=self._io.flush_credits,
            check_health=self._health.check, observer=self._observer, counters=self._counters, runs=self._runs,
            stream_for=lambda: torch.cuda.current_stream(device), device_transform=self.device_transform,
            lease=lease, timeout=self.timeout,
        )
        self._closed = False
        # run once, by close(), or when the last of the loader and its iterators is dropped, or at exit (atexit;
        # in a multiprocessing child, which never runs atexit, by multiprocessing's own exit hook)
        self._finalizer = weakref.finalize(lease, pipeline.shutdown)
        multiprocessing.util.Finalize(lease, self._finalizer, exitpriority=FINALIZE_PRIORITY)

    # --- iteration ----------------------------------------------------------------------------------
    def __iter__(self) -> EpochIterator:
        """A new iteration (a *run*): the next epoch, or where set_epoch / load_state_dict said. An iteration
        abandoned before its end is started again from the beginning of its epoch."""
        self._check_open()
        start = self._next_start()
        plan = self._planner.build(start.epoch, self._health.until_timeout())
        check_dataset_len(start, self._known_dataset_len())
        self._runs.current += 1
        sequencer = sequencer_for(self._runs.current, plan, start.delivered, start.shard, in_order=self.in_order,
                                  streams=start.streams)
        self._active, self._pending = EpochIterator(self._parts, sequencer, start,
                                                    warn_past=self._planner.iterable_len_told), None
        self._io.start_run(sequencer, start.epoch)
        return self._active

    def _next_start(self) -> ResumePoint:
        """Where the next iteration starts: :meth:`_own_next_start`, unless the script gave its sampler another
        epoch since the loader last planned one (``sampler.set_epoch(e)``: consumer/planning.py), which wins.

        Raises:
            ConfigError: the sampler's epoch and the one ``set_epoch`` or ``load_state_dict`` gave the loader differ.
        """
        start = self._own_next_start()
        given = self._planner.sampler_epoch.given()
        if given is None or given == start.epoch:
            return start
        if self._pending is not None:
            raise self._epoch_conflict(given, self._pending_by)
        return ResumePoint(given, 0, (0, 0))

    def _epoch_conflict(self, given: int, by: str) -> ConfigError:
        return ConfigError(f"the sampler was given sampler.set_epoch({given}) and the loader {by}: the next epoch "
                           f"is ambiguous. Give both the same epoch, or set it on one of them only")

    def _set_pending(self, point: ResumePoint, by: str) -> None:
        given = self._planner.sampler_epoch.given()
        if given is not None and given != point.epoch:
            raise self._epoch_conflict(given, by)
        self._pending, self._pending_by = point, by

    def _own_next_start(self) -> ResumePoint:
        """Where the loader itself would start the next iteration: where set_epoch / load_state_dict said, else
        after the last iteration (the same epoch again if it was abandoned)."""
        if self._pending is not None:
            return self._pending
        active = self._active
        if active is None:
            return ResumePoint(0, 0, (0, 0))
        if not active.finished and active.yielded and self.shuffle and not self._told_restart:
            # DataLoader draws a new order at each iter(): a loop of a fixed number of steps per epoch that never
            # calls set_epoch would see the same few batches every "epoch" here, without a word
            self._told_restart = True
            log.warning("ferry: epoch %d was left after %d batches; this iteration starts it again, in the same "
                        "shuffled order (DataLoader would draw a new one). For a fixed number of steps per epoch, "
                        "call loader.set_epoch(epoch) before each (said once)", active.epoch, active.yielded)
        return ResumePoint(active.epoch + 1 if active.finished else active.epoch, 0, (0, 0))

    def __len__(self) -> int:
        """Batches per epoch. For a sharded dataset only when it gives ``shard_len``; for an iterable one
        DataLoader's rule, ``len(dataset)`` in batches (a run warns when more come), only with ``len(dataset)``;
        else TypeError."""
        return self._planner.length(self.epoch, self._health.until_timeout())

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next iteration (its shuffle: DistributedSampler's for ``seed + epoch``, or with a
        ``generator`` what DataLoader draws in its ``epoch``-th iteration). A start already set for ``epoch`` stays
        as it is: the position ``load_state_dict`` resumes, so that a loop that calls ``set_epoch(epoch)`` every
        epoch, after a resume too (torchvision's), goes on where the state left off.

        Raises:
            ConfigError: the script gave its sampler another epoch (``sampler.set_epoch``) since it was last planned.
        """
        epoch = check.integer("epoch", epoch, low=0)
        if self._pending is not None and self._pending.epoch == epoch:
            self._set_pending(self._pending, self._pending_by)  # kept, checked against the sampler's epoch again
            return
        self._set_pending(ResumePoint(epoch, 0, (0, 0)), f"loader.set_epoch({epoch})")

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the next one once it ran out (or the one the script gave its sampler since).

        Raises:
            ConfigError: that epoch and the one ``set_epoch`` or ``load_state_dict`` gave the loader differ.
        """
        return self._next_start().epoch

    def diagnosis(self) -> str:
        """What bounds the current (or last) epoch: the producers, the window, or the consumer, and about how
        many producers would remove the stall. See :mod:`ferry.consumer.figures.diagnosis`."""
        return self._observer.diagnosis(self._active)

    # --- producers ----------------------------------------------------------------------------------
    def producer_gone(self, name: str, why: str = "its supervisor reported it gone") -> None:
        """Tell the loader that the producer process ``name`` has died, so that the tasks it held are issued again
        at once instead of after the liveness window (``heartbeat × liveness``, 5 s by default). For whatever
        supervises producers and learns of a death first: an engine (``ferry.ray`` calls it when a producer's actor
        dies), a script that killed one. The same event as a local producer's death: its tasks go back to the
        front of the queue, charged an attempt (a crash may be a sample's fault), and what it still sends is
        dropped. Safe from any thread; a name no live producer has changes nothing.

        Args:
            name: the producer's ``host:pid``, as it says in its HELLO and as ``stats()["per_producer"]`` keys it.
            why: said in the loader's log line about the loss.

        Only a call in the training process can do this: the loader takes no such news from the network, where
        a peer without credentials could use it to make it drop every producer.
        """
        self._check_open()
        self._io.producer_gone(check.text("name", name), str(why))

    # --- figures, state -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Figures of this loader (lifetime counters; ``epoch_*`` for the current epoch)."""
        io = self._io.snapshot() if self._io is not None else {}
        epoch = self._active.epoch if self._active is not None else self._own_next_start().epoch
        return stats_figures(self._counters, io, capacity=self.buffer_batches, epoch=epoch,
                             producers_needed=self._observer.demand.value,
                             local_producers=self._local.count if self._local is not None else 0)

    def state_dict(self) -> dict[str, Any]:
        """A small, JSON-serialisable state: resume with ``load_state_dict`` in a new process."""
        active = self._active
        position = active.position if active is not None and not active.finished else self._next_start()
        known = self._known_dataset_len()  # until it is, a loaded state's own length carries over unchanged
        return capture_state(position, self._resume_options(), self._samplers(),
                             known if known is not None else position.dataset_len)

    def _known_dataset_len(self) -> int | None:
        """The dataset's length (shards, for a sharded one) if the loader knows it by now, else None."""
        known = self._io.wait_dataset(0)
        return known[0] if known is not None else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields batch ``batches_delivered`` of ``epoch`` onwards.

        Raises:
            ConfigError: the state was saved by a loader with other options, or with ``in_order=False``; or the
                script gave its sampler another epoch (``sampler.set_epoch``) since it was last planned.
        """
        point = restore_state(state, self._resume_options(), self._samplers())
        self._set_pending(point, f"load_state_dict (epoch {point.epoch}, batch {point.delivered})")

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


# help() and inspect.signature(RemoteLoader) show __init__'s keywords, not the (*args, **kwargs) of __new__, whose only
# job is to answer DataLoader's positional call shape with what to write instead
RemoteLoader.__signature__ = inspect.signature(RemoteLoader.__init__).replace(  # type: ignore[attr-defined]
    parameters=[p for p in inspect.signature(RemoteLoader.__init__).parameters.values() if p.name != "self"])

"""RemoteLoader: the consumer inside the training script.

Lifecycle::

    RemoteLoader(...)          validate options; start local producers (if any); bind the ROUTER;
                               start the io thread and the staging thread
    for batch in loader:       __iter__ starts a *run* (one epoch's plan) on the io thread;
                               __next__ takes staged batches, bounded waits, re-raises remote errors
    loader.close()             (also `with`, and a weakref.finalize fallback)

Threads and queues::

    io thread (ferry-io) --ReorderBuffer--> staging thread (ferry-staging) --Queue(2)--> training thread

Shutdown order (``close``, idempotent): set the stop event; join the staging thread (its waits are bounded
by POLL_SLICE_S); stop and join the io thread (it says BYE and closes the ROUTER); stop the local
producers (SIGTERM, then SIGKILL after JOIN_TIMEOUT_S) and remove their folder.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import warnings
import weakref
from typing import Any, Callable

import torch

from ferry.common.constants import (
    DEFAULT_BUFFER_BATCHES, DEFAULT_ENDPOINT, DEFAULT_MAX_BATCH_BYTES, DEFAULT_SLOTS, DEFAULT_THREADS,
    DEFAULT_TASK_TIMEOUT_S, DEFAULT_TIMEOUT_S, HEARTBEAT_S, JOIN_TIMEOUT_S, LIVENESS, POLL_SLICE_S, STAGED_BATCHES,
)
from ferry.common.datasets import dataset_fingerprint
from ferry.common.errors import ConfigError, FerryThreadError, LoaderClosedError, NoProducersError
from ferry.common.plan import build_plan, plan_length
from ferry.common.waker import Waker

from ferry.consumer.buffer import Delivery, ReorderBuffer, is_eof
from ferry.consumer.diagnosis import EpochFigures, EpochLog, diagnose
from ferry.consumer.io_thread import IoConfig, IoThread, StartRun
from ferry.consumer.local import LocalProducers
from ferry.consumer.staging import iter_tensors, make_stager, staging_loop
from ferry.consumer.stats import Counters, stall_fraction

__all__ = ["RemoteLoader"]

log = logging.getLogger("ferry.consumer")

_DEFAULT = object()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _shift_port(endpoint: str, offset: int) -> str:
    """tcp://host:5555 -> tcp://host:(5555 + offset); torchrun ranks on one host each get a port."""
    if offset == 0 or not endpoint.startswith("tcp://"):
        return endpoint
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"endpoint {endpoint!r} has no port to shift by LOCAL_RANK={offset}")
    return f"{host}:{int(port) + offset}"


class RemoteLoader:
    """An iterable over training batches that producers stream in over ZeroMQ.

    Batches are the collated structure (dict / list / tuple) with torch tensors as leaves, equal to what
    ``DataLoader(ds, batch_size, drop_last, sampler=DistributedSampler(ds, world_size, rank, shuffle,
    seed, drop_last))`` yields after ``set_epoch(e)``.

    Args:
        endpoint: where the consumer binds its ROUTER, or a list of them. Default ``tcp://*:5555``; in
            local mode the default binds only the private ipc socket. A tcp port is shifted by
            ``LOCAL_RANK`` under torchrun.
        batch_size: samples per batch.
        shuffle: shuffle with DistributedSampler's permutation (seed + epoch).
        seed: the shuffle seed.
        drop_last: drop the tail that does not fill a batch (and the uneven tail across ranks).
        sampler: a torch sampler (or any iterable of indices) instead of the default plan.
        batch_sampler: an iterable of index lists, used as given; excludes batch_size / sampler /
            shuffle / drop_last.
        rank, world_size: this trainer's shard. Default: torchrun's RANK and WORLD_SIZE, else 0 and 1.
        buffer_batches: capacity C. Batches buffered + tasks in flight never exceed it.
        in_order: yield in plan order (default) or as batches arrive.
        timeout: seconds without any live producer before ``__next__`` raises NoProducersError.
            [Unit: second]
        dataset_len: the dataset length, if known up front (else learned from the first producer).
        device: ``None`` / ``"cpu"`` (tensors over the received bytes, no copy) or a CUDA device.
        pin_memory: stage through page-locked memory. Default: True on CUDA, False otherwise.
        device_transform: a callable applied to each batch on the device, in the training thread.
        local_producers: start this many producer processes here (local mode). Needs ``dataset``.
        dataset: for local mode, a dataset object or a spec string (see ``ferry.common.datasets``).
        dataset_args: keyword arguments of a dataset spec.
        producer_threads, producer_slots: for local producers.
        shared_memory: local producers write batches straight into shared memory that this process maps
            (a sparse ``memfd``, not ``/dev/shm``) instead of sending them over the socket: one copy of the
            bytes in all, instead of four. Producers on other machines are not affected. Default True.
        producer_transform: ``package.module:callable`` that local producers apply to every sample.
        metrics_port: serve ``stats()`` as Prometheus metrics on this port (needs ``ferry[metrics]``).
        on_error: ``"raise"`` (RemoteSampleError in the loop) or ``"skip"`` (drop the failed samples).
        heartbeat: seconds between PINGs. [Unit: second]
        liveness: heartbeats of silence after which a producer is lost.
        task_timeout: a producer holding one task longer than this is dropped and its tasks re-issued
            (a hung sample, or a peer that never answers). [Unit: second]
        max_batch_bytes: the largest batch accepted (ZMQ_MAXMSGSIZE, and the total of a batch's arrays).
            A bigger one is dropped as invalid. [Unit: byte]
        mp_context: multiprocessing start method for local producers of a dataset object.
        curve_secret_key: the consumer's CURVE key pair (``server.key_secret`` from ``ferry keys``).
            Turns on CURVE: traffic is encrypted and only authorized producers are let in.
        curve_authorized_keys: the folder of authorized producer public keys (``.key`` files).
        log_every: seconds between one-line progress logs (logger ``ferry.consumer``, INFO); None: never.
            Each epoch's diagnosis is logged at INFO; at WARNING only when the stall stays above 10 % for two
            epochs in a row (see :mod:`ferry.consumer.diagnosis`). [Unit: second]

    Raises:
        ConfigError: an invalid option, or the endpoint cannot be bound (e.g. the port is in use).
    """

    def __init__(
        self,
        *,
        endpoint: str | list[str] | None | Any = _DEFAULT,
        batch_size: int | None = 1,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        sampler: Any = None,
        batch_sampler: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        buffer_batches: int = DEFAULT_BUFFER_BATCHES,
        in_order: bool = True,
        timeout: float = DEFAULT_TIMEOUT_S,
        dataset_len: int | None = None,
        device: str | torch.device | None = None,
        pin_memory: bool | None = None,
        device_transform: Callable[[Any], Any] | None = None,
        local_producers: int = 0,
        dataset: Any = None,
        dataset_args: dict[str, Any] | None = None,
        producer_threads: int = DEFAULT_THREADS,
        producer_slots: int = DEFAULT_SLOTS,
        on_error: str = "raise",
        heartbeat: float = HEARTBEAT_S,
        liveness: int = LIVENESS,
        task_timeout: float = DEFAULT_TASK_TIMEOUT_S,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        mp_context: str | None = None,
        curve_secret_key: str | None = None,
        curve_authorized_keys: str | None = None,
        log_every: float | None = 60.0,
        producer_transform: str | None = None,
        metrics_port: int | None = None,
        shared_memory: bool = True,
    ) -> None:
        self._closed = True  # until fully built, so that close() on a half-built loader is safe
        if batch_sampler is not None:
            if sampler is not None or shuffle or drop_last or batch_size not in (None, 1):
                raise ConfigError("batch_sampler is mutually exclusive with batch_size, shuffle, sampler and drop_last")
            batch_size = None
        elif batch_size is None or int(batch_size) < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        if sampler is not None and shuffle:
            raise ConfigError("sampler is mutually exclusive with shuffle")
        self.rank = _env_int("RANK", 0) if rank is None else int(rank)
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else int(world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is not in range for world_size {self.world_size}")
        if int(buffer_batches) < 1:
            raise ConfigError(f"buffer_batches must be >= 1, got {buffer_batches}")
        if not task_timeout > 0:
            raise ConfigError(f"task_timeout must be > 0 seconds, got {task_timeout}")
        if not timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}")
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if local_producers < 0 or (local_producers and dataset is None):
            raise ConfigError("local_producers needs a dataset (an object or a spec string)")
        if dataset_len is not None and int(dataset_len) < 0:
            raise ConfigError(f"dataset_len must be >= 0, got {dataset_len}")
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {self.device} requested, but CUDA is not available")
        if pin_memory is None:
            pin_memory = self.device is not None and self.device.type == "cuda"
        if pin_memory and not torch.cuda.is_available():
            warnings.warn("pin_memory=True but CUDA is not available; batches stay in pageable memory",
                          stacklevel=2)
            pin_memory = False
        curve = None
        if curve_secret_key or curve_authorized_keys:
            from ferry.common.security import CurveServer

            if not (curve_secret_key and curve_authorized_keys):
                raise ConfigError("CURVE needs both curve_secret_key and curve_authorized_keys")
            if local_producers:
                raise ConfigError("CURVE and local_producers cannot be combined: local producers connect over "
                                  "ipc://, which never leaves this machine; use CURVE for remote producers")
            curve = CurveServer.load(curve_secret_key, curve_authorized_keys)
        if device_transform is not None and not callable(device_transform):
            raise ConfigError("device_transform must be callable")

        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.buffer_batches = int(buffer_batches)
        self.in_order = bool(in_order)
        self.timeout = float(timeout)
        self.pin_memory = bool(pin_memory)
        self.device_transform = device_transform
        self.on_error = on_error
        self.log_every = log_every
        self._last_log = time.monotonic()
        self._epoch_waits = {"waits": 0, "window_full": 0, "idle": 0}
        self._epoch_start_counts: dict[str, int] = {}
        self._last_diagnosis: str | None = None

        fingerprint = None
        if dataset is not None and not isinstance(dataset, str):
            dataset_len = len(dataset) if dataset_len is None else dataset_len
            fingerprint = dataset_fingerprint(dataset)

        local_rank = _env_int("LOCAL_RANK", 0)
        if endpoint is _DEFAULT:
            endpoints = [] if local_producers else [_shift_port(DEFAULT_ENDPOINT, local_rank)]
        elif endpoint is None:
            endpoints = []
        else:
            endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
            endpoints = [_shift_port(e, local_rank) for e in endpoints]

        self._counters = Counters()
        self._stop = threading.Event()
        self._staging_failure: list[BaseException] = []
        self._staged: queue.Queue[Any] = queue.Queue(maxsize=STAGED_BATCHES)
        self._local: LocalProducers | None = None
        self._io: IoThread | None = None
        self._staging: threading.Thread | None = None
        self._epoch = 0  # the epoch the next iteration runs
        self._resume_from = 0  # seqs of that epoch already delivered (from load_state_dict)
        self._run = 0
        self._active: _EpochIterator | None = None
        self._lock = threading.Lock()
        try:
            if local_producers:
                self._local = LocalProducers(
                    local_producers, dataset, dataset_args=dataset_args, threads=producer_threads,
                    slots=producer_slots, heartbeat=heartbeat, liveness=liveness, mp_context=mp_context,
                    transform=producer_transform,
                    # a slot per batch that can be in flight, buffered, staged or held by the loop at once
                    shared_memory=(self.buffer_batches + STAGED_BATCHES + 2, int(max_batch_bytes))
                    if shared_memory else None,
                )
                endpoints.append(self._local.endpoint)
            if not endpoints:
                raise ConfigError("no endpoint to bind")
            self.endpoints = tuple(endpoints)
            waker = Waker()  # owned by the io thread from here on
            # nothing the threads hold may reference `self`, or the finalizer could never run
            buffer = ReorderBuffer(in_order=self.in_order, on_release=waker.wake)
            self._buffer = buffer
            self._io = IoThread(
                IoConfig(endpoints=self.endpoints, capacity=self.buffer_batches, heartbeat=float(heartbeat),
                         liveness=int(liveness), on_error=on_error, max_batch_bytes=int(max_batch_bytes),
                         task_timeout=float(task_timeout),
                         dataset_len=dataset_len, fingerprint=fingerprint, curve=curve,
                         slab=self._local.slab if self._local is not None else None),
                buffer, self._counters, waker,
            )
            self._io.start()
            self._staging_stager = make_stager(self.device, self.pin_memory, self.buffer_batches + STAGED_BATCHES + 4)
            self._staging = threading.Thread(
                target=staging_loop, name="ferry-staging", daemon=True,
                args=(buffer, self._staged, self._stop, self._staging_stager, self._staging_failure),
            )
            self._staging.start()
            self._epoch_log = EpochLog((self._io._thread, self._staging))  # their CPU time: the consumer's load
        except BaseException:
            self._shutdown(self._stop, self._staging, self._io, self._local, None)
            raise
        self._metrics = None
        if metrics_port:
            from ferry.common.metrics import MetricsServer

            try:
                self._metrics = MetricsServer(metrics_port, _StatsView(self), "ferry_consumer")
            except BaseException:
                self._shutdown(self._stop, self._staging, self._io, self._local, None)
                raise
        self._closed = False
        self._finalizer = weakref.finalize(self, RemoteLoader._shutdown, self._stop, self._staging, self._io,
                                           self._local, self._metrics)

    # --- iteration ----------------------------------------------------------------------------------
    def __iter__(self) -> "_EpochIterator":
        self._check_open()
        plan = self._build_plan(self._epoch)
        order = list(range(self._resume_from, len(plan)))
        self._resume_from = 0
        self._run += 1
        self._active = _EpochIterator(self, self._run, self._epoch, plan, order)
        self._io.start_run(StartRun(run=self._run, epoch=self._epoch, plan=plan, order=order))
        return self._active

    def __len__(self) -> int:
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self.sampler is not None:
            n = len(self.sampler)
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return plan_length(self._dataset_len(), world_size=self.world_size, batch_size=self.batch_size,
                           drop_last=self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next iteration (the shuffle is seeded with ``seed + epoch``)."""
        if int(epoch) < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        self._epoch = int(epoch)
        self._resume_from = 0

    @property
    def epoch(self) -> int:
        return self._epoch

    def _build_plan(self, epoch: int):
        dataset_len = None if (self.sampler is not None or self.batch_sampler is not None) else self._dataset_len()
        return build_plan(epoch=epoch, dataset_len=dataset_len, batch_size=self.batch_size, shuffle=self.shuffle,
                          seed=self.seed, drop_last=self.drop_last, rank=self.rank, world_size=self.world_size,
                          sampler=self.sampler, batch_sampler=self.batch_sampler)

    def _dataset_len(self) -> int:
        io = self._io
        deadline = time.monotonic() + self.timeout
        while not io.dataset_known.wait(POLL_SLICE_S):
            self._check_health()
            if time.monotonic() > deadline:
                raise self._no_producers_error(waited=self.timeout)
        return io.dataset_len

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
                    self._note_wait()
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
        self._check_open()
        io = self._io
        if io.failure is not None:
            raise FerryThreadError("ferry's io thread failed") from io.failure
        if self._staging_failure:
            raise FerryThreadError("ferry's staging thread failed") from self._staging_failure[0]
        if not io.alive:
            raise FerryThreadError("ferry's io thread is not running")
        # local producers' deaths are seen at once; with another endpoint bound, remote ones may still serve
        if self._local is not None and (len(self.endpoints) == 1 or not io.dispatcher.producers):
            self._local.check(served=io.producers_seen > 0)
        if not io.dispatcher.producers:
            silent = time.monotonic() - io.no_producer_since
            if silent > self.timeout:
                raise self._no_producers_error(waited=silent)

    def _no_producers_error(self, waited: float) -> NoProducersError:
        seen = self._io.producers_seen
        return NoProducersError(
            f"no producer alive for {waited:.1f} s (timeout={self.timeout:g} s); the consumer is bound to "
            f"{', '.join(self.endpoints)} and has seen {seen} producer(s) in all. Start one with: "
            f"python -m ferry.producer --connect tcp://<this-host>:<port> --dataset <spec>"
        )

    def _note_wait(self) -> None:
        """Called when __next__ finds nothing staged: was the window full, or were producers idle?"""
        io = self._io.snapshot()
        self._epoch_waits["waits"] += 1
        if io["buffered"] + io["in_flight"] >= self.buffer_batches:
            self._epoch_waits["window_full"] += 1
        elif any(p["in_flight"] < p["slots"] for p in io["per_producer"].values()) and io["queued"] == 0:
            pass  # nothing left to issue: the end of the epoch, not idleness
        elif any(p["in_flight"] < p["slots"] for p in io["per_producer"].values()):
            self._epoch_waits["idle"] += 1

    def _epoch_started(self) -> None:
        self._epoch_waits = {"waits": 0, "window_full": 0, "idle": 0}
        self._epoch_start_counts = {n: p["batches"] for n, p in self._io.snapshot()["per_producer"].items()}
        self._epoch_log.start_epoch()

    def diagnosis(self) -> str:
        """What bounds the current (or last) epoch: the producers, the window, or the consumer, and about how
        many producers would remove the stall. See :mod:`ferry.consumer.diagnosis`."""
        return diagnose(self._epoch_figures())

    def _epoch_figures(self) -> EpochFigures:
        c = self._counters
        snap = self._io.snapshot()
        by_producer = {n: p["batches"] - self._epoch_start_counts.get(n, 0) for n, p in snap["per_producer"].items()}
        active = self._active
        return EpochFigures(
            batches=active.yielded if active is not None else 0, wait_s=c.epoch_wait_s, active_s=c.epoch_active_s,
            producers=snap["producers"], batches_by_producer=by_producer,
            window_full_waits=self._epoch_waits["window_full"], idle_waits=self._epoch_waits["idle"],
            waits=self._epoch_waits["waits"],
            startup_s=self._epoch_log.startup_s if active is not None and active.run == 1 else 0.0,
            consumer_cpu_s=self._epoch_log.consumer_cpu_s(),
        )

    def _maybe_log(self, now: float, epoch: int, done: int, total: int) -> None:
        if self.log_every is None or now - self._last_log < self.log_every:
            return
        self._last_log = now
        s = self.stats()
        log.info("ferry: epoch %d batch %d/%d | %.0f MB/s | stall %.1f %% | producers %d | buffered %d + in flight "
                 "%d of %d | re-issued %d, duplicates %d, invalid %d", epoch, done, total, s["mb_per_s"],
                 100 * s["epoch_stall_fraction"], s["producers"], s["buffered"], s["in_flight"], self.buffer_batches,
                 s["reissued"], s["duplicates"], s["invalid_messages"])

    def _deliver(self, item: Delivery) -> Any:
        self._buffer.release(item.run)
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
        c = self._counters
        io = self._io.snapshot() if self._io is not None else {}
        elapsed = max(1e-9, time.monotonic() - c.created)
        return {
            "batches": c.batches,
            "bytes": c.bytes_yielded,
            "mb_per_s": c.bytes_yielded / 1e6 / c.active_s if c.active_s > 0 else 0.0,
            "producers": io.get("producers", 0),
            "producers_seen": io.get("producers_seen", 0),
            "buffered": io.get("buffered", 0),
            "in_flight": io.get("in_flight", 0),
            "capacity": self.buffer_batches,
            "wait_s": c.wait_s,
            "active_s": c.active_s,
            "step_s": (c.active_s - c.wait_s) / c.batches if c.batches else 0.0,
            "stall_fraction": stall_fraction(c.wait_s, c.active_s),
            "epoch": self._active.epoch if self._active is not None else self._epoch,
            "epoch_wait_s": c.epoch_wait_s,
            "epoch_stall_fraction": stall_fraction(c.epoch_wait_s, c.epoch_active_s),
            "received": c.received,
            "received_bytes": c.bytes,
            "reissued": io.get("reissued", 0),
            "duplicates": c.duplicates,
            "stale": c.stale,
            "invalid_messages": c.invalid_messages,
            "skipped_samples": c.skipped_samples,
            "uptime_s": elapsed,
            "per_producer": io.get("per_producer", {}),
            "shared_memory": io.get("shared_memory"),
            "shared_batches": c.shared_batches,
        }

    def state_dict(self) -> dict[str, Any]:
        """A small, JSON-serialisable state: resume with ``load_state_dict`` in a new process."""
        active = self._active
        if active is not None and not active.finished:
            epoch, delivered = active.epoch, active.first_seq + active.yielded
        else:
            epoch, delivered = self._epoch, self._resume_from
        state = {
            "epoch": epoch, "batches_delivered": delivered, "seed": self.seed, "shuffle": self.shuffle,
            "drop_last": self.drop_last, "batch_size": self.batch_size, "rank": self.rank,
            "world_size": self.world_size, "in_order": self.in_order,
        }
        for name, obj in (("sampler", self.sampler), ("batch_sampler", self.batch_sampler)):
            if obj is not None and callable(getattr(obj, "state_dict", None)):
                state[name] = obj.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields batch ``batches_delivered`` of ``epoch`` onwards."""
        for key in ("seed", "shuffle", "drop_last", "batch_size", "rank", "world_size"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(f"state was saved with {key}={state[key]!r}, this loader has {getattr(self, key)!r}")
        if not state.get("in_order", True):
            raise ConfigError("a state saved with in_order=False cannot be resumed exactly")
        for name, obj in (("sampler", self.sampler), ("batch_sampler", self.batch_sampler)):
            if name in state and callable(getattr(obj, "load_state_dict", None)):
                obj.load_state_dict(state[name])
        self._epoch = int(state["epoch"])
        self._resume_from = int(state["batches_delivered"])

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

    @staticmethod
    def _shutdown(stop: threading.Event, staging: threading.Thread | None, io: IoThread | None,
                  local: LocalProducers | None, metrics: Any = None) -> None:
        if metrics is not None:
            metrics.close()
        stop.set()
        if staging is not None and staging.is_alive():
            staging.join(JOIN_TIMEOUT_S)
        if io is not None:
            io.close(JOIN_TIMEOUT_S)
        if local is not None:
            local.close()

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


class _StatsView:
    """The metrics thread's view of a loader: a weak reference, so that it never keeps the loader alive."""

    def __init__(self, loader: RemoteLoader) -> None:
        self._loader = weakref.ref(loader)

    def __call__(self) -> dict[str, Any]:
        loader = self._loader()
        return loader.stats() if loader is not None and not loader.closed else {}


class _EpochIterator:
    """One pass over one epoch's plan. Only the newest iterator of a loader may advance."""

    def __init__(self, loader: RemoteLoader, run: int, epoch: int, plan: Any, order: list[int]) -> None:
        self._loader = loader
        self.run = run
        self.epoch = epoch
        self.first_seq = order[0] if order else len(plan)
        self.total = len(order)
        self.yielded = 0
        self.finished = False
        self._started: float | None = None
        self._last: float | None = None

    def __iter__(self) -> "_EpochIterator":
        return self

    def __len__(self) -> int:
        return self.total - self.yielded

    def __next__(self) -> Any:
        loader = self._loader
        if self.finished:
            raise StopIteration
        if loader._active is not self:
            raise RuntimeError("a newer iteration of this RemoteLoader has started; this one is abandoned")
        counters = loader._counters
        began = time.monotonic()
        if self._started is None:
            self._started = began
            counters.epoch_wait_s = counters.epoch_active_s = 0.0
            loader._epoch_started()
        try:
            item = loader._next_delivery(self.run)
        finally:
            now = time.monotonic()
            counters.wait_s += now - began
            counters.epoch_wait_s += now - began
            if self.run == 1 and began == self._started:  # the loader's first batch: start-up, not stall
                loader._epoch_log.first_wait(now - began)
        if item is None:
            self.finished = True
            loader._epoch = self.epoch + 1
            self._account(now)
            loader._last_diagnosis = loader._epoch_log.end_epoch(self.epoch, loader._epoch_figures())
            raise StopIteration
        self.yielded += 1  # this position is consumed, even when it raises
        try:
            return loader._deliver(item)  # raises RemoteSampleError in place of a failed batch
        finally:
            done = time.monotonic()
            self._account(done)
            loader._maybe_log(done, self.epoch, self.first_seq + self.yielded, self.first_seq + self.total)

    def _account(self, now: float) -> None:
        counters = self._loader._counters
        span = now - (self._last or self._started)
        counters.active_s += span
        counters.epoch_active_s += span
        self._last = now

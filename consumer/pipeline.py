"""The parts a RemoteLoader runs: started in order, stopped in reverse.

Start (``Pipeline(...)``): local producers, if any (and their shared-memory slab, and with
``local_producers="auto"`` the autoscaler the training thread calls); the io thread, which
binds the ROUTER; the staging thread; the metrics server, if asked for. A failure part-way stops what
already started, and raises. Batches flow io thread -> ``handoff`` (in the order the loop must see them) ->
staging thread -> ``staged`` -> the training thread.

Shutdown order (``shutdown``, run once: by the loader's finalizer, or by a start that failed): close the metrics server; set the stop event; join the staging
thread (its waits are bounded by POLL_SLICE_S); stop and join the io thread (it says BYE and, once answered, closes the
ROUTER); drop what was handed on and never yielded; stop the local producers (SIGTERM, then SIGKILL after
JOIN_TIMEOUT_S) and remove their folder.

Nothing here references the loader (the metrics server reads it through a weak reference), so that the
loader's ``weakref.finalize`` can run ``shutdown`` for a user who forgets ``close()``.
"""

from __future__ import annotations

import queue
import threading
import warnings
from typing import Any, Callable

import torch

from ferry.common import compression as comp
from ferry.common.canary import code_digest
from ferry.common.constants import JOIN_TIMEOUT_S, LEAVE_WAIT_S, STAGED_BATCHES
from ferry.common.datasets import dataset_fingerprint, transformed_fingerprint
from ferry.common.errors import ConfigError
from ferry.common.heap import wanted_by_environment
from ferry.common.sampleinfo import rank_base_seed
from ferry.common.shardplan import is_sharded, shard_names
from ferry.common.streamplan import is_iterable, iterable_len

from ferry.consumer.core import CoreConfig
from ferry.consumer.io.thread import IoThread
from ferry.consumer.local.autoscale import Autoscaler
from ferry.consumer.local.producers import LocalProducers
from ferry.consumer.options import LoaderOptions
from ferry.consumer.options.groups import AUTO
from ferry.consumer.staging.stagers import make_stager, staging_loop
from ferry.consumer.figures.counters import STATS, Counters
from ferry.consumer.window import Window

__all__ = ["Pipeline", "resolve_device"]


def compression_welcome(option: str | None) -> dict[str, Any]:
    """The WELCOME fields for ``compression=``: the mode producers should use, and the codecs this consumer
    can decompress. ``"auto"`` without any codec library stays off, said once at INFO."""
    mode, codecs = comp.check_mode("compression", option), comp.available()
    if mode == "auto" and not codecs:
        import logging

        logging.getLogger("ferry.consumer").info(
            "compression='auto' stays off: neither lz4 nor zstandard is installed (pip install 'ferry[lz4]')")
        mode = "none"
    return {"compression": mode, "codecs": codecs}


def resolve_device(device: Any, pin_memory: bool | None) -> tuple[torch.device | None, bool]:
    """The staging device (None: the CPU, no copy) and whether to pin; checked before anything starts.

    Raises:
        ConfigError: not a device, a CUDA device without CUDA, or a device that is neither CUDA nor the CPU.
    """
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"device must be None, a device string like 'cuda:0' or a torch.device; "
                              f"got {device!r} ({exc})") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {device} requested, but CUDA is not available")
        if device.type not in ("cuda", "cpu"):  # its batches stayed on the CPU without a word
            raise ConfigError(f"device={str(device)!r}: the loader stages batches to a CUDA device or leaves them on "
                              f"the CPU (None or 'cpu'); for {device.type}, move each batch in the loop or with "
                              f"device_transform=lambda batch: ..., e.g. a tensor's .to({str(device)!r})")
    if pin_memory is None:
        pin_memory = device is not None and device.type == "cuda"
    if pin_memory and not torch.cuda.is_available():
        warnings.warn("pin_memory=True but CUDA is not available; batches stay in pageable memory", stacklevel=3)
        pin_memory = False
    return device, pin_memory


def own_canaries(opts: LoaderOptions, dataset: Any, length: int | None) -> tuple[Any, ...] | None:
    """The trainer's own canary samples (:mod:`ferry.common.canary`), which remote producers' must match: loaded here
    from a map-style dataset object when producers on other hosts may join (a tcp or ipc endpoint of the script's
    or the environment's) and no local producers fork from this process (a handle a ``__getitem__`` opened here, an
    HDF5 file, would be inherited). A sample that raises here is left out (this process may lack what producers
    have). None: not loaded, the first remote producer's are the reference instead."""
    if (dataset is None or isinstance(dataset, str) or not opts.endpoints or opts.local is not None or not length
            or is_sharded(dataset) or is_iterable(dataset)):
        return None
    from ferry.common.canary import canary_indices, checked, probe

    if not checked(dataset):
        return None
    return tuple(c for c in probe(dataset, canary_indices(length), in_trainer=True)
                 if not c.structure.startswith("raised "))


class Pipeline:
    """Local producers -> io thread -> ``handoff`` -> staging thread -> ``staged`` (the training thread's)."""

    def __init__(self, opts: LoaderOptions, counters: Counters, *, device: Any, pin_memory: bool,
                 figures: Callable[[], dict[str, Any]]) -> None:
        self.stop = threading.Event()
        self.staging_failure: list[BaseException] = []
        self.staged: queue.Queue[Any] = queue.Queue(maxsize=STAGED_BATCHES)
        # deliveries, in order; bounded by the credits (each holds one) plus one end-of-run marker per run
        self.handoff: queue.Queue[Any] = queue.Queue()
        self.local: LocalProducers | None = None
        #: local_producers="auto": called with each demand sample on the training thread (else None)
        self.autoscale: Autoscaler | None = None
        self.io: IoThread | None = None
        self.slot: int | None = None  # this loader's endpoint slot in the process (consumer/io/ports.py)
        self.staging: threading.Thread | None = None
        self.metrics: Any = None
        try:
            self._start(opts, counters, device, pin_memory, figures)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, opts: LoaderOptions, counters: Counters, device: Any, pin_memory: bool,
               figures: Callable[[], dict[str, Any]]) -> None:
        dataset, dataset_len, fingerprint = opts.dataset, opts.dataset_len, None
        if dataset is not None and not isinstance(dataset, str):
            if is_sharded(dataset):  # its "length" is the shard count (common/shardplan.py)
                dataset_len = len(shard_names(dataset))
            elif is_iterable(dataset):  # len(dataset), or 0 without one, as its producers announce it
                dataset_len = iterable_len(dataset) or 0
            dataset_len = len(dataset) if dataset_len is None else dataset_len
            fingerprint = dataset_fingerprint(dataset)
            if opts.local is not None and opts.local.transform is not None:  # what its producers will announce
                fingerprint = transformed_fingerprint(fingerprint, opts.local.transform, opts.local.transform_args)
        canaries = own_canaries(opts, dataset, dataset_len)
        curve = None
        if opts.curve is not None:
            from ferry.common.security import CurveServer

            curve = CurveServer.load(opts.curve.secret_key, opts.curve.authorized_keys)
        transport, local, endpoints = opts.transport, opts.local, self._slotted(opts)
        window = Window.of(opts.buffer_batches)  # every size derived from buffer_batches (consumer/window.py)
        if local is not None:
            # its producers read FERRY_KEEP_FREED_MEMORY (common/heap.py): a bad value is one ConfigError here,
            # before any starts. Only read: the trainer's own heap settings are its script's choice
            wanted_by_environment()
            self.local = LocalProducers(
                local, transport, dataset, dataset_args=opts.dataset_args,
                # as DataLoader draws its workers' base seed: from torch's RNG, so torch.manual_seed in the
                # script makes the producers' own random streams reproducible; with generator=, the loader's
                # seed is that draw already (DataLoader's first from its generator: consumer/options/resolve.py).
                # Another rank's differs, where DataLoader's ranks seeded alike share their workers' streams
                base_seed=rank_base_seed(opts.seed if opts.generator is not None else
                                         int(torch.empty((), dtype=torch.int64).random_().item()), opts.rank),
                shared_memory=(window.slab_slots, transport.max_batch_bytes)
                if local.shared_memory else None,
            )
            endpoints.append(self.local.endpoint)
            if local.count == AUTO:
                self.autoscale = Autoscaler(self.local, default_high=local.max is None)
        if not endpoints:
            raise ConfigError("no endpoint to bind")
        self.endpoints = tuple(endpoints)
        self.io = IoThread(
            CoreConfig(capacity=window.credits, heartbeat=transport.heartbeat, liveness=transport.liveness,
                       on_error=opts.on_error, max_batch_bytes=transport.max_batch_bytes,
                       task_timeout=transport.task_timeout, dataset_len=dataset_len, fingerprint=fingerprint,
                       seed=opts.seed % (1 << 63), max_attempts=transport.max_attempts,
                       # dataset= a spec, no local producers: remote producers must serve that spec
                       dataset_spec=dataset if isinstance(dataset, str) and local is None else None,
                       dataset_args=opts.dataset_args if isinstance(dataset, str) and local is None else None,
                       weight=transport.weight,
                       local_producers=self.local.count if self.local is not None else 0, canaries=canaries,
                       code=code_digest(dataset) if isinstance(dataset, str) and local is None else None,
                       **compression_welcome(transport.compression)),
            endpoints=self.endpoints, handoff=self.handoff, counters=counters, curve=curve,
            slab=self.local.slab if self.local is not None else None,
        )
        self.io.start()
        if self.local is not None:  # a local producer's death, seen through its sentinel, loses it at once
            io = self.io
            self.local.on_death = io.producer_died
            self.local.on_leave = lambda pid: io.producer_leaving(pid, LEAVE_WAIT_S)  # before a scale-down's SIGTERM
            # a replacement only once some producer has served (else a start-up failure repeats)
            self.local.served = lambda: io.health().producers_seen > 0
        self.stager = make_stager(device, pin_memory, window.pool_buffers,
                                  slab=self.local.slab if self.local is not None else None)
        self.staging = threading.Thread(
            target=staging_loop, name="ferry-staging", daemon=True,
            args=(self.handoff, self.staged, self.stop, self.stager, self.staging_failure),
        )
        self.staging.start()
        if opts.metrics_port:
            from ferry.common.metrics import MetricsServer

            self.metrics = MetricsServer(opts.metrics_port, figures, "ferry_consumer", declared=STATS)

    def _slotted(self, opts: LoaderOptions) -> list[str]:
        """The tcp and ipc endpoints to bind: as given with ``endpoint=``; the default's or ``FERRY_ENDPOINT``'s in
        a slot of this process's own (consumer/io/ports.py), logged when it is not the first."""
        if not (opts.shared_endpoints and opts.endpoints):
            return list(opts.endpoints)
        from ferry.consumer.io.ports import in_slot, take_slot
        from ferry.consumer.options.resolve import env_int

        self.slot = take_slot()
        endpoints = [in_slot(e, self.slot, max(1, env_int("LOCAL_WORLD_SIZE", 1))) for e in opts.endpoints]
        if self.slot:
            import logging

            logging.getLogger("ferry.consumer").info(
                "ferry: another loader of this process holds %s; this one binds %s (a process's loaders take the "
                "next slot in the order they are built: give endpoint= to choose)", ", ".join(opts.endpoints),
                ", ".join(endpoints))
        return endpoints

    def shutdown(self) -> None:
        """Stop everything, in the order of the module docstring."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        self.stop.set()
        # the garbage collector may run this on the staging or io thread itself: that one is told to stop, not joined
        if self.staging is not None and self.staging.is_alive() and self.staging is not threading.current_thread():
            self.staging.join(JOIN_TIMEOUT_S)
        if self.local is not None:
            self.local.on_death = self.local.on_leave = None  # deaths from here on are the shutdown's own
            self.local.served = lambda: False
        if self.io is not None:
            self.io.close(JOIN_TIMEOUT_S)
        # batches handed on or staged and never yielded: a closed loader must not keep them (nor their slots)
        for handed in (self.staged, self.handoff):
            while True:
                try:
                    handed.get_nowait()
                except queue.Empty:
                    break
        if self.local is not None:
            self.local.close()
        if self.slot is not None:  # its ports are free once the io thread closed the ROUTER
            from ferry.consumer.io.ports import release_slot

            release_slot(self.slot)
            self.slot = None

"""Ferry's producer: a standalone service that loads samples, collates batches and streams them to
consumers over ZeroMQ.

Run it as ``python -m ferry.producer --connect tcp://trainer:5555 --dataset npy-folder --dataset-arg root=/data``
(or ``ferry produce …``). Embed it with :func:`serve`, its one public entry point; the consumer's local
mode starts producers only through it.

This package never imports ``consumer``, and imports torch only if the dataset does.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import sys
import threading
from typing import Any

from ferry.producer.config import ProducerConfig

__all__ = ["serve", "ProducerConfig", "keep_freed_memory"]

_PR_SET_PDEATHSIG = 1
# glibc's mallopt parameters (malloc.h) and the values a producer sets
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Freed heap memory up to this much stays in the process instead of going back to the kernel. [Unit: byte]
KEEP_FREED_BYTES = 1 << 30
#: Blocks up to this size come from the heap, so they are reused after a free, not mapped afresh each time.
#: glibc's own ceiling for this setting on 64-bit (HEAP_MAX / 2). [Unit: byte]
HEAP_BLOCK_BYTES = 32 << 20


def serve(config: ProducerConfig, dataset: Any = None) -> int:
    """Serve ``dataset`` (or the one ``config.dataset`` names) until SIGTERM/SIGINT. Returns an exit code.

    Raises:
        DatasetSpecError: the dataset spec cannot be resolved.
    """
    from ferry.common.datasets import Transformed, resolve_callable, resolve_dataset
    from ferry.common.sampleinfo import seed_process

    from ferry.producer.service import Producer

    if config.exit_with_parent:
        _die_with_parent()
    keep_freed_memory()
    if dataset is None:
        dataset = resolve_dataset(config.dataset, config.dataset_args)
    if config.transform:
        dataset = Transformed(dataset, config.transform)
    if isinstance(config.collate, str):
        config = dataclasses.replace(config, collate=resolve_callable(config.collate, "collate function"))
    if config.exit_with_parent and "torch" in sys.modules:  # a local producer, maybe forked from the trainer:
        # as DataLoader's workers do; a fork inherits torch's OpenMP pool unusable ("Invalid thread pool!")
        sys.modules["torch"].set_num_threads(1)
    seed_process(config.seed, worker_id=config.worker_id, num_workers=config.num_workers, dataset=dataset)
    if config.init is not None:
        init = resolve_callable(config.init, "init function") if isinstance(config.init, str) else config.init
        init(config.worker_id)
    producer = Producer(config, dataset)
    if threading.current_thread() is threading.main_thread():
        install_signal_handlers(producer)
    return producer.run()


def install_signal_handlers(producer: Any) -> None:
    """SIGTERM and SIGINT stop the producer cleanly (BYE, exit 0). Main thread only."""

    def handler(signum: int, frame: Any) -> None:
        producer.stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def keep_freed_memory() -> bool:
    """Have glibc keep freed memory in this process rather than return it to the kernel after every batch.

    A producer frees and re-allocates the same large blocks for every batch (a user dataset's
    ``np.load`` result per sample, collation's batch). By default glibc trims its heaps and unmaps large
    blocks on free, so every batch pays page faults and page zeroing on fresh memory. Raising the mmap and
    trim thresholds keeps those blocks for reuse. Once per process, at ``serve()``; True if applied. A no-op
    (False) where the C library is not glibc.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))
    if not ok:
        logging.getLogger("ferry.producer").debug("mallopt refused the producer's memory settings")
    return ok


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM us when the parent dies (local mode), so no producer outlives its trainer."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the consumer-liveness timeout still ends the work
        logging.getLogger("ferry.producer").debug("PR_SET_PDEATHSIG unavailable")
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)

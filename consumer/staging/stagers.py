"""The staging thread (docs/ARCHITECTURE.md#staging): from the io thread's deliveries to batches the training loop can use.

* CPU (``device=None`` or ``"cpu"``): :mod:`ferry.consumer.staging.tensors`, tensors over the received memory.
* CUDA: :mod:`ferry.consumer.staging.cuda`, asynchronous copies on a side stream from page-locked memory.

The thread body is :func:`staging_loop`; it stops when ``stop`` is set, with every wait bounded. Between
batches it lets the stager drop what completed copies held (``reclaim``), so slots come back promptly. A
registered batch type whose ``from_tree`` raises fails its batch (the loop gets a BatchTypeError there), never the
thread.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import torch

from ferry.common.constants import POLL_SLICE_S
from ferry.common.errors import BatchTypeError
from ferry.common.shm import Slab

from ferry.consumer.core import is_eof
from ferry.consumer.staging.cpu_threads import use_one_cpu_thread
from ferry.consumer.staging.cuda import CudaStager, PlainCudaStager, use_device
from ferry.consumer.staging.tensors import CpuStager

__all__ = ["make_stager", "staging_loop"]


def make_stager(device: torch.device | None, pin_memory: bool, pool_limit: int,
                slab: Slab | None = None) -> CpuStager | CudaStager:
    """``pool_limit``: host buffers kept per batch size (the loader passes its capacity plus a margin).
    ``slab``: the local producers' shared-memory slab, whose used slots a CUDA stager registers."""
    if device is not None and device.type == "cuda":
        if pin_memory:
            return CudaStager(device, slab=slab, pool_limit=pool_limit)
        return PlainCudaStager(device, pool_limit)
    return CpuStager(pin_memory, pool_limit)


def staging_loop(handoff: "queue.Queue[Any]", out: "queue.Queue[Any]", stop: threading.Event,
                 stager: CpuStager | CudaStager, failure: list[BaseException]) -> None:
    """Move items from ``handoff`` to ``out``, staging batches on the way. Bounded waits; stops on ``stop``."""
    use_one_cpu_thread()  # its copies on one CPU thread, beside the training thread's team
    try:
        use_device(getattr(stager, "device", None))
        while not stop.is_set():
            try:
                item = handoff.get(timeout=POLL_SLICE_S)
            except queue.Empty:
                stager.reclaim()
                continue
            if not is_eof(item) and item.error is None:
                try:
                    stager.stage(item)
                except BatchTypeError as exc:  # a registered type's from_tree raised: that batch's error
                    item.tree, item.frames, item.error = None, [], exc
            while not stop.is_set():
                try:
                    out.put(item, timeout=POLL_SLICE_S)
                    break
                except queue.Full:
                    stager.reclaim()
                    continue
    except BaseException as exc:
        failure.append(exc)
    finally:
        stager.close()

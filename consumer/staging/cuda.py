"""Staging to a CUDA device: asynchronous host-to-device copies on a side stream, from page-locked memory.

Each array leaf is copied ``copy_(non_blocking=True)`` straight from where it lies when that memory is registered
with CUDA (:mod:`ferry.consumer.staging.pinning`): a shared-memory slot, or a receive-pool buffer a chunked leaf
was assembled in. Any other leaf (a frame that libzmq owns) is first copied into a *reused* page-locked buffer from
:class:`PinnedPool`. An event recorded after the copies travels with the batch; the training thread makes its
current stream wait on it and calls ``record_stream`` on the tensors. The host memory a batch's copies read from
(its slot, its pool buffers, its pinned buffers) is held until that event completed: only then can a producer
write into the slot again, or a pool hand the buffer out again.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Any, Callable

import numpy as np
import torch

from ferry.common.arrays import Chunked
from ferry.common.shm import Slab
from ferry.common.tree import iter_leaves

from ferry.consumer.core import Delivery
from ferry.consumer.staging.hostpool import HostPool
from ferry.consumer.staging.pinning import HostRegistry, page_span
from ferry.consumer.staging.tensors import CpuStager, is_assembled, map_arrays

__all__ = ["CudaStager", "PlainCudaStager", "PinnedPool", "device_guard", "use_device"]


class PinnedPool:
    """Page-locked byte buffers, reused. A buffer returns to the pool once its copy's event completed.

    Fresh allocations cost page faults (about 1.8 GB/s into new memory against 11 GB/s into reused
    memory on our reference machine), so buffers are kept by size and handed out again.
    """

    def __init__(self, pin: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.pin_memory) -> None:
        self._pin = pin
        self._free: dict[int, list[torch.Tensor]] = {}
        self._busy: deque[tuple[Any, list[torch.Tensor]]] = deque()  # (event, buffers), oldest first

    def acquire(self, nbytes: int) -> torch.Tensor:
        self._reclaim(block=False)
        size = max(64, 1 << (nbytes - 1).bit_length())  # size classes: powers of two
        free = self._free.get(size)
        if not free and self._busy and sum(len(b) for b in self._free.values()) == 0:
            self._reclaim(block=True)
            free = self._free.get(size)
        if free:
            return free.pop()
        return self._pin(torch.empty(size, dtype=torch.uint8))

    def release_after(self, event: Any, buffers: list[torch.Tensor]) -> None:
        self._busy.append((event, buffers))

    def _reclaim(self, block: bool) -> None:
        while self._busy:
            event, buffers = self._busy[0]
            if block:
                event.synchronize()
                block = False
            elif not event.query():
                return
            self._busy.popleft()
            for buffer in buffers:
                self._free.setdefault(buffer.numel(), []).append(buffer)

    def close(self) -> None:
        for event, _ in self._busy:
            event.synchronize()
        self._busy.clear()
        self._free.clear()


class _SideStream:
    """The stager's CUDA stream and the events recorded on it (tests of the stager's bookkeeping pass a
    stand-in with the same two methods)."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device=device)

    def scope(self) -> Any:
        """Make the side stream current (a context manager)."""
        return torch.cuda.stream(self.stream)

    def record(self) -> Any:
        """An event recorded after everything queued on the side stream so far."""
        event = torch.cuda.Event()
        event.record(self.stream)
        return event


class CudaStager:
    """Host memory -> device, on a side stream, with one event per batch.

    Where each array leaf's copy starts:

    * in a range registered with CUDA: from where it lies, no CPU copy. A shared-memory slot's used part is
      registered the first time a batch in that slot is staged (extended if a later one uses more); a
      receive-pool buffer (where chunked leaves are assembled) is registered when the pool allocates it;
    * anywhere else (a frame that libzmq owns, or memory CUDA refused to register): copied into a reused
      pinned buffer first (:class:`PinnedPool`), as registering each fresh frame would cost more (about a
      millisecond per call) than the copy.

    Invariant: the host arrays a batch's copies read from are held, with the batch's event, until the event
    completed (``reclaim`` drops them; events complete in order on the one stream). A slot goes back to the
    producers only when its last view is dropped, and a pool buffer back to its pool likewise, so neither
    is written again under a copy in flight. ``close`` synchronizes, unregisters, and only then lets go.
    """

    def __init__(self, device: torch.device, *, slab: Slab | None = None, registry: HostRegistry | None = None,
                 pool_limit: int = 12, stream: Any = None,
                 pin: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.pin_memory) -> None:
        self.device = device
        self.stream = stream if stream is not None else _SideStream(device)
        self.registry = registry if registry is not None else HostRegistry.for_device(device)
        self.slab = slab
        self.pool = PinnedPool(pin)
        self.host = HostPool(pool_limit, self.registry)
        self._holds: deque[tuple[Any, list[np.ndarray]]] = deque()  # (event, host sources), oldest first
        self.direct = 0  # leaves copied from registered memory
        self.through_pool = 0  # leaves copied into a pinned buffer first
        if slab is not None and self.registry.enabled:  # unregister before the slab's memory is unmapped
            slab.before_unmap(self._unregister_within)

    def _unregister_within(self, address: int, size: int) -> None:
        with device_guard(self.device):  # the unmap hook may run on any thread (a finalizer)
            self.registry.unregister_within(address, size)

    def stage(self, delivery: Delivery) -> None:
        self.reclaim()
        self._register_slots(delivery.tree)
        held: list[np.ndarray] = []
        used: list[torch.Tensor] = []

        def to_device(leaf: np.ndarray | Chunked) -> torch.Tensor:
            dtype = torch.from_numpy(np.empty(0, leaf.dtype)).dtype
            target = torch.empty(leaf.shape, dtype=dtype, device=self.device)
            if leaf.nbytes == 0:
                return target
            host = self.host.adopt(leaf) if is_assembled(leaf) else leaf
            if self.registry.covers(host.ctypes.data, host.nbytes):
                source = torch.from_numpy(host)
                held.append(host)
                self.direct += 1
            else:
                raw = self.pool.acquire(host.nbytes)
                used.append(raw)
                source = raw[: host.nbytes].view(dtype).view(leaf.shape)
                source.copy_(torch.from_numpy(host))  # CPU memcpy, releases the GIL
                self.through_pool += 1
            target.copy_(source, non_blocking=True)
            return target

        with self.stream.scope():
            delivery.tree = map_arrays(delivery.tree, to_device)
            event = self.stream.record()
        self.pool.release_after(event, used)
        if held:
            self._holds.append((event, held))
        delivery.event = event
        delivery.frames = []  # the host frames are no longer needed

    def _register_slots(self, tree: Any) -> None:
        """Register, per shared-memory slot this batch lies in, the pages from the slot's start to the end of
        its last leaf there. Safe to extend: the slot is this batch's, and earlier copies from it completed."""
        if self.slab is None or not self.registry.enabled:
            return
        ends: dict[int, int] = {}
        for leaf in iter_leaves(tree):
            if isinstance(leaf, np.ndarray) and leaf.nbytes:
                span = self.slab.slot_span(leaf.ctypes.data, leaf.nbytes)
                if span is not None:
                    ends[span[0]] = max(ends.get(span[0], 0), span[1])
        for slot, end in ends.items():
            self.registry.register(*page_span(slot, end))

    @property
    def held(self) -> int:
        """Batches whose host sources are still held (their copies may be in flight)."""
        return len(self._holds)

    def reclaim(self) -> None:
        """Let go of the host sources of batches whose copies completed."""
        while self._holds and self._holds[0][0].query():
            self._holds.popleft()

    def close(self) -> None:
        for event, _ in self._holds:
            event.synchronize()
        self.pool.close()
        self.registry.unregister_all()  # no copy is in flight any more; and nothing is freed yet
        self._holds.clear()
        self.host.close()


def _on_cuda(device: torch.device | None) -> bool:
    return device is not None and device.type == "cuda" and torch.cuda.is_available()


def use_device(device: torch.device | None) -> None:
    """Make ``device`` this thread's CUDA device. A new thread starts on device 0: without this, pinning and
    registering memory for a loader on ``cuda:N`` would create a CUDA context on GPU 0 (in every DDP rank)."""
    if _on_cuda(device):
        torch.cuda.set_device(device)


def device_guard(device: torch.device | None) -> Any:
    """A context that makes ``device`` current, for CUDA calls on a thread that is not the staging thread."""
    return torch.cuda.device(device) if _on_cuda(device) else contextlib.nullcontext()


class PlainCudaStager(CpuStager):
    """``pin_memory=False`` on CUDA: a synchronous copy from pageable memory. Slower; for comparison."""

    def __init__(self, device: torch.device, pool_limit: int) -> None:
        super().__init__(pin_memory=False, pool_limit=pool_limit)
        self.device = device

    def stage(self, delivery: Delivery) -> None:
        delivery.tree = map_arrays(delivery.tree, lambda a: torch.from_numpy(self._array(a)).to(self.device))
        delivery.frames = []

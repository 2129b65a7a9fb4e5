"""The staging thread (docs/ARCHITECTURE.md#staging): from the reorder buffer to batches the training loop can use.

* CPU (``device=None`` or ``"cpu"``): every array leaf becomes a tensor over the received frame
  (``torch.from_numpy``), no copy. A large leaf that arrived in several frames (see
  ``ferry.common.constants.FRAME_CHUNK_BYTES``) is assembled into a reused host buffer from :class:`HostPool`:
  the tensor owns that buffer until the training loop drops it, and a finalizer returns it to the pool.
  With ``pin_memory=True`` (and CUDA present) leaves are copied into page-locked memory instead, as
  ``DataLoader(pin_memory=True)`` does.
* CUDA: each array leaf is copied into a *reused* page-locked buffer from :class:`PinnedPool`, then
  ``copy_(non_blocking=True)`` to the device on a dedicated side stream. An event recorded after the
  copies travels with the batch; the training thread makes its current stream wait on it and calls
  ``record_stream`` on the tensors. A pinned buffer goes back to the pool only after its event completed.

The thread body is :func:`staging_loop`; it stops when ``stop`` is set, with every wait bounded.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections import deque
from typing import Any, Callable

import numpy as np
import torch

from ferry.common.codec import Chunked
from ferry.common.constants import POLL_SLICE_S
from ferry.common.tree import iter_leaves, map_tree

from ferry.consumer.buffer import Delivery, ReorderBuffer, is_eof


def map_arrays(tree: Any, fn: Callable[[np.ndarray | Chunked], torch.Tensor]) -> Any:
    """The tree with ``fn(leaf)``, a tensor, in place of each array leaf. A bfloat16 leaf (its int16 bits on
    the wire) becomes a bfloat16 tensor over the same memory."""
    return map_tree(lambda leaf: _tensor_of(leaf, fn) if isinstance(leaf, (np.ndarray, Chunked)) else leaf, tree)


def _tensor_of(leaf: np.ndarray | Chunked, fn: Callable[[np.ndarray | Chunked], torch.Tensor]) -> torch.Tensor:
    tensor = fn(leaf)
    return tensor.view(torch.bfloat16) if getattr(leaf, "bfloat16", False) else tensor


def iter_tensors(tree: Any):
    return (leaf for leaf in iter_leaves(tree) if isinstance(leaf, torch.Tensor))


class HostPool:
    """Reused host buffers for assembling chunked leaves, handed out for as long as the loop holds them.

    ``adopt`` assembles a leaf into a pooled buffer and returns a fresh array object over it; when that
    array is garbage-collected (the training loop dropped every tensor over it), a ``weakref.finalize``
    puts the buffer back. At most ``limit`` buffers per size are pooled; beyond that (a loop that keeps
    every batch) leaves go into one-off allocations, so correctness never depends on the pool.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._free: dict[int, list[np.ndarray]] = {}
        self._count: dict[int, int] = {}
        self.reused = 0

    def adopt(self, leaf: Chunked) -> np.ndarray:
        buffer, pooled = self._acquire(leaf.nbytes)
        array = leaf.assemble_into(buffer)
        if pooled:
            weakref.finalize(array, self._release, buffer)
        return array

    def _acquire(self, nbytes: int) -> tuple[np.ndarray, bool]:
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self.reused += 1
                return free.pop(), True
            if self._count.get(nbytes, 0) < self._limit:
                self._count[nbytes] = self._count.get(nbytes, 0) + 1
                return np.empty(nbytes, np.uint8), True
        return np.empty(nbytes, np.uint8), False

    def _release(self, buffer: np.ndarray) -> None:
        with self._lock:
            self._free.setdefault(len(buffer), []).append(buffer)

    def close(self) -> None:
        with self._lock:
            self._free.clear()


class CpuStager:
    """Tensors over the received frames (chunked leaves: over a pooled buffer); or fresh pinned copies
    when ``pin_memory``."""

    def __init__(self, pin_memory: bool, pool_limit: int = 12) -> None:
        self.pin_memory = pin_memory
        self.host = HostPool(pool_limit)

    def stage(self, delivery: Delivery) -> None:
        if self.pin_memory:
            delivery.tree = map_arrays(delivery.tree, lambda a: torch.from_numpy(self._array(a)).pin_memory())
            delivery.frames = []  # the copies own their memory now
        else:
            delivery.tree = map_arrays(delivery.tree, lambda a: torch.from_numpy(self._array(a)))

    def _array(self, leaf: np.ndarray | Chunked) -> np.ndarray:
        return self.host.adopt(leaf) if isinstance(leaf, Chunked) else leaf

    def close(self) -> None:
        self.host.close()


class PinnedPool:
    """Page-locked byte buffers, reused. A buffer returns to the pool once its copy's event completed.

    Fresh allocations cost page faults (about 1.8 GB/s into new memory against 11 GB/s into reused
    memory on our reference machine), so buffers are kept by size and handed out again.
    """

    def __init__(self) -> None:
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
        return torch.empty(size, dtype=torch.uint8).pin_memory()

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


class CudaStager:
    """Reused pinned buffers -> device, on a side stream, with one event per batch."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.pool = PinnedPool()

    def stage(self, delivery: Delivery) -> None:
        used: list[torch.Tensor] = []

        def to_device(leaf: np.ndarray | Chunked) -> torch.Tensor:
            dtype = torch.from_numpy(np.empty(0, leaf.dtype)).dtype
            if leaf.nbytes == 0:
                return torch.empty(leaf.shape, dtype=dtype, device=self.device)
            raw = self.pool.acquire(leaf.nbytes)
            used.append(raw)
            pinned = raw[: leaf.nbytes].view(dtype).view(leaf.shape)
            if isinstance(leaf, Chunked):  # chunks go straight into the pinned buffer: no extra copy
                offset = 0
                for chunk in leaf.chunks:
                    raw[offset : offset + len(chunk)].copy_(torch.frombuffer(chunk, dtype=torch.uint8))
                    offset += len(chunk)
            else:
                pinned.copy_(torch.from_numpy(leaf))  # CPU memcpy, releases the GIL
            target = torch.empty(leaf.shape, dtype=dtype, device=self.device)
            target.copy_(pinned, non_blocking=True)
            return target

        with torch.cuda.stream(self.stream):
            delivery.tree = map_arrays(delivery.tree, to_device)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.pool.release_after(event, used)
        delivery.event = event
        delivery.frames = []  # the host frames are no longer needed

    def close(self) -> None:
        self.pool.close()


def make_stager(device: torch.device | None, pin_memory: bool, pool_limit: int) -> CpuStager | CudaStager:
    """``pool_limit``: host buffers kept per batch size (the loader passes its capacity plus a margin)."""
    if device is not None and device.type == "cuda":
        if pin_memory:
            return CudaStager(device)
        return _PlainCudaStager(device, pool_limit)
    return CpuStager(pin_memory, pool_limit)


class _PlainCudaStager(CpuStager):
    """``pin_memory=False`` on CUDA: a synchronous copy from pageable memory. Slower; for comparison."""

    def __init__(self, device: torch.device, pool_limit: int) -> None:
        super().__init__(pin_memory=False, pool_limit=pool_limit)
        self.device = device

    def stage(self, delivery: Delivery) -> None:
        delivery.tree = map_arrays(delivery.tree, lambda a: torch.from_numpy(self._array(a)).to(self.device))
        delivery.frames = []


def staging_loop(buffer: ReorderBuffer, out: "queue.Queue[Any]", stop: threading.Event,
                 stager: CpuStager | CudaStager, failure: list[BaseException]) -> None:
    """Move items from ``buffer`` to ``out``, staging batches on the way. Bounded waits; stops on ``stop``."""
    torch.set_num_threads(1)
    try:
        while not stop.is_set():
            item = buffer.get(timeout=POLL_SLICE_S)
            if item is None:
                continue
            if not is_eof(item) and item.error is None:
                stager.stage(item)
            while not stop.is_set():
                try:
                    out.put(item, timeout=POLL_SLICE_S)
                    break
                except queue.Full:
                    continue
    except BaseException as exc:
        failure.append(exc)
    finally:
        stager.close()

"""Reused host buffers for assembling leaves that arrived in several frames (or compressed): the staging
thread's receive pool (:class:`HostPool`). On CUDA its buffers are registered with CUDA (page-locked), within
a budget, so that host-to-device copies start from them (docs/ARCHITECTURE.md#staging).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from ferry.common.arrays import Chunked
from ferry.consumer.staging.pinning import HostRegistry, page_aligned_buffer, page_span

__all__ = ["HostPool"]


class HostPool:
    """Reused host buffers for assembling chunked leaves, handed out for as long as the loop holds them.

    ``adopt`` assembles a leaf into a pooled buffer and returns a fresh array object over it; when that
    array is garbage-collected (the training loop dropped every tensor over it), a ``weakref.finalize``
    puts the buffer back. At most ``limit`` buffers per size are pooled; beyond that (a loop that keeps
    every batch) leaves go into one-off allocations, so correctness never depends on the pool.

    With an enabled ``registry`` (staging to CUDA), each pooled buffer is page-aligned and registered with
    CUDA once, when it is allocated, so that a leaf assembled in it is copied to the device from there. The
    registry's owner unregisters before the buffers are freed (``CudaStager.close``). Page-locked memory is
    bounded: at most ``limit`` buffers of the largest size seen. Leaves whose size changes every batch (padded
    to the longest sequence, say) would otherwise lock a new buffer per size; to make room, the free buffers of
    the least recently used sizes are unregistered and dropped, and a buffer that still does not fit stays
    unregistered (its leaves go through the pinned pool: slower, never wrong).
    """

    def __init__(self, limit: int, registry: HostRegistry | None = None) -> None:
        self._limit = limit
        self._registry = registry if registry is not None and registry.enabled else None
        self._lock = threading.RLock()  # _release runs from weakref finalizers, possibly on this thread
        self._free: dict[int, list[np.ndarray]] = {}
        self._count: dict[int, int] = {}
        self._recent: dict[int, None] = {}  # sizes, least recently used first
        self._locked: dict[int, int] = {}  # id -> nbytes of the pooled buffers registered with CUDA
        self.reused = 0

    def adopt(self, leaf: Chunked) -> np.ndarray:
        buffer, pooled = self._acquire(leaf.nbytes)
        array = leaf.assemble_into(buffer)
        if pooled:
            weakref.finalize(array, self._release, buffer)
        return array

    def _acquire(self, nbytes: int) -> tuple[np.ndarray, bool]:
        with self._lock:
            self._recent.pop(nbytes, None)
            self._recent[nbytes] = None
            free = self._free.get(nbytes)
            if free:
                self.reused += 1
                return free.pop(), True
            if self._count.get(nbytes, 0) < self._limit:
                self._count[nbytes] = self._count.get(nbytes, 0) + 1
            else:
                return np.empty(nbytes, np.uint8), False
            if self._registry is None:
                return np.empty(nbytes, np.uint8), True
            buffer = page_aligned_buffer(nbytes)
            if self._make_room(nbytes):  # else pooled but not locked: copied via the pinned pool
                if self._registry.register(*page_span(buffer.ctypes.data, nbytes)):
                    self._locked[id(buffer)] = nbytes
            return buffer, True

    def _make_room(self, nbytes: int) -> bool:
        """Whether a buffer of ``nbytes`` may be registered within the budget, after dropping the free buffers
        of the least recently used other sizes as needed. Under the lock."""
        budget = self._limit * max(self._recent)
        for size in list(self._recent):
            if sum(self._locked.values()) + nbytes <= budget:
                break
            if size == nbytes:
                continue
            for buffer in self._free.pop(size, []):
                self._count[size] -= 1
                if self._locked.pop(id(buffer), None) is not None:
                    self._registry.unregister_within(*page_span(buffer.ctypes.data, size))
            if not self._count.get(size):  # nothing of that size is left anywhere: forget it
                self._count.pop(size, None)
                self._recent.pop(size, None)
        return sum(self._locked.values()) + nbytes <= budget

    def _release(self, buffer: np.ndarray) -> None:
        with self._lock:
            self._free.setdefault(len(buffer), []).append(buffer)

    @property
    def locked_bytes(self) -> int:
        """Bytes of pooled buffers registered with CUDA now."""
        with self._lock:
            return sum(self._locked.values())

    def close(self) -> None:
        with self._lock:
            self._free.clear()

"""Page-locking host memory that Ferry already owns, so that host-to-device copies start from it directly.

``cudaHostRegister`` page-locks an existing range of host memory (and commits every page of it): a copy
from a registered range runs as DMA, asynchronously, with no CPU copy into a separate pinned buffer first.
Ferry registers two kinds of memory (docs/ARCHITECTURE.md#staging):

* the part of a shared-memory slot (``ferry.common.shm.Slab``) that batches actually used, lazily, the first
  time a batch in that slot is staged, and kept while the slab lives (a slot is reused every few batches,
  so the registration, about a millisecond per call, is paid once per slot);
* the reused buffers of the receive pool (``HostPool``), once each, when they are allocated.

Frames that libzmq owns are not registered: each is fresh memory, and registering it would cost more than
copying it into the pinned pool.

:class:`HostRegistry` keeps the bookkeeping. Without CUDA it is disabled: ``register`` returns False and
nothing is called. Thread ownership: the staging thread registers; ``unregister_all`` runs on the staging
thread's way out (``CudaStager.close``), and ``unregister_within`` may run on whatever thread unmaps the
slab (its mapping's finalizer); a lock keeps the bookkeeping consistent across them. A range must not be
unregistered while a copy from it is in flight: the stager makes sure by holding the source arrays (and so
the slab slot, and the pool buffer) until the copy's event completed.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
from typing import Any

import numpy as np

log = logging.getLogger("ferry.consumer")

#: ``cudaHostRegisterPortable``: page-locked for every CUDA context, as torch's own registrations are.
HOST_REGISTER_PORTABLE = 1
#: ``cudaSuccess``.
CUDA_SUCCESS = 0
PAGE = mmap.PAGESIZE

__all__ = ["HostRegistry", "page_span", "page_aligned_buffer"]


def page_span(address: int, nbytes: int) -> tuple[int, int]:
    """The whole pages covering ``[address, address + nbytes)``, as ``(start, length)``."""
    start = address - address % PAGE
    end = -(-(address + nbytes) // PAGE) * PAGE
    return start, end - start


def page_aligned_buffer(nbytes: int) -> np.ndarray:
    """A uint8 buffer of ``nbytes`` whose pages are its own (it starts on a page and no other allocation
    shares its last page), so that registering it never overlaps another registered range."""
    whole = -(-max(nbytes, 1) // PAGE) * PAGE
    backing = np.empty(whole + PAGE, np.uint8)
    skip = (-backing.ctypes.data) % PAGE
    return backing[skip : skip + whole][:nbytes]


class _ThreadLastError:
    """Clears the CUDA runtime's last error of the calling thread after a failed call we handled: torch's
    binding leaves it set, and a later kernel-launch check on the same thread would raise it as its own.

    Works when torch uses a shared libcudart (the pip and conda builds): we look it up among the loaded
    libraries, never load one. With a statically linked runtime there is nothing to reach; the staging
    thread launches no kernels (its copies are plain memcpys), so a stale error stays harmless there."""

    _SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")

    def __init__(self) -> None:
        self._get_last_error: Any = None
        for soname in self._SONAMES:
            try:
                lib = ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            except OSError:
                continue
            self._get_last_error = lib.cudaGetLastError
            self._get_last_error.restype = ctypes.c_int
            break

    def __call__(self) -> None:
        if self._get_last_error is not None:
            self._get_last_error()


class HostRegistry:
    """Host ranges registered with CUDA (``cudaHostRegister``), keyed by start address.

    ``register`` is idempotent per range, and extends a range that starts at the same address; ranges must
    not overlap otherwise. A failed call (a non-zero ``cudaError_t``) is logged once per error, the CUDA
    runtime's last error is cleared, and that range is not tried again: the stager copies through the
    pinned pool instead, as without registration.

    ``cudart`` is ``torch.cuda.cudart()`` (or a stand-in with ``cudaHostRegister(ptr, size, flags)``,
    ``cudaHostUnregister(ptr)`` and ``cudaGetErrorString(code)``); None disables the registry.
    """

    def __init__(self, cudart: Any = None, clear_error: Any = None) -> None:
        self._cudart = cudart
        self._clear_error = clear_error if clear_error is not None else (_ThreadLastError() if cudart is not None else None)
        # reentrant: a slab's unmap hook (unregister_within) may run from a finalizer on this very thread
        self._lock = threading.RLock()
        self._ranges: dict[int, int] = {}  # start address -> registered bytes
        self._failed: set[tuple[int, int]] = set()  # (start, nbytes) refused by CUDA: not tried again
        self._errors_logged: set[int] = set()
        self.calls = 0  # cudaHostRegister calls made (each costs about a millisecond)
        self.failures = 0

    @classmethod
    def for_device(cls, device: Any) -> "HostRegistry":
        """A registry for staging to ``device``: enabled on CUDA, disabled otherwise."""
        import torch

        if device is None or getattr(device, "type", None) != "cuda" or not torch.cuda.is_available():
            return cls(None)
        return cls(torch.cuda.cudart())

    @property
    def enabled(self) -> bool:
        return self._cudart is not None

    @property
    def registered_bytes(self) -> int:
        with self._lock:
            return sum(self._ranges.values())

    def ranges(self) -> dict[int, int]:
        """A copy of the registered ranges: start address -> bytes."""
        with self._lock:
            return dict(self._ranges)

    def register(self, address: int, nbytes: int) -> bool:
        """Page-lock ``[address, address + nbytes)``; True if it is registered now.

        A range starting at ``address`` that is already at least as long: nothing to do. A shorter one is
        extended (unregistered, then registered whole, so that every copy lies inside one registration):
        the caller must not be copying from it at that moment.

        Raises:
            ValueError: ``nbytes`` is not positive, or the range overlaps another registered range.
        """
        if nbytes <= 0:
            raise ValueError(f"cannot register {nbytes} bytes at {address:#x}")
        if self._cudart is None:
            return False
        with self._lock:
            if self._ranges.get(address, 0) >= nbytes:
                return True
            if (address, nbytes) in self._failed:
                return False
            for start, length in list(self._ranges.items()):
                if start != address and start < address + nbytes and address < start + length:
                    raise ValueError(f"range of {nbytes} bytes at {address:#x} overlaps the registered range "
                                     f"of {length} bytes at {start:#x}")
            if address in self._ranges:  # extend: one registration over the whole range
                self._unregister_locked(address)
            self.calls += 1
            code = int(self._cudart.cudaHostRegister(address, nbytes, HOST_REGISTER_PORTABLE))
            if code != CUDA_SUCCESS:
                self._failed.add((address, nbytes))
                self._handle_error(code, f"cudaHostRegister of {nbytes} bytes at {address:#x}")
                return False
            self._ranges[address] = nbytes
            return True

    def covers(self, address: int, nbytes: int) -> bool:
        """True if ``[address, address + nbytes)`` lies inside one registered range."""
        with self._lock:
            for start, length in list(self._ranges.items()):
                if start <= address and address + nbytes <= start + length:
                    return True
        return False

    def unregister_within(self, address: int, size: int) -> None:
        """Unregister every range inside ``[address, address + size)`` (memory about to be unmapped)."""
        with self._lock:
            for start in [s for s, n in self._ranges.items() if address <= s and s + n <= address + size]:
                self._unregister_locked(start)

    def unregister_all(self) -> None:
        """Unregister everything (on close; no copy from these ranges may be in flight). Idempotent."""
        with self._lock:
            for start in list(self._ranges):
                self._unregister_locked(start)
            self._failed.clear()

    def _unregister_locked(self, start: int) -> None:
        nbytes = self._ranges.pop(start, None)
        if nbytes is None:  # a finalizer on this thread got there first
            return
        code = int(self._cudart.cudaHostUnregister(start))
        if code != CUDA_SUCCESS:  # the range is forgotten either way: it cannot be retried meaningfully
            self._handle_error(code, f"cudaHostUnregister of {nbytes} bytes at {start:#x}")

    def _handle_error(self, code: int, what: str) -> None:
        self.failures += 1
        if self._clear_error is not None:
            self._clear_error()
        if code in self._errors_logged:
            return
        self._errors_logged.add(code)
        try:
            reason = self._cudart.cudaGetErrorString(self._cudart.cudaError(code))
        except Exception:  # a runtime without the name of this code
            reason = "unknown error"
        log.warning("%s failed: CUDA error %d (%s); these batches are copied through the pinned pool instead",
                    what, code, reason)

    def __repr__(self) -> str:
        with self._lock:
            count, total = len(self._ranges), sum(self._ranges.values())
        state = "enabled" if self.enabled else "disabled"
        return f"<HostRegistry {state} [{count} ranges, {total} bytes | {self.calls} calls, {self.failures} failed]>"

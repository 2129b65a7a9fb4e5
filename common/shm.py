"""Shared-memory hand-over between a consumer and the producers it starts on its own machine.

Over a socket, a batch's bytes are copied four times on one host: file -> producer buffer -> kernel ->
libzmq's receive buffer -> the consumer's assembled leaf. ``DataLoader`` copies twice (file -> sample,
sample -> shared-memory batch). With a slab, a local producer reads samples straight into memory that
the consumer maps too: one copy in all, and the training loop's tensors are views of it.

* The consumer owns a :class:`Slab`: a ``memfd`` (anonymous shared memory; it is not under ``/dev/shm``,
  so Docker's 64 MB limit there does not apply) cut into equal *slots*. The file is sparse: a slot costs
  memory only once written, and keeps it for reuse (no page faults after the first pass).
* Each TASK to a producer that mapped the slab may carry a free slot as ``slot=[offset, nbytes]``. The
  producer writes the batch's arrays there and names them in the tree spec by offset (``"m"``, see
  :mod:`ferry.common.codec`); whatever does not fit travels as frames, as before.
* The consumer decodes the leaves as views of the slot. The slot stays taken until every one of those
  views is garbage-collected (the training loop dropped the batch): the views' base is a per-batch
  :class:`_Lease` object whose finalizer gives the slot back. Until then a TASK simply carries no slot.
* The consumer's slot ledger (:mod:`ferry.consumer.core.slots`) knows which task holds which slot. A slot given to a producer that is
  lost before answering is not reused while that process exists (it may still be writing into it); once it
  has exited, the slot is free again. Until then tasks just go without a slot if none is left.

Producers find the slab through ``/proc/<consumer pid>/fd/<fd>``, which works for subprocesses and for
``fork``/``spawn`` children alike, and prove it with a random *token* in HELLO. Producers on other machines
never have one, and nothing changes for them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import threading
import weakref
from typing import Callable

import numpy as np

#: Leaves placed in a slot start at multiples of this. [Unit: byte]
SLOT_ALIGN = 64
#: Largest slot. The slab is sparse, so this is address space, not memory. [Unit: byte]
MAX_SLOT_BYTES = 1 << 30


def available() -> bool:
    return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in, writable, in one call
_populate_write = True  # until the kernel says it does not know the advice


def populate(region: np.ndarray) -> bool:
    """Fault in the pages under ``region`` (uint8, in a shared mapping) for writing, in one call, so that
    the writes that follow take no page fault each (23-36k of them for a 150 MB batch). Where the kernel
    lacks ``MADV_POPULATE_WRITE`` it touches one byte per page instead, writing back what was there, which
    faults the same pages in. Returns True if the kernel call did it."""
    global _populate_write
    if not region.nbytes:
        return False
    page = mmap.PAGESIZE
    start = region.ctypes.data
    aligned = start - start % page
    if _populate_write:
        if _libc.madvise(aligned, start + region.nbytes - aligned, _MADV_POPULATE_WRITE) == 0:
            return True
        _populate_write = False  # EINVAL: an older kernel; touching works everywhere
    head = (-start) % page
    touched = region[head::page]
    np.add(touched, 0, out=touched)  # a write per page (plain `a[...] = a` is skipped by numpy as a no-op)
    if head:
        np.add(region[:1], 0, out=region[:1])
    return False


class _Mapping:
    """A shared read-write mapping of a whole file, unmapped once no array over it is left. Unlike
    ``mmap.mmap`` (before Python 3.13) it keeps no duplicate of the fd open for as long as a batch lives."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, fd: int, size: int, before_unmap: list[Callable[[int, int], None]]) -> None:
        address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {size} bytes failed: {os.strerror(err)}")
        self.__array_interface__ = {"data": (address, False), "shape": (size,), "typestr": "|u1", "version": 3}
        # not at interpreter exit: a daemon thread may still read a batch then; the process unmaps it anyway
        weakref.finalize(self, _unmap, address, size, before_unmap).atexit = False


def _unmap(address: int, size: int, before_unmap: list[Callable[[int, int], None]]) -> None:
    """Run the hooks (e.g. unregister the range from CUDA: that must come first), then unmap."""
    try:
        for hook in before_unmap:
            hook(address, size)
    finally:
        _libc.munmap(address, size)


def map_file(fd: int, size: int, before_unmap: list[Callable[[int, int], None]] | None = None) -> np.ndarray:
    """The whole of ``fd`` as a uint8 array; the mapping lives as long as that array or any view of it.
    ``before_unmap``: callables ``hook(address, size)`` run just before the mapping goes (the list may still
    grow after this call)."""
    return np.asarray(_Mapping(fd, size, before_unmap if before_unmap is not None else []))


class _Lease:
    """The base object of every array view of one slot: numpy resolves views to it, so it lives exactly as
    long as any of them (and the tensors over them) does."""

    __slots__ = ("__array_interface__", "_mapping", "__weakref__")

    def __init__(self, mapping: np.ndarray, offset: int, nbytes: int) -> None:
        self._mapping = mapping  # keeps the mmap alive under the views
        self.__array_interface__ = {"data": (mapping.ctypes.data + offset, False), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}


class Slab:
    """The consumer's side: owns the memfd and the slots. ``take`` runs on the io thread;
    ``_release`` runs on whatever thread drops a batch's last view, so the free list has a lock."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        page = mmap.PAGESIZE
        self.slot_bytes = min(MAX_SLOT_BYTES, -(-slot_bytes // page) * page)
        self.slots = slots
        self.token = secrets.token_hex(8)
        self._fd = os.memfd_create("ferry-slab", os.MFD_CLOEXEC)
        self._before_unmap: list[Callable[[int, int], None]] = []
        try:
            os.ftruncate(self._fd, self.slots * self.slot_bytes)
            self._mapping: np.ndarray | None = map_file(self._fd, self.slots * self.slot_bytes, self._before_unmap)
        except BaseException:
            os.close(self._fd)
            raise
        #: where the mapping starts in this process, and its length (they outlive ``close``) [Unit: byte]
        self.address, self.size = self._mapping.ctypes.data, self.slots * self.slot_bytes
        self.path = f"/proc/{os.getpid()}/fd/{self._fd}"
        self._lock = threading.Lock()
        self._free = list(range(self.slots - 1, -1, -1))

    def take(self) -> tuple[int, int] | None:
        """A free slot as ``(offset, nbytes)``, or None."""
        with self._lock:
            if not self._free:
                return None
            return self._free.pop() * self.slot_bytes, self.slot_bytes

    def take_preferring(self, preferred: Callable[[int], bool]) -> tuple[int, int] | None:
        """Like :meth:`take`, but the most recently freed slot whose index satisfies ``preferred``, if one is
        free; else the most recently freed one. ``preferred`` runs under the lock: keep it a lookup."""
        with self._lock:
            for position in range(len(self._free) - 1, -1, -1):
                if preferred(self._free[position]):
                    return self._free.pop(position) * self.slot_bytes, self.slot_bytes
            if not self._free:
                return None
            return self._free.pop() * self.slot_bytes, self.slot_bytes

    def give_back(self, slot: tuple[int, int]) -> None:
        """The producer answered without using the slot's contents (FAIL, or a batch we drop)."""
        self._release(slot[0] // self.slot_bytes)

    def region(self, slot: tuple[int, int]) -> np.ndarray:
        """A uint8 array over ``slot``: decode the batch's leaves as views of it. The slot is free again once
        this array and every view of it are gone."""
        assert self._mapping is not None, "the slab is closed"
        offset, nbytes = slot
        lease = _Lease(self._mapping, offset, nbytes)
        weakref.finalize(lease, self._release, offset // self.slot_bytes)
        return np.asarray(lease)

    def _release(self, index: int) -> None:
        with self._lock:
            self._free.append(index)

    def slot_span(self, address: int, nbytes: int) -> tuple[int, int] | None:
        """Where ``[address, address + nbytes)`` lies in the slab: ``(address of its slot, bytes from the
        slot's start to the range's end)``; None if it is not inside one slot."""
        offset = address - self.address
        if nbytes <= 0 or offset < 0 or offset + nbytes > self.size:
            return None
        start = offset - offset % self.slot_bytes
        if offset + nbytes > start + self.slot_bytes:
            return None
        return self.address + start, offset + nbytes - start

    def before_unmap(self, hook: Callable[[int, int], None]) -> None:
        """Call ``hook(address, size)`` just before the slab's memory is unmapped (after ``close`` and the
        last batch view), e.g. to unregister it from CUDA first."""
        self._before_unmap.append(hook)

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)

    def close(self) -> None:
        """Close the fd. The mapping itself goes when the last batch view does (unmapping it under a tensor
        the training loop still holds would crash)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._mapping = None


Slot = tuple[int, int]  # (offset, nbytes), as a TASK names it


def process_exists(pid: int) -> bool:
    """True while ``pid`` can still run (a zombie cannot write to memory any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class SlabMapping:
    """A producer's side: the consumer's slab, mapped from its ``/proc`` path."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self.size = os.fstat(fd).st_size
            self._mapping = map_file(fd, self.size)
        finally:
            os.close(fd)

    def writer(self, slot: tuple[int, int]) -> "SlotWriter":
        offset, nbytes = slot
        if not (0 <= offset and 0 < nbytes and offset + nbytes <= self.size and offset % SLOT_ALIGN == 0):
            raise ValueError(f"slot {list(slot)} lies outside the shared slab of {self.size} bytes")
        return SlotWriter(self._mapping[offset : offset + nbytes])


class SlotWriter:
    """Places a batch's arrays in one slot, front to back."""

    def __init__(self, region: np.ndarray) -> None:
        self.region = region
        self.used = 0
        self._base = region.ctypes.data

    def reserve(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of the slot to write into (uint8), or None if they do not fit."""
        start = -(-self.used // SLOT_ALIGN) * SLOT_ALIGN
        if start + nbytes > len(self.region):
            return None
        self.used = start + nbytes
        return self.region[start : start + nbytes]

    def offset_of(self, array: np.ndarray) -> int | None:
        """Where ``array`` (C-contiguous) lies in the slot, or None if it is not inside it."""
        start = array.__array_interface__["data"][0] - self._base
        if 0 <= start and start + array.nbytes <= len(self.region):
            return start
        return None

    def place(self, array: np.ndarray) -> int | None:
        """Offset of ``array`` in the slot, copying it there if it is elsewhere; None if it does not fit."""
        offset = self.offset_of(array)
        if offset is not None:
            return offset
        room = self.reserve(array.nbytes)
        if room is None:
            return None
        room[...] = array.reshape(-1).view(np.uint8)
        return room.ctypes.data - self._base

"""The consumer's record of which task holds which slot of the shared-memory slab (docs/ARCHITECTURE.md#shared-memory-slot-safety).

A slot is *free*, *given to a task* (lent with its TASK), *leased to a batch* (the BATCH's views hold it; the
slab frees it when the last view is gone), or *held by a lost producer*: that process may still be writing into
it, so it is reused only once the process has exited. The io thread finds which of those processes exited
(:meth:`SlotLedger.holders`, then :meth:`reclaim` with the exited ones): the ledger itself reads no clock and no
``/proc``. Without a slab it lends nothing, and every other call is a no-op.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable

import numpy as np

__all__ = ["SlotLedger"]

Slot = tuple[int, int]  # (offset, nbytes) in the slab


class SlotLedger:
    def __init__(self, slab: Any) -> None:
        self.slab = slab  # a ferry.common.shm.Slab (thread-safe itself: leases are freed from any thread), or None
        self._held: dict[int, tuple[Slot, Any]] = {}  # task id -> (slot, the identity of the producer it went to)
        self._lost: list[tuple[Slot, int]] = []  # (slot, pid) given up with a lost producer
        self._last_holder: dict[int, Any] = {}  # slot offset -> the producer it was last lent to (one per slot)

    def lend(self, task_id: int, holder: Any) -> Slot | None:
        """A free slot for ``task_id``, sent to ``holder``; None when the slab has none free (or there is no slab).

        Slot affinity: ``holder`` gets back a slot it was lent last, when one is free. A producer's first
        write into a slot costs it a page fault per 4 KiB even where another producer's write already made the
        pages (its own mapping has none of them yet): about 20-60 ms for a 150 MB batch. Without affinity every
        (producer, slot) pair paid that once, through the first three epochs; with it, each slot settles with
        one producer in epoch 0. Otherwise the most recently freed slot, which has pages already."""
        if self.slab is None:
            return None
        slot_bytes, last = self.slab.slot_bytes, self._last_holder
        slot = self.slab.take_preferring(lambda index: last.get(index * slot_bytes) == holder)
        if slot is not None:
            self._held[task_id] = (slot, holder)
            last[slot[0]] = holder
        return slot

    def take_region(self, task_id: int) -> np.ndarray | None:
        """``task_id`` answered with a batch: the region of its slot (None if it had none), no longer tracked.
        The slot is free again once that region and every view of it are gone."""
        held = self._held.pop(task_id, None)
        return None if held is None else self.slab.region(held[0])

    def give_back(self, task_id: int, holder: Any = None) -> None:
        """The slot of ``task_id`` (if it has one, and ``holder`` holds it when given) is not in use: free it now."""
        held = self._held.get(task_id)
        if held is None or (holder is not None and held[1] != holder):
            return
        del self._held[task_id]
        self.slab.give_back(held[0])

    def set_aside(self, task_ids: Iterable[int], pid: int) -> None:
        """The producer process ``pid`` was lost holding ``task_ids``: it may still be writing into their
        slots, so they are reused only once it has exited (:meth:`reclaim`)."""
        for task_id in task_ids:
            held = self._held.pop(task_id, None)
            if held is not None:
                self._lost.append((held[0], pid))

    def holders(self) -> set[int]:
        """The pids of lost producers whose slots are set aside."""
        return {pid for _, pid in self._lost}

    def reclaim(self, exited: Collection[int]) -> None:
        """Free the set-aside slots of the processes in ``exited``."""
        gone = [entry for entry in self._lost if entry[1] in exited]
        if not gone:
            return
        self._lost = [entry for entry in self._lost if entry[1] not in exited]
        for slot, _ in gone:
            self.slab.give_back(slot)

    @property
    def lost(self) -> int:
        """Slots set aside with lost producers that are still running."""
        return len(self._lost)

    @property
    def held(self) -> int:
        """Slots lent to tasks not yet answered."""
        return len(self._held)

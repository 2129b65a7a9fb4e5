"""What ``buffer_batches`` (C) becomes: every size derived from it, in one place (docs/ARCHITECTURE.md#credits).

``buffer_batches`` is one promise, *batches buffered + tasks in flight <= C at every moment*; the other sizes
make room around that promise for what it does not count:

* **credits** = C. The dispatcher issues a task only while ``in_flight + held < C``; ``held`` counts every
  batch received and not yet taken by the training loop, wherever it is: the reorder buffer, the hand-off to the
  staging thread, the staging queue (``STAGED_BATCHES``, part of C, not extra).
  (A sharded run keeps one of the C free for the shard being delivered, an iterable run for the batch the loop
  waits for: the *speculation reserve*, ``consumer/core/shards.py`` and ``streams.py``.)
* **slab slots** = C + STAGED_BATCHES + 2: a shared-memory slot stays leased while any tensor over it lives, which
  is longer than its credit: the batch the loop works on and the one before it (until the loop rebinds its
  variable), and up to STAGED_BATCHES staged by an iteration the loop abandoned (no longer counted by the new
  run's credits). With no slot free a TASK carries none, and its batch comes over the socket: never a stall.
* **receive-pool buffers** = C + STAGED_BATCHES + 4 per size: the same margin, plus the two buffers a CUDA stager
  may still hold for copies in flight. Past it a buffer is a one-off allocation, not pooled.
"""

from __future__ import annotations

from dataclasses import dataclass

from ferry.common.constants import STAGED_BATCHES

__all__ = ["Window"]


@dataclass(frozen=True)
class Window:
    credits: int
    slab_slots: int
    pool_buffers: int

    @classmethod
    def of(cls, buffer_batches: int) -> "Window":
        return cls(credits=buffer_batches, slab_slots=buffer_batches + STAGED_BATCHES + 2,
                   pool_buffers=buffer_batches + STAGED_BATCHES + 4)

"""Counters and figures of a consumer (DESIGN §9).

Each counter has one writer: the io thread counts what arrives, the training thread what it yields and how
long it waited. ``stats()`` reads them all; a read of an int is atomic in CPython, so no lock is needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Counters:
    # written by the io thread
    received: int = 0
    bytes: int = 0
    duplicates: int = 0
    stale: int = 0  # results tagged with an old session
    invalid_messages: int = 0
    skipped_samples: int = 0
    shared_batches: int = 0  # received through the shared-memory slab (local producers)
    # written by the training thread
    batches: int = 0  # yielded to the training loop
    bytes_yielded: int = 0
    wait_s: float = 0.0  # time __next__ spent waiting for a batch
    active_s: float = 0.0  # time from an epoch's first __next__ to its latest return
    epoch_wait_s: float = 0.0
    epoch_active_s: float = 0.0
    created: float = field(default_factory=time.monotonic)


def stall_fraction(wait_s: float, active_s: float) -> float:
    return wait_s / active_s if active_s > 0 else 0.0

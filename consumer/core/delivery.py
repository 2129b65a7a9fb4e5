"""What the core hands on towards the training loop: a :class:`Delivery` per seq, then :class:`EndOfRun`.

A delivery is a decoded batch (views of the received frames or of a shared-memory slot), or the error to
raise in its place. Deliveries leave the core in the order the training loop must see them; the staging
thread turns each into device tensors, the training thread yields it and gives its credit back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Delivery", "EndOfRun", "is_eof"]


@dataclass(frozen=True)
class EndOfRun:
    """The named end-of-run marker (never None). Given once per run, after the run's last item."""

    run: int


def is_eof(item: Any) -> bool:
    return isinstance(item, EndOfRun)


@dataclass
class Delivery:
    """What the core hands on for one seq: a decoded batch, or an error to raise in its place."""

    run: int
    seq: int
    tree: Any = None
    nbytes: int = 0
    error: BaseException | None = None
    skipped: bool = False  # every sample failed under on_error="skip": nothing to yield, no credit held
    frames: Any = None  # keeps the received frames alive with the views over them
    event: Any = None  # CUDA event recorded after the H2D copy, when staged to a GPU

"""The reorder buffer between the io thread and the staging thread.

The io thread ``put``s each arrived batch (or a sample error, or a "skipped" marker) under its ``seq``.
The staging thread ``get``s them: in plan order when ``in_order`` (seq ``k`` only after every seq before
it), else in arrival order. After the last seq of the run, ``get`` returns :class:`EndOfRun` once.

``held`` counts batches that were put and not yet taken by the training loop (``release``). They are
still in memory, here, in the staging queue or about to be yielded. The io thread issues a task only when
``in_flight + held < capacity``, which keeps ``buffered + in flight <= buffer_batches`` at every moment.

Every item carries the ``run`` it belongs to (one run per iteration of the loader). Items of an older run
are refused by ``put`` and ignored by ``release``, so abandoning an iteration never corrupts the count.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class EndOfRun:
    """The named end-of-run marker (never None). Given once per run, after the run's last item."""

    run: int


def is_eof(item: Any) -> bool:
    return isinstance(item, EndOfRun)


@dataclass
class Delivery:
    """What the io thread hands on for one seq: a decoded batch, or an error to raise in its place."""

    run: int
    seq: int
    tree: Any = None
    nbytes: int = 0
    error: BaseException | None = None
    skipped: bool = False  # every sample failed under on_error="skip": nothing to yield
    frames: list[Any] = field(default_factory=list)  # keeps zero-copy frames alive with the tree
    event: Any = None  # CUDA event recorded after the H2D copy, when staged to a GPU


class ReorderBuffer:
    def __init__(self, *, in_order: bool, on_release: Callable[[], None]) -> None:
        self._cond = threading.Condition()
        self._in_order = in_order
        self._on_release = on_release
        self._run = -1
        self._order: list[int] = []
        self._position = 0  # index into _order of the next seq to hand out
        self._items: dict[int, Delivery] = {}
        self._arrivals: list[int] = []  # arrival order, for in_order=False
        self._held = 0
        self._eof_given = False

    def reset(self, run: int, order: Sequence[int]) -> None:
        """Start ``run``, which delivers the seqs ``order`` (plan order). Drops what an older run left."""
        with self._cond:
            self._run, self._order, self._position = run, list(order), 0
            self._items.clear()
            self._arrivals.clear()
            self._held = 0
            self._eof_given = False
            self._cond.notify_all()

    @property
    def held(self) -> int:
        with self._cond:
            return self._held

    def put(self, item: Delivery) -> bool:
        with self._cond:
            if item.run != self._run or item.seq in self._items:
                return False
            self._items[item.seq] = item
            self._arrivals.append(item.seq)
            if not item.skipped:
                self._held += 1
            self._cond.notify_all()
            return True

    def release(self, run: int) -> None:
        """The training loop took one batch (or error) of ``run``: one more credit for the io thread."""
        with self._cond:
            if run != self._run:
                return
            self._held -= 1
        self._on_release()

    def get(self, timeout: float) -> Delivery | EndOfRun | None:
        """The next item, EndOfRun after the run's last one, or None when ``timeout`` passes first."""
        with self._cond:
            item = self._cond.wait_for(self._take, timeout)
            return item or None

    def _take(self) -> Delivery | EndOfRun | None:
        while True:
            if self._position >= len(self._order):
                if self._run < 0 or self._eof_given:
                    return None
                self._eof_given = True
                return EndOfRun(self._run)
            if self._in_order:
                seq = self._order[self._position]
                if seq not in self._items:
                    return None
            else:
                if not self._arrivals:
                    return None
                seq = self._arrivals.pop(0)
            item = self._items.pop(seq)
            if self._in_order:
                self._arrivals.remove(seq)
            self._position += 1
            if not item.skipped:
                return item

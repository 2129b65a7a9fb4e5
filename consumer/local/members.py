"""The places of a loader's local producers and what is planned for each (docs/ARCHITECTURE.md#local-mode).

A *place* is a producer index, its ``worker_id``. :class:`Members` holds which process holds each place, which
dead ones are due for replacement (:class:`~ferry.consumer.local.respawn.Replacements`), which processes were
asked to stop, and how many places there should be (``local_producers="auto"``). It decides and records; it
starts, signals and reads nothing: :class:`~ferry.consumer.local.LocalProducers` calls it under its lock and
does the process work outside it (the state-under-one-lock rule of docs/ARCHITECTURE.md#threads).
"""

from __future__ import annotations

import math

from ferry.consumer.local.children import Child
from ferry.consumer.local.respawn import Replacements

__all__ = ["Members"]


class Members:
    """See the module docstring. Not thread-safe.

    Args:
        low, high: the bounds of the count of places (equal for a fixed count).
        replacements: the replacement plans of dead producers.
    """

    def __init__(self, low: int, high: int, replacements: Replacements) -> None:
        self.low, self.high = low, high
        self.replacements = replacements
        self.children: dict[int, Child] = {}  # place -> its current process (live, or dead: replaced or not)
        self.retiring: dict[Child, float] = {}  # asked to stop -> when it is killed if it has not exited
        self.target = low  # how many places there should be
        self.closing = False  # the loader closes: no replacement, no start, exits are expected

    def current(self) -> list[Child]:
        """The process of each place, in place order."""
        return [child for _, child in sorted(self.children.items())]

    def every(self) -> list[Child]:
        """Every process to watch: the places' and those asked to stop."""
        return [*self.children.values(), *self.retiring]

    def scale_to(self, count: int) -> None:
        """Aim for ``count`` places, within the bounds."""
        self.target = min(self.high, max(self.low, count))

    def rescale(self, now: float, stop_within: float) -> tuple[list[Child], list[int]]:
        """What brings the places to the target: the processes to let go, taken out of their places (dead ones,
        whose replacement is called off, then the live ones of the highest places: those are now retiring, to
        be killed ``stop_within`` seconds from ``now`` if they have not exited), and the free places to start
        (the lowest)."""
        if self.closing:
            return [], []
        surplus = len(self.children) - self.target
        order = sorted(self.children, key=lambda index: (self.children[index].exit_code is None, -index))
        leaving = [self.children.pop(index) for index in order[:max(0, surplus)]]
        for child in leaving:
            self.replacements.done(child.index)
            self.replacements.gave_up.pop(child.index, None)
            if child.exit_code is None:
                self.retiring[child] = now + stop_within
        free = [index for index in range(self.high) if index not in self.children][:max(0, -surplus)]
        return leaving, free

    def place(self, child: Child) -> bool:
        """``child`` started in its place; False (nothing recorded) when the loader is closing: stop it."""
        if self.closing:
            return False
        self.children[child.index] = child
        return True

    def start_failed(self) -> None:
        """A start failed: aim for the places there are, until asked again."""
        self.target = len(self.children)

    def reap(self, now: float) -> tuple[list[Child], list[Child]]:
        """The retiring processes that exited (no longer tracked), and those past their time, to kill (once)."""
        exited = [child for child in self.retiring if child.exitcode() is not None]
        for child in exited:
            del self.retiring[child]
        late = [child for child, kill_at in self.retiring.items() if kill_at <= now]
        for child in late:
            self.retiring[child] = math.inf
        return exited, late

    def next_due(self) -> float:
        """When the watch thread must act next without an event: a replacement, or a kill; inf: none."""
        due = self.replacements.next_due()
        return min([math.inf if due is None else due, *self.retiring.values()])

    def polling(self) -> bool:
        """Some process has no exit sentinel: the watch thread polls exit codes."""
        return any(child.sentinel is None for child in self.every())

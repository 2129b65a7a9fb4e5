"""When a dead local producer is replaced (docs/ARCHITECTURE.md#local-mode): back-off and a bound on restarts.

:class:`RespawnBudget` is pure arithmetic over the times a producer was restarted (``now`` is passed in): the
first replacement of a producer starts after ``first_delay``, each further one within the window after twice
the one before (at most ``max_delay``), and a producer restarted ``limit`` times within the last ``window``
seconds is not restarted again. Each producer (by its index among the loader's) has its own count, so one
that keeps crashing does not stop the others from being replaced.

:class:`Replacements` holds the plans built on it: which dead producer is due for replacement and when, which
ones the bound stopped, and the rules that keep a producer dead (no producer has served the loader yet: a
start-up failure would only repeat; or it was asked to stop).
"""

from __future__ import annotations

import logging
import math
import signal
from collections import deque

__all__ = ["RespawnBudget", "Replacements", "STOPPED"]


class RespawnBudget:
    """Restarts per producer within a sliding window, and the back-off before the next one.

    Args:
        limit: restarts of one producer allowed within ``window``.
        window: the sliding window. [Unit: second]
        first_delay: the delay before a producer's first restart in the window. [Unit: second]
        max_delay: the longest delay. [Unit: second]
    """

    def __init__(self, *, limit: int, window: float, first_delay: float, max_delay: float) -> None:
        self.limit, self.window = limit, window
        self.first_delay, self.max_delay = first_delay, max_delay
        self._restarts: dict[int, deque[float]] = {}

    def restarts(self, index: int, now: float) -> int:
        """How many times producer ``index`` was restarted within the window ending ``now``."""
        times = self._restarts.setdefault(index, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return len(times)

    def next_delay(self, index: int, now: float) -> float | None:
        """Record a restart of producer ``index`` decided at ``now`` and return how long to wait before it, or
        None (nothing recorded) if it has had ``limit`` restarts within the window."""
        recent = self.restarts(index, now)
        if recent >= self.limit:
            return None
        self._restarts[index].append(now)
        return min(self.max_delay, self.first_delay * 2 ** recent)


#: Exits that mean someone asked the producer to stop (it exits 0 on SIGTERM or SIGINT, or dies of one before
#: its handlers are in place): it is not replaced.
STOPPED = (0, -signal.SIGTERM, -signal.SIGINT)


class Replacements:
    """Which dead producers are replaced, and when: the watch thread's plans, and what :meth:`check` reads of
    them. Not thread-safe: :class:`~ferry.consumer.local.LocalProducers` calls it under its lock."""

    def __init__(self, budget: RespawnBudget) -> None:
        self.budget = budget
        self._due: dict[int, float] = {}  # producer index -> when its replacement starts (inf: starting now)
        self.gave_up: dict[int, int] = {}  # producer index -> its restarts in the window when the bound stopped it

    @property
    def pending(self) -> bool:
        """Some producer is due for replacement, or being started."""
        return bool(self._due)

    def next_due(self) -> float | None:
        return min(self._due.values(), default=None)

    def plan(self, index: int, exit_code: int, *, served: bool, now: float) -> tuple[str, int]:
        """Whether and when producer ``index``, dead with ``exit_code``, is replaced: in words, with the log level
        of its death. ``served``: whether any producer has served the loader yet."""
        if exit_code in STOPPED:  # first: as the loader shuts down, none "has served" (served is turned off)
            return "it was asked to stop, so it is not respawned", logging.INFO  # (Ctrl-C reaches it too)
        if not served:
            return "no producer has served yet, so it is not respawned", logging.WARNING
        delay = self.budget.next_delay(index, now)
        if delay is None:
            self.gave_up[index] = self.budget.restarts(index, now)
            return (f"not respawned: it was restarted {self.gave_up[index]} times in the last "
                    f"{self.budget.window:g} s, the bound"), logging.ERROR
        self._due[index] = now + delay
        return f"respawning it in {delay:.2f} s", logging.WARNING

    def take_ready(self, now: float) -> list[int]:
        """The producers whose back-off has passed, marked as starting (still pending until :meth:`done`)."""
        ready = sorted(index for index, when in self._due.items() if when <= now)
        for index in ready:
            self._due[index] = math.inf
        return ready

    def done(self, index: int) -> None:
        """Producer ``index``'s replacement started (or failed to)."""
        self._due.pop(index, None)

    def clear(self) -> None:
        """No replacement from now on (the loader closes, or its watch thread is gone)."""
        self._due.clear()

    def bound_note(self) -> str:
        """For a ProducerDiedError: which producers the bound stopped, or ''."""
        return "".join(f"; producer {index} was respawned {restarts} times in the last {self.budget.window:g} s, "
                       f"the bound" for index, restarts in sorted(self.gave_up.items()))

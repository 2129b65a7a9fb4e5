"""When a dead local producer is replaced (docs/ARCHITECTURE.md#local-mode): back-off and a bound on restarts.

:class:`RespawnBudget` is pure arithmetic over the times a producer was restarted (``now`` is passed in): the
first replacement of a producer starts after ``first_delay``, each further one within the window after twice
the one before (at most ``max_delay``), and a producer restarted ``limit`` times within the last ``window``
seconds is not restarted again. Each producer (by its index among the loader's) has its own count, so one
that keeps crashing does not stop the others from being replaced.
"""

from __future__ import annotations

from collections import deque

__all__ = ["RespawnBudget"]


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

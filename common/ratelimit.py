"""A log that speaks at most a few lines per window, for warnings a broken or hostile peer can repeat.

Past ``lines`` lines in a window, calls are only counted; the first call after the window ends logs one
line saying how many were left out, then the count starts over.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from ferry.common.constants import LOG_LINES_PER_WINDOW, LOG_WINDOW_S
from ferry.common.errors import ConfigError

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """At most ``lines`` log lines per ``window_s`` seconds, then one "suppressed K" line.

    Args:
        logger: where the lines go.
        lines: lines allowed per window.
        window_s: the window. [Unit: second]
        suppressed: the line that reports the left-out calls; ``%d`` is their number.
        clock: the time source (injected by tests). [Unit: second]

    Not thread-safe: each owner calls it from one thread.
    """

    def __init__(self, logger: logging.Logger, *, lines: int = LOG_LINES_PER_WINDOW, window_s: float = LOG_WINDOW_S,
                 suppressed: str = "%d more such lines were suppressed",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if lines < 1 or window_s <= 0:
            raise ConfigError(f"RateLimitedLog needs lines >= 1 and window_s > 0, got {lines} and {window_s}")
        self._logger, self._lines, self._window_s = logger, lines, window_s
        self._suppressed_line, self._clock = suppressed, clock
        self._window_start = clock()
        self._logged = 0
        self.suppressed = 0  # calls left out in the current window

    def log(self, level: int, msg: str, *args: Any) -> bool:
        """Log ``msg % args`` unless this window's lines are spent. Returns whether it was logged."""
        now = self._clock()
        if now - self._window_start >= self._window_s:
            if self.suppressed:
                self._logger.log(level, self._suppressed_line, self.suppressed)
            self._window_start, self._logged, self.suppressed = now, 0, 0
        if self._logged < self._lines:
            self._logged += 1
            self._logger.log(level, msg, *args)
            return True
        self.suppressed += 1
        return False

    def warning(self, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, msg, *args)

"""The one rate-limited log: at most N lines per window, then one line counting what was left out."""

from __future__ import annotations

import logging

import pytest

from ferry.common.errors import ConfigError
from ferry.common.ratelimit import RateLimitedLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_at_most_n_lines_per_window_then_one_suppressed_line(caplog):
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("ferry.test"), lines=3, window_s=60.0,
                             suppressed="%d more bad things", clock=clock)
    with caplog.at_level(logging.WARNING, logger="ferry.test"):
        logged = [limited.warning("bad thing %d", i) for i in range(10)]
        assert logged == [True] * 3 + [False] * 7 and limited.suppressed == 7
        assert [r.getMessage() for r in caplog.records] == ["bad thing 0", "bad thing 1", "bad thing 2"]
        clock.now += 59.9
        assert not limited.warning("bad thing %d", 10)  # same window
        clock.now += 0.1
        assert limited.warning("bad thing %d", 11)  # a new window: the count first, then the line
    assert [r.getMessage() for r in caplog.records][3:] == ["8 more bad things", "bad thing 11"]
    assert limited.suppressed == 0


def test_no_suppressed_line_when_nothing_was_left_out(caplog):
    clock = Clock()
    limited = RateLimitedLog(logging.getLogger("ferry.test"), lines=2, window_s=1.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="ferry.test"):
        limited.log(logging.INFO, "one")
        clock.now += 5
        limited.log(logging.INFO, "two")
    assert [r.getMessage() for r in caplog.records] == ["one", "two"]


@pytest.mark.parametrize("lines, window_s", [(0, 1.0), (1, 0.0)])
def test_bad_limits_are_config_errors(lines, window_s):
    with pytest.raises(ConfigError, match="RateLimitedLog"):
        RateLimitedLog(logging.getLogger("ferry.test"), lines=lines, window_s=window_s)

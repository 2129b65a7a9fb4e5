"""How a producer process logs (``--log-format``): one line per event on stderr, in a format engines collect.

* ``plain`` (the default): ``TIME ferry-producer[PID] LEVEL message``, TIME in UTC, ISO 8601 with milliseconds
  (``2026-12-01T13:23:47.677Z``), as in the JSON lines, so that the logs of producers on several hosts and the
  trainer's line up; a traceback follows its line.
* ``json``: one JSON object a line: ``time`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``, ``message``,
  ``pid``, then the event's own fields where it has some (``event``, ``endpoint``, ``session``, ``exit_code``
  ...), and ``traceback`` (one string) for an error that has one. Python warnings become such lines too.

An event gives its fields with ``log.info(message, *args, extra=fields(event="...", ...))``; the plain format
shows only the message, which says the same in words. The command line calls :func:`configure` once; a producer
embedded with :func:`ferry.producer.serve` logs wherever its host process configured logging.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from ferry.common.constants import LOG_FORMATS

__all__ = ["LOG_FORMATS", "JsonLines", "PlainLines", "configure", "fields", "utc_time"]

#: The keys every JSON line has; an event's fields never replace them.
_CORE_KEYS = ("time", "level", "logger", "message", "pid")


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call: the event's fields, shown by the JSON format."""
    return {"fields": values}


def utc_time(record: logging.LogRecord) -> str:
    """When ``record`` was made: UTC, ISO 8601, milliseconds (``2026-12-01T13:23:47.677Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class JsonLines(logging.Formatter):
    """A log record as one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": utc_time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            entry.update({key: value for key, value in extra.items() if key not in _CORE_KEYS})
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        elif record.stack_info:
            entry["traceback"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


class PlainLines(logging.Formatter):
    """A log record as a line of text, ``TIME ferry-producer[PID] LEVEL message`` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(f"%(asctime)s ferry-producer[{os.getpid()}] %(levelname)s %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_time(record)


def configure(level: str, log_format: str) -> None:
    """Send every log record of this process to stderr at ``level``, formatted as ``log_format`` says.

    Raises:
        ValueError: ``log_format`` is not one of :data:`LOG_FORMATS`.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if log_format == "json" else PlainLines())
    logging.basicConfig(level=level, handlers=[handler])
    if log_format == "json":
        logging.captureWarnings(True)  # a warning is an event too: one JSON line, not two lines of text

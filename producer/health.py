"""What a producer tells an engine about itself: its status file (:class:`~ferry.producer.status.StatusFile`), written
by the main loop, and the answers to the probes its metrics server serves (``/livez``, ``/readyz``, ``/servingz``)
from the last turn of that loop, as the file would give them."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from ferry.producer.logs import fields
from ferry.producer.status import SERVING, STOPPING, StatusFile, judge

__all__ = ["Health"]

log = logging.getLogger("ferry.producer")

#: The figures the status file and the probes carry (the producer's ``figures()`` names).
STATUS_FIGURES = ("consumers", "links", "batches_sent")


class Health:
    """The status file at ``path`` (None: none) and the probe answers, from ``figures`` (the producer's).

    Args:
        stuck_after: what the live probe allows between two turns of the main loop. [Unit: second]
    """

    def __init__(self, path: str | None, stuck_after: float, figures: Callable[[], dict[str, Any]]) -> None:
        self.file = StatusFile(path, stuck_after)
        self._figures = figures
        self.last_turn = time.monotonic()  # when the main loop last turned (the live probe's question)

    def _status_figures(self) -> dict[str, Any]:
        figures = self._figures()
        return {name: figures[name] for name in STATUS_FIGURES}

    def write(self, state: str, now: float) -> None:
        """Write ``state`` (see :meth:`StatusFile.write`); a first failure after success is logged once."""
        failed = self.file.failed
        self.file.write(state, now, **self._status_figures())
        if self.file.failed and not failed:  # once per run of failures: the live probe will say no
            log.warning("cannot write the status file %s: %s", self.file.path, self.file.failed,
                        extra=fields(event="status_file_failed", path=self.file.path))

    def answer(self, probe: str, stopping: bool) -> tuple[bool, str]:
        """The answer to ``probe`` now (any thread may ask): yes or no, and one line saying why."""
        status = {"state": STOPPING if stopping else SERVING, "monotonic": self.last_turn,
                  "stuck_after": self.file.stuck_after, "pid": os.getpid(), **self._status_figures()}
        return judge(probe, status, time.monotonic())

    def wait_s(self) -> float:
        """The longest the main loop may poll before the file is due again. [Unit: second]"""
        return self.file.interval if self.file.path else float("inf")

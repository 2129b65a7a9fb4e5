"""A producer's status for an engine's probes: written by the main loop, judged by ``--probe``.

With ``--status-file PATH`` the producer keeps a small JSON file at PATH, replaced atomically (write, then
rename) every second (a quarter of ``--stuck-after`` if shorter). Only the main loop writes it, never a helper
thread: a loop that stopped turning leaves the file stale even while the loading threads still run. Fields:

* ``state``: ``starting`` (written by :func:`ferry.producer.serve` before it opens the dataset), ``serving``
  (the main loop runs), ``stopping`` (SIGTERM: it said BYE and is draining);
* ``monotonic``: when it was written, on the machine's monotonic clock (``time.monotonic()``, the same in every
  process of one machine, and deaf to changes of the wall clock); ``written``: the same as Unix time, for people;
* ``stuck_after``: the producer's ``--stuck-after``; ``pid``; ``consumers`` (served now), ``links`` (consumer
  connections, one per endpoint and per address a name resolves to), ``batches_sent``.

``python -m ferry.producer --probe KIND`` (same PATH, from the flag or ``FERRY_STATUS_FILE``) prints one line and
exits 0 when the answer is yes, 1 when it is no (:func:`probe_file`). It imports neither torch nor zmq:

* ``live``: the producer's process exists and its main loop turned within ``stuck_after`` seconds, or it is
  still starting (a large dataset may take minutes to open: bound that with the engine's startup probe,
  ``--probe ready``);
* ``ready``: live and serving (its dataset is open, it is not stopping);
* ``serving``: ready, and at least one consumer is being served.

The file is removed when the producer exits; one left behind by a killed producer names a process that is gone
(the probe runs where the producer runs: an exec probe in its container, with its PID namespace), so a probe
that reads it says no.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ferry.common.constants import STATUS_INTERVAL_S
from ferry.common.errors import ConfigError

__all__ = ["PROBES", "STARTING", "SERVING", "STOPPING", "StatusFile", "judge", "probe_file"]

#: What ``--probe`` can ask.
PROBES = ("live", "ready", "serving")
STARTING, SERVING, STOPPING = "starting", "serving", "stopping"


class StatusFile:
    """The status file at ``path`` (None: no file; every method then does nothing).

    Args:
        path: where to keep it, or None.
        stuck_after: what the live probe allows between two turns of the main loop. [Unit: second]
    """

    def __init__(self, path: str | None, stuck_after: float) -> None:
        self.path = path
        self.stuck_after = stuck_after
        self.interval = min(STATUS_INTERVAL_S, stuck_after / 4)  # written this often, at most. [Unit: second]
        self._last = float("-inf")  # monotonic time of the last write
        self.state: str | None = None  # the state last written
        self.failed: str | None = None  # why the last write failed, or None

    def due(self, now: float, state: str) -> bool:
        """Whether ``state`` is to be written at monotonic time ``now``: it is new, or the last write is old."""
        return self.path is not None and (state != self.state or now - self._last >= self.interval)

    def write(self, state: str, now: float, **figures: Any) -> None:
        """Replace the file with ``state`` and ``figures`` as of monotonic time ``now``.

        Raises:
            ConfigError: the file cannot be written (the first write only: see :attr:`failed` for later ones).
        """
        if self.path is None:
            return
        status = {"state": state, "monotonic": now, "written": time.time(), "stuck_after": self.stuck_after,
                  "pid": os.getpid(), **figures}
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w") as f:
                json.dump(status, f)
            os.replace(temporary, self.path)
        except OSError as exc:
            _unlink(temporary)
            if self._last == float("-inf"):
                raise ConfigError(f"cannot write the status file {self.path!r}: {exc.strerror or exc}") from None
            self.failed = f"{exc.strerror or exc}"
            return
        self._last, self.state, self.failed = now, state, None

    def remove(self) -> None:
        """Remove the file (the producer exits). Idempotent."""
        if self.path is not None and self._last != float("-inf"):
            _unlink(self.path)
            self._last, self.state = float("-inf"), None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def judge(probe: str, status: dict[str, Any], now: float) -> tuple[bool, str]:
    """The answer to ``probe`` (one of :data:`PROBES`) for ``status`` at monotonic time ``now``: yes or no, and
    one line saying why."""
    state = status.get("state")
    if not _exists(status.get("pid")):
        return False, f"not {probe}: the producer (pid {status.get('pid')}) is gone"
    age = now - float(status.get("monotonic", float("-inf")))
    stuck_after = float(status.get("stuck_after", 0))
    consumers, links = status.get("consumers", 0), status.get("links", 0)
    served = f"serving {consumers} of {links} consumer connections"
    if state == STARTING:
        return probe == "live", f"{'' if probe == 'live' else 'not '}{probe}: starting (opening its dataset)"
    if age > stuck_after:
        return False, (f"not {probe}: the producer's main loop has not turned for {age:.1f} s (stuck after "
                       f"{stuck_after:g} s)")
    if probe == "live":
        return True, f"live: main loop turned {age:.1f} s ago, {state}; {served}"
    if state != SERVING:
        return False, f"not {probe}: {state}"
    if probe == "serving" and not consumers:
        return False, f"not serving: no consumer is being served ({links} consumer connections)"
    return True, f"{probe}: {served}; main loop turned {age:.1f} s ago"


def _exists(pid: Any) -> bool:
    """Whether process ``pid`` exists (in this PID namespace: the probe runs where the producer runs)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def probe_file(probe: str, path: str | None, now: float | None = None) -> tuple[bool, str]:
    """:func:`judge` of the status file at ``path`` (see the module docstring).

    Raises:
        ConfigError: ``probe`` is not one of :data:`PROBES`, or no path is given.
    """
    if probe not in PROBES:
        raise ConfigError(f"--probe must be one of {', '.join(PROBES)}, got {probe!r}")
    if not path:
        raise ConfigError("--probe needs the producer's status file: --status-file PATH or FERRY_STATUS_FILE")
    try:
        with open(path) as f:
            status = json.load(f)
    except FileNotFoundError:
        return False, f"not {probe}: no status file at {path} (the producer is not running, or has not started)"
    except (OSError, ValueError) as exc:
        return False, f"not {probe}: cannot read the status file {path}: {exc}"
    if not isinstance(status, dict):
        return False, f"not {probe}: the status file {path} holds no status"
    return judge(probe, status, time.monotonic() if now is None else now)

"""A producer process's exit statuses, one per failure class, so that an engine (Kubernetes, Swarm, Slurm) and
its operator can tell them apart without reading the logs:

====  ==============================================================================================
0     stopped by SIGTERM or SIGINT: it said BYE (its consumers re-issue its tasks, no attempt charged)
1     an unexpected error (a bug): its traceback is logged
2     a configuration error: a flag or FERRY_* variable, an endpoint, a spec that does not resolve, a
      bad dataset argument, a CURVE key file, a missing extra, a metrics port in use
3     every consumer rejected it permanently (another dataset, length or fingerprint; another
      protocol version)
4     its dataset failed to open at start: the dataset's constructor (a missing folder, a storage
      error), its length or fingerprint, the transform, the collate class or the init hook raised
5     loads its consumers gave up on held every loading thread (or slot) for ``--exit-when-stuck``
      seconds while it served no consumer: a ``__getitem__`` that never returns (producer/core/stuck.py)
====  ==============================================================================================

2 and 3 repeat on a restart; 4 may not (a volume not mounted yet, a storage hiccup), so an engine may well
restart a producer that exited 4; 5 asks for a restart (a fresh process has fresh threads). A producer killed by
a signal it does not handle exits as the shell says (128 + the signal: 137 for SIGKILL).

:func:`exit_past_lingering_threads` ends the process with a status even where a thread of the dataset's (a sample that
loads forever, a thread it started) would keep the interpreter from exiting: a stopping producer never outlives
its drain timeout.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from ferry.common.errors import DatasetOpenError, FerryError

__all__ = ["EXIT_OK", "EXIT_CRASH", "EXIT_CONFIG", "EXIT_REJECTED", "EXIT_DATASET", "EXIT_STUCK", "EXIT_STATUSES",
           "REPEATS_ON_RESTART", "failure_status", "describe_statuses", "exit_past_lingering_threads"]

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_CONFIG = 2
EXIT_REJECTED = 3
EXIT_DATASET = 4
EXIT_STUCK = 5

#: Each status and what it means, in the order ``--help`` lists them.
EXIT_STATUSES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "stopped by SIGTERM or SIGINT; it said BYE first"),
    (EXIT_CRASH, "an unexpected error (a bug); its traceback is logged"),
    (EXIT_CONFIG, "a configuration error: a flag or variable, an endpoint, a spec that does not resolve, a bad "
                  "dataset argument, a CURVE key file, a missing extra, a metrics port in use"),
    (EXIT_REJECTED, "every consumer rejected it permanently (another dataset or protocol version)"),
    (EXIT_DATASET, "its dataset failed to open at start (its constructor, length or fingerprint, the transform, "
                   "collate class or init hook raised); may succeed on a restart"),
    (EXIT_STUCK, "loads its consumers gave up on held all its loading threads for --exit-when-stuck seconds (a "
                 "__getitem__ that never returns); restart it"),
)

#: The failures a restart repeats (the configuration; every consumer's permanent rejection): an engine's restart
#: policy leaves a producer that exited with one of them stopped (ferry.ray ends its actor for good, naming why);
#: it restarts one that exited 1, 4 or 5.
REPEATS_ON_RESTART = frozenset({EXIT_CONFIG, EXIT_REJECTED})


def failure_status(exc: BaseException) -> int:
    """The exit status of a producer whose start or run ended with ``exc``."""
    if isinstance(exc, DatasetOpenError):
        return EXIT_DATASET
    if isinstance(exc, (FerryError, ValueError)):
        return EXIT_CONFIG
    return EXIT_CRASH


def describe_statuses() -> str:
    """The ``--help`` epilog's list of exit statuses."""
    return "Exit status:\n" + "".join(f"  {code}  {meaning}\n" for code, meaning in EXIT_STATUSES)


def exit_past_lingering_threads(code: int, *, daemons: bool = False) -> int:
    """``code``, for the command line to return, where the process can end by itself. Where a thread other than
    daemons is still alive (a sample still loading after the drain timeout, a thread the dataset started), the
    interpreter would wait for it at exit: then the logs and standard streams are flushed and the process ends at
    once with ``code`` (``os._exit``), and this never returns. ``daemons``: count daemon threads too (a process
    forked from a daemon thread makes every thread of its own a daemon, and ``concurrent.futures`` joins its pools'
    at exit whatever they are)."""
    lingering = [t for t in threading.enumerate()
                 if t is not threading.current_thread() and (daemons or not t.daemon) and t.is_alive()]
    if not lingering:
        return code
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

"""A Ferry producer as a Ray actor: :func:`ferry.producer.serve` in an actor's method, stopped by another.

:class:`ProducerActor` is a plain class; :class:`~ferry.ray.RayProducers` makes it an actor
(``ray.remote(ProducerActor).options(...)``) with ``max_concurrency`` above 1, so that ``stop()``, ``where()`` and
``figures()`` are answered while ``serve()`` runs (each method on a thread of the actor's pool; no signal handler is
installed, nothing of the worker process's signals changes).

How a producer's exit statuses (:mod:`ferry.producer.exits`) meet Ray's restart policy:

====  ============================================  =============================================================
0     stopped by ``stop()`` (BYE, drain)            ``serve()`` returns 0; the manager then ends the actor
1     an unexpected error (a bug)                   the actor's process exits 1: Ray restarts the actor while its
4     its dataset failed to open                    ``max_restarts`` allow (a fresh process may well pass); the
5     stuck loads held every loading thread         pending ``serve()`` fails with ``ActorUnavailableError``
2     a configuration error                         ``serve()`` raises :class:`~ferry.common.errors.ProducerExitError`
3     every consumer rejected it permanently        naming why; the manager ends the actor for good, no restart
====  ============================================  =============================================================

A process killed outright (``ray.kill``, the OOM killer, a node lost) is Ray's to report: ``ActorDiedError`` for an
actor dead for good, ``ActorUnavailableError`` while Ray restarts it.

This module imports no torch and no consumer code: it is what runs on the cluster's workers.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Any

from ferry.common.errors import ProducerExitError
from ferry.producer import ProducerConfig, ServeHandle, serve
from ferry.producer.exits import EXIT_CRASH, EXIT_OK, EXIT_REJECTED, REPEATS_ON_RESTART, failure_status

__all__ = ["ProducerActor"]

log = logging.getLogger("ferry.producer")

#: How long ``where()`` waits for the producer to run (a large dataset may take minutes to open). [Unit: second]
WHERE_TIMEOUT_S = 3600.0
#: How often it looks. [Unit: second]
WHERE_POLL_S = 0.05


class ProducerActor:
    """Serves one loader (or several: the config's endpoints) from a Ray actor.

    Args:
        config: the producer's configuration, built and checked by the driver (its ``curve`` keys travel in it).
        dataset: a dataset object to serve (Ray passes it to the actor, pickled), or None for ``config.dataset``'s
            spec.
    """

    def __init__(self, config: ProducerConfig, dataset: Any = None) -> None:
        self.config = config
        self.dataset = dataset
        self.handle = ServeHandle()
        self._serving = threading.Lock()
        self._outcome: int | ProducerExitError | None = None

    def where(self, timeout: float = WHERE_TIMEOUT_S) -> dict[str, Any]:
        """Where its producer runs, once it runs (its dataset open, its sockets up) or ``serve()`` ended, at most
        ``timeout`` seconds [Unit: second]: ``name`` (``host:pid``, the loader's name for it), the node's address,
        the pid, and ``serving`` (False: it ended, or did not run within the time)."""
        deadline = time.monotonic() + timeout
        while self.handle.figures() is None and self._outcome is None and time.monotonic() < deadline:
            time.sleep(WHERE_POLL_S)  # the producer is built inside serve(), which says nothing when: polled
        return {"name": f"{socket.gethostname()}:{os.getpid()}", "node": _node_address(), "pid": os.getpid(),
                "serving": self.handle.figures() is not None}

    def serve(self) -> int:
        """Serve until :meth:`stop` (returns 0). Raises :class:`ProducerExitError` for a failure a restart would
        repeat; ends the process (so that Ray restarts the actor) for one a restart may cure. See the module
        docstring. One serve per actor: a second call (a caller that took a lost connection for a death) waits for
        the first and ends as it did; a restarted actor is a new instance."""
        with self._serving:
            if self._outcome is None:
                self._outcome = self._serve()
        if isinstance(self._outcome, ProducerExitError):
            raise self._outcome
        if self._outcome != EXIT_OK:
            self._exit(self._outcome)  # a restart may cure it: Ray restarts an actor whose process dies
        return self._outcome

    def _serve(self) -> int | ProducerExitError:
        try:
            code = serve(self.config, self.dataset, stop=self.handle)
        except Exception as exc:  # what the command line reports and exits with (producer/cli.py)
            code = failure_status(exc)
            log.error("ferry producer actor: %s: %s (exit status %d)", type(exc).__name__, exc, code,
                      exc_info=code == EXIT_CRASH)  # a traceback for a bug, one line for the rest, as the CLI
            return ProducerExitError(f"{type(exc).__name__}: {exc}", code) if code in REPEATS_ON_RESTART else code
        if code == EXIT_REJECTED:
            return ProducerExitError("every consumer rejected this producer permanently (another dataset, length or "
                                     "fingerprint, or protocol version; its log says which)", code)
        return code

    def stop(self) -> None:
        """Stop serving as SIGTERM would (BYE, drain): the pending ``serve()`` returns 0. Before ``serve()`` ran:
        it returns 0 as soon as it has built its producer."""
        self.handle.set()

    def figures(self) -> dict[str, Any] | None:
        """The producer's figures while it serves (its metrics: batches sent, and ``pool_demand``, the demand its
        consumers report in their PINGs), else None."""
        return self.handle.figures()

    @staticmethod
    def _exit(code: int) -> None:
        """End this process with ``code`` at once (its logs flushed): whatever threads a stuck dataset holds."""
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(code)


def _node_address() -> str:
    """The address Ray knows this node by; "" outside Ray (the class used as a plain object)."""
    try:
        import ray
    except ImportError:
        return ""
    return ray.util.get_node_ip_address()

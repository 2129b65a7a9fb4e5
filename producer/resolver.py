"""Whether a producer's consumer endpoints resolve, checked off the main loop (a DNS lookup may take seconds).

:class:`AddressResolver` runs the lookups on one daemon thread, ``ferry-resolve``, so that a lookup hanging
in the resolver never delays the producer's exit. The main loop asks with :meth:`AddressResolver.check`,
is woken by the waker when an answer is in, and collects the answers with :meth:`AddressResolver.results`;
each is the problem in words (a DNS failure) or None, for the connection to report
(:meth:`ferry.producer.connection.Connection.address_checked`).
"""

from __future__ import annotations

import queue
import socket as pysocket
import threading
from typing import Iterator

from ferry.common.waker import Waker


class AddressResolver:
    """Looks up endpoint hosts on a daemon thread; answers come back through a queue and wake the loop."""

    def __init__(self, waker: Waker) -> None:
        self._waker = waker  # owned by the producer
        self._to_resolve: queue.SimpleQueue[tuple[int, str] | None] = queue.SimpleQueue()
        self._resolved: queue.SimpleQueue[tuple[int, str | None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="ferry-resolve", daemon=True)

    def check(self, key: int, endpoint: str) -> None:
        """Look up the host of ``endpoint`` (the link ``key``'s); nothing for ipc:// or a wildcard."""
        host = endpoint_host(endpoint)
        if host is None:
            return
        if not self._thread.is_alive():
            self._thread.start()
        self._to_resolve.put((key, host))

    def results(self) -> Iterator[tuple[int, str | None]]:
        """``(key, problem)`` for each lookup finished since the last call, without waiting."""
        while True:
            try:
                yield self._resolved.get_nowait()
            except queue.Empty:
                return

    def close(self) -> None:
        """The thread ends after the lookup in progress, if any (not waited for)."""
        self._to_resolve.put(None)

    def _loop(self) -> None:
        while (job := self._to_resolve.get()) is not None:
            key, host = job
            self._resolved.put((key, resolve_problem(host)))
            self._waker.wake()


def endpoint_host(endpoint: str) -> str | None:
    """The host name of a ``tcp://[source;]host:port`` endpoint, or None (ipc://, a wildcard)."""
    if not endpoint.startswith("tcp://"):
        return None
    address = endpoint[len("tcp://"):].rpartition(";")[2]
    host = address.rpartition(":")[0].strip("[]")
    return host if host and host != "*" else None


def resolve_problem(host: str) -> str | None:
    """Why ``host`` does not resolve (a DNS failure, in words), or None if it does (or the check itself failed)."""
    try:
        pysocket.getaddrinfo(host, None)
    except pysocket.gaierror as exc:
        return f"its host {host!r} does not resolve (DNS: {exc.strerror or exc})"
    except (OSError, UnicodeError):
        return None
    return None

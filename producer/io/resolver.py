"""DNS off the producer's main loop (a lookup may take seconds): what its endpoints' names resolve to.

:class:`AddressResolver` runs the lookups on one daemon thread, ``ferry-resolve``, so that a lookup hanging
in the resolver never delays the producer's exit. The main loop asks, is woken by the waker when an answer is
in, and collects the answers with :meth:`AddressResolver.results`. Two kinds of question:

* :meth:`~AddressResolver.check`: does the host of one connection's endpoint resolve? The answer
  (:class:`Checked`) is the problem in words (a DNS failure) or None, for the connection to report in its
  warnings (:meth:`ferry.producer.core.connection.Connection.address_checked`);
* :meth:`~AddressResolver.lookup`: every IPv4 address of a name (:class:`Looked`), for
  :class:`ferry.producer.core.discovery.Discovery`. IPv4 only, as ZeroMQ connects without its IPV6 option.
"""

from __future__ import annotations

import queue
import socket as pysocket
import threading
from dataclasses import dataclass
from typing import Iterator, Union

from ferry.common.waker import Waker

__all__ = ["AddressResolver", "Checked", "Looked", "endpoint_host", "resolve_problem", "ipv4_addresses"]


@dataclass(frozen=True)
class Checked:
    """Whether the host of link ``key``'s endpoint resolves: ``problem`` None, else why not."""

    key: int
    problem: str | None


@dataclass(frozen=True)
class Looked:
    """The IPv4 addresses of ``host``: a tuple (empty: the name does not exist, or has none), or None when the
    lookup failed without an answer; ``problem``: why there is none, in words."""

    host: str
    addresses: tuple[str, ...] | None
    problem: str | None


Answer = Union[Checked, Looked]


class AddressResolver:
    """Looks up host names on a daemon thread; answers come back through a queue and wake the loop."""

    def __init__(self, waker: Waker) -> None:
        self._waker = waker  # owned by the producer
        self._to_resolve: queue.SimpleQueue[tuple[int, str] | str | None] = queue.SimpleQueue()
        self._resolved: queue.SimpleQueue[Answer] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="ferry-resolve", daemon=True)

    def check(self, key: int, endpoint: str) -> None:
        """Look up the host of ``endpoint`` (the link ``key``'s); nothing for ipc:// or a wildcard."""
        host = endpoint_host(endpoint)
        if host is not None:
            self._ask((key, host))

    def lookup(self, host: str) -> None:
        """Find every IPv4 address of ``host``."""
        self._ask(host)

    def results(self) -> Iterator[Answer]:
        """Each answer finished since the last call, without waiting."""
        while True:
            try:
                yield self._resolved.get_nowait()
            except queue.Empty:
                return

    def close(self) -> None:
        """The thread ends after the lookup in progress, if any (not waited for)."""
        self._to_resolve.put(None)

    def _ask(self, job: tuple[int, str] | str) -> None:
        if not self._thread.is_alive():
            self._thread.start()
        self._to_resolve.put(job)

    def _loop(self) -> None:
        while (job := self._to_resolve.get()) is not None:
            if isinstance(job, str):
                addresses, problem = ipv4_addresses(job)
                self._resolved.put(Looked(job, addresses, problem))
            else:
                self._resolved.put(Checked(job[0], resolve_problem(job[1])))
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
        return _dns_problem(host, exc)
    except (OSError, UnicodeError):
        return None
    return None


#: getaddrinfo's answers that the name does not exist or has no address of the family: answers, not failures.
_NO_SUCH_NAME = {getattr(pysocket, name) for name in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY")
                 if hasattr(pysocket, name)}


def ipv4_addresses(host: str) -> tuple[tuple[str, ...] | None, str | None]:
    """``host``'s IPv4 addresses (sorted, each once) and None; ``()`` and the reason when the name does not exist
    or has none; None and the reason when the lookup failed without an answer (no DNS server, a timeout)."""
    try:
        infos = pysocket.getaddrinfo(host, None, pysocket.AF_INET, pysocket.SOCK_STREAM)
    except pysocket.gaierror as exc:
        return (() if exc.errno in _NO_SUCH_NAME else None), _dns_problem(host, exc)
    except (OSError, UnicodeError) as exc:
        return None, f"its host {host!r} cannot be looked up ({exc})"
    return tuple(sorted({info[4][0] for info in infos})), None


def _dns_problem(host: str, exc: pysocket.gaierror) -> str:
    return f"its host {host!r} does not resolve (DNS: {exc.strerror or exc})"

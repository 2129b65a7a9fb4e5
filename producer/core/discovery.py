"""Which consumer connections a producer should hold, as a pure state machine: the ``--connect`` endpoints, with
every host name resolved to its addresses and kept fresh. Events in, actions out; no sockets, no clock, no DNS
(the loop resolves off itself, :mod:`ferry.producer.io.resolver`), tested without any (tests/test_discovery_units.py).

An endpoint whose host is a name (``tcp://trainers:5555``) gets one connection per IPv4 address the name resolves
to (``tcp://10.0.0.7:5555``), each its own consumer connection, as several ``--connect`` would be: a Kubernetes
headless Service, a Swarm ``dnsrr`` service, or any name with several A records reaches every trainer behind it.
The name is resolved at start and again every ``interval`` seconds (``--resolve-interval``): an address that
appears gets a connection (the consumer behind it a HELLO), one that is gone has its connection closed (with a
BYE if it served), without a restart. A name with one address behaves as one endpoint always did.

* An answer that the name does not exist, or has no IPv4 address, is an answer: the name then has no address,
  and its connections close. A failed lookup (no DNS server, a timeout) is no answer: what the name had stays.
* While a name has no address, nothing can answer there, so the machine itself warns with the back-off of
  :func:`ferry.producer.core.connection.warning_due` (after w, 3w, 6w, then every 30w), naming the DNS failure.
* An address two endpoints share (two names of one host) is one connection, closed once neither wants it.
* A connection to an address a name resolved to says HELLO as the producer's id and ``/ADDRESS``: two addresses
  of one consumer (a multi-homed host, a load balancer's) are then two producers to it, where one id would have
  each HELLO of one connection drop the other's work.
* Endpoints whose host is an address, ``ipc://`` endpoints, and every endpoint with ``interval`` 0, are fixed:
  one connection each, for good (ZeroMQ resolves a name itself then, to one address).

Events: :meth:`Discovery.start`, :meth:`~Discovery.tick` (time passes), :meth:`~Discovery.resolved` (a lookup's
answer). Actions: :class:`Resolve`, :class:`OpenLink`, :class:`CloseLink`, :class:`~ferry.producer.core.actions.Log`.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Union

from ferry.common.constants import MAX_ADDRESSES_PER_NAME
from ferry.common.endpoints import parse_endpoint

from ferry.producer.core.actions import Log
from ferry.producer.core.connection import warning_due

__all__ = ["Discovery", "Resolve", "OpenLink", "CloseLink", "DiscoveryAction", "named_host"]


@dataclass(frozen=True)
class Resolve:
    """Look up ``host``'s IPv4 addresses off the loop; report with :meth:`Discovery.resolved`."""

    host: str


@dataclass(frozen=True)
class OpenLink:
    """Open a consumer connection to ``url``; ``label`` names it in log lines; ``address``: the address a name
    resolved to, "" for an endpoint as given."""

    url: str
    label: str
    address: str = ""


@dataclass(frozen=True)
class CloseLink:
    """Close the consumer connection to ``url`` (BYE first if it serves); ``why`` in words."""

    url: str
    why: str


DiscoveryAction = Union[Resolve, OpenLink, CloseLink, Log]


@dataclass(frozen=True)
class _Target:
    endpoint: str  # as configured, one port: tcp://[SOURCE;]NAME:PORT
    prefix: str  # tcp:// or tcp://SOURCE;
    port: int


@dataclass
class _Name:
    host: str
    targets: list[_Target]
    addresses: tuple[str, ...] = ()
    due: float = 0.0  # when to resolve next
    in_flight: bool = False
    answered: bool = False  # some lookup gave an answer (not a failure)
    empty_since: float = 0.0  # since when it has had no address
    warnings: int = 0  # "no consumer" warnings given since then
    problem: str | None = None  # the last lookup's failure, in words


class Discovery:
    """The consumer connections that the endpoints call for (see the module docstring).

    Args:
        endpoints: the producer's endpoints, port ranges expanded (``ProducerConfig.endpoints``).
        interval: seconds between two lookups of a name; 0: names are not resolved here. [Unit: second]
        warning_s: the first "no consumer has answered" warning of a name without addresses. [Unit: second]
        now: the clock at creation. [Unit: second]
    """

    def __init__(self, endpoints: tuple[str, ...], *, interval: float, warning_s: float, now: float) -> None:
        self.interval, self.warning_s = interval, warning_s
        self.fixed: list[str] = []
        self.names: dict[str, _Name] = {}
        for endpoint in endpoints:
            host = named_host(endpoint) if interval > 0 else None
            if host is None:
                self.fixed.append(endpoint)
                continue
            parsed = parse_endpoint(endpoint)
            prefix = endpoint[: endpoint.index("://") + 3] + (parsed.host.rpartition(";")[0] + ";" if ";" in parsed.host
                                                              else "")
            name = self.names.setdefault(host, _Name(host, [], due=now, empty_since=now))
            name.targets.append(_Target(endpoint, prefix, parsed.port))
        self._owners: dict[str, set[str]] = {}  # url -> the names (or fixed endpoints) that want it

    @property
    def unresolved(self) -> bool:
        """Some name has no address now (a consumer may still appear there)."""
        return any(not name.addresses for name in self.names.values())

    # --- events -----------------------------------------------------------------------------------------
    def start(self) -> list[DiscoveryAction]:
        """The fixed endpoints' connections, and the first lookup of every name."""
        actions: list[DiscoveryAction] = []
        for endpoint in self.fixed:
            actions += self._want(endpoint, OpenLink(endpoint, endpoint))
        for name in self.names.values():
            name.in_flight = True
            actions.append(Resolve(name.host))
        return actions

    def tick(self, now: float) -> list[DiscoveryAction]:
        """Time passes: the lookups due, and a warning for each name that has had no address for long."""
        actions: list[DiscoveryAction] = []
        for name in self.names.values():
            if not name.in_flight and now >= name.due:
                name.in_flight = True
                actions.append(Resolve(name.host))
            waited = now - name.empty_since
            if not name.addresses and waited > warning_due(self.warning_s, name.warnings):
                name.warnings += 1
                endpoints = ", ".join(t.endpoint for t in name.targets)
                why = name.problem or f"its host {name.host!r} resolves to no IPv4 address"
                actions.append(Log(logging.WARNING, f"no consumer has answered at {endpoints} for {waited:.0f} s; "
                                                    f"{why}; still trying (next warning after "
                                                    f"{warning_due(self.warning_s, name.warnings):.0f} s)",
                                   {"event": "unreachable", "endpoint": endpoints, "waited_s": round(waited, 1)}))
        return actions

    def resolved(self, host: str, addresses: tuple[str, ...] | None, problem: str | None,
                 now: float) -> list[DiscoveryAction]:
        """A lookup of ``host`` finished: its IPv4 addresses (empty: the name does not exist or has none), or None
        when the lookup failed without an answer; ``problem``: why it has none, in words."""
        name = self.names.get(host)
        if name is None:
            return []
        name.in_flight, name.due, name.problem = False, now + self.interval, problem
        if addresses is None:
            level = logging.WARNING if name.addresses else logging.DEBUG
            return [Log(level, f"cannot look up {host!r} again ({problem}); keeping its "
                               f"{len(name.addresses)} consumer connections", {"event": "lookup_failed", "host": host})]
        found = tuple(sorted(set(addresses)))
        actions: list[DiscoveryAction] = []
        if len(found) > MAX_ADDRESSES_PER_NAME:
            actions.append(Log(logging.WARNING, f"{host!r} resolves to {len(found)} addresses; connecting to the "
                                                f"first {MAX_ADDRESSES_PER_NAME} only", {"event": "too_many_addresses",
                                                                                        "host": host}))
            found = found[:MAX_ADDRESSES_PER_NAME]
        if found == name.addresses and name.answered:
            return actions
        added, gone = sorted(set(found) - set(name.addresses)), sorted(set(name.addresses) - set(found))
        if name.addresses and not found:  # the last address went: warn afresh from now
            name.empty_since, name.warnings = now, 0
        name.addresses, name.answered = found, True
        changes = "; ".join(f"{what} {', '.join(which)}" for what, which in (("joining", added), ("leaving", gone))
                            if which)
        actions.append(Log(logging.INFO, f"{host!r} resolves to {', '.join(found) if found else 'no address'} "
                                         f"({problem or f'{len(found)} consumer connections'}"
                                         f"{'; ' + changes if changes else ''})",
                           {"event": "resolved", "host": host, "addresses": list(found), "added": added,
                            "removed": gone}))
        for address in gone:
            actions += self._unwant(name, address, f"{host!r} no longer resolves to {address}")
        for address in added:
            for target in name.targets:
                url = f"{target.prefix}{address}:{target.port}"
                actions += self._want(host, OpenLink(url, f"{url} ({host})", address))
        return actions

    def wait_s(self, now: float) -> float:
        """Seconds until the next lookup is due (the loop polls no longer than that); inf without names."""
        waits = [name.due - now for name in self.names.values() if not name.in_flight]
        return max(0.0, min(waits, default=float("inf")))

    # --- who wants which connection --------------------------------------------------------------------
    def _want(self, owner: str, link: OpenLink) -> list[DiscoveryAction]:
        owners = self._owners.setdefault(link.url, set())
        first = not owners
        owners.add(owner)
        return [link] if first else []

    def _unwant(self, name: _Name, address: str, why: str) -> list[DiscoveryAction]:
        actions: list[DiscoveryAction] = []
        for target in name.targets:
            url = f"{target.prefix}{address}:{target.port}"
            owners = self._owners.get(url, set())
            owners.discard(name.host)
            if not owners:
                self._owners.pop(url, None)
                actions.append(CloseLink(url, why))
        return actions


def named_host(endpoint: str) -> str | None:
    """The host name of a ``tcp://[SOURCE;]NAME:PORT`` endpoint; None for an address, a wildcard or ``ipc://``."""
    if not endpoint.startswith("tcp://"):
        return None
    host = parse_endpoint(endpoint).host.rpartition(";")[2].strip("[]")
    if not host or host == "*":
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host
    return None

"""Every consumer connection of a producer (:class:`~ferry.producer.io.links.Link`), opened and closed as
:class:`~ferry.producer.core.discovery.Discovery` decides, with the DNS lookups both need (:mod:`ferry.producer.io.resolver`,
off the loop). Only the producer's main loop (:mod:`ferry.producer.io.service`) uses a LinkSet.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Callable, Iterator

import zmq

from ferry.common.constants import MAX_ADDRESSES_PER_NAME, PRODUCER_BYE_LINGER_MS
from ferry.common.waker import Waker

from ferry.producer.core.actions import Log
from ferry.producer.loading.compressing import LinkCodec
from ferry.producer.config import ProducerConfig
from ferry.producer.core.connection import Connection
from ferry.producer.core.discovery import CloseLink, Discovery, DiscoveryAction, OpenLink, Resolve
from ferry.producer.io.links import Link
from ferry.producer.logs import fields
from ferry.producer.io.resolver import AddressResolver, Checked

__all__ = ["LinkSet"]

log = logging.getLogger("ferry.producer")


class LinkSet:
    """The links by key, each registered with the loop's ``poller``.

    Args:
        config: the producer's (endpoints, heartbeat, liveness, warnings, compression, CURVE, resolve interval).
        say_bye: the loop's way to stop one link's connection (it applies ``link.conn.stop()``: BYE if serving).
        bind: called with each new link and True (the loop binds it to its producer's own dataset, producer/loading/pool.py),
            and with each closed one and False.
    """

    def __init__(self, config: ProducerConfig, *, ctx: zmq.Context, poller: zmq.Poller,
                 waker: Waker, say_bye: Callable[[Link], None], bind: Callable[[Link, bool], None]) -> None:
        self._config, self._bind = config, bind
        self._ctx, self._poller, self._say_bye = ctx, poller, say_bye
        self._links: dict[int, Link] = {}
        self._by_url: dict[str, Link] = {}
        self._keys = itertools.count()
        self.discovery = Discovery(config.endpoints, interval=config.resolve_interval,
                                   warning_s=config.unreachable_warning_s, now=time.monotonic())
        self.resolver = AddressResolver(waker)

    def __iter__(self) -> Iterator[Link]:
        return iter(self._links.values())

    def __len__(self) -> int:
        return len(self._links)

    def get(self, key: int) -> Link | None:
        """The link ``key``; None once it is closed (its outcomes still to come are dropped)."""
        return self._links.get(key)

    @property
    def capacity(self) -> int:
        """The most connections there may be at once: one per fixed endpoint, MAX_ADDRESSES_PER_NAME per named one."""
        names = self.discovery.names.values()
        return len(self.discovery.fixed) + sum(len(name.targets) for name in names) * MAX_ADDRESSES_PER_NAME

    @property
    def complete(self) -> bool:
        """Every endpoint has its connections: no name waits for an address (where a consumer may yet appear)."""
        return bool(self._links) and not self.discovery.unresolved

    # --- events ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """The fixed endpoints' connections, and the first lookup of each name."""
        self._apply(self.discovery.start())

    def tick(self, now: float) -> None:
        self._apply(self.discovery.tick(now))

    def answers(self) -> None:
        """Apply the lookups finished since the last call."""
        for answer in self.resolver.results():
            if isinstance(answer, Checked):
                link = self._links.get(answer.key)
                if link is not None:
                    link.conn.address_checked(answer.problem)
            else:
                self._apply(self.discovery.resolved(answer.host, answer.addresses, answer.problem, time.monotonic()))

    def check(self, link: Link) -> None:
        """Resolve ``link``'s host again (its connection's warning will say whether it resolves)."""
        self.resolver.check(link.key, link.endpoint)

    def close(self) -> None:
        """Close every socket (with a bounded linger where a BYE was queued) and stop the resolver thread."""
        for link in self._links.values():
            link.close(linger=PRODUCER_BYE_LINGER_MS if link.said_bye else 0)  # let a BYE leave, bounded
        self.resolver.close()  # ends after the lookup in progress, if any (not waited for)

    # --- applying discovery's decisions --------------------------------------------------------------------
    def _apply(self, actions: list[DiscoveryAction]) -> None:
        for action in actions:
            if isinstance(action, Resolve):
                self.resolver.lookup(action.host)
            elif isinstance(action, OpenLink):
                self._open(action.url, action.label, f"/{action.address}" if action.address else "")
            elif isinstance(action, CloseLink):
                self._close(action.url, action.why)
            elif isinstance(action, Log):
                log.log(action.level, "%s", action.message, extra=fields(**action.fields))

    def _open(self, url: str, label: str, id_suffix: str) -> None:
        cfg = self._config
        conn = Connection(label, now=time.monotonic(), heartbeat=cfg.heartbeat, liveness=cfg.liveness,
                          unreachable_warning_s=cfg.unreachable_warning_s, dataset_len=0)
        link = Link(key=next(self._keys), endpoint=url, conn=conn, ctx=self._ctx, poller=self._poller,
                    give_up_after=cfg.heartbeat * cfg.liveness,
                    compression=LinkCodec(label, cfg.compression), curve=cfg.curve, id_suffix=id_suffix)
        self._bind(link, True)  # its dataset, and the bound on its TASKs' indices
        link.open()
        link.register()
        self._links[link.key] = link
        self._by_url[url] = link
        self.check(link)  # known before the first "no consumer answers" warning

    def _close(self, url: str, why: str) -> None:
        """A connection that discovery no longer wants: BYE if it serves, then its socket goes."""
        link = self._by_url.pop(url, None)
        if link is None:
            return
        self._say_bye(link)
        log.info("closing the connection to %s: %s", link.conn.endpoint, why,
                 extra=fields(event="link_closed", endpoint=link.conn.endpoint, said_bye=link.said_bye))
        link.unregister()
        link.close(linger=PRODUCER_BYE_LINGER_MS if link.said_bye else 0)
        del self._links[link.key]
        self._bind(link, False)

    def describe(self) -> dict[str, Any]:
        """How many connections there are and how many serve (for figures and the status)."""
        links = list(self._links.values())
        return {"consumers": sum(1 for link in links if link.conn.serving), "links": len(links)}

"""Greeting: what the core answers a HELLO, and a message from a peer it has not registered.

A HELLO is admitted, rejected for good, or (a pool producer not serving our dataset yet) answered with a WELCOME
naming the dataset; an admitted producer's WELCOME says whether it may pickle values (only a same-user ipc peer:
the trainer's own local producers). A local producer asked to stop is never admitted again. A stranger's late
result is counted as a duplicate (this session) or stale (another), and it is told to say HELLO at most once a
heartbeat. Invalid messages are logged once per peer and at most a burst a minute (:class:`.admission.BadPeers`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Callable

from ferry.common import protocol
from ferry.common.constants import DEFAULT_FRAME_BYTES, MAX_TRACKED_PEERS
from ferry.common.errors import ProtocolError
from ferry.common.pool import named_dataset

from ferry.consumer.core.actions import Action, Log, Send
from ferry.consumer.core.admission import BadPeers, Loss, Peers, same_user_ipc
from ferry.consumer.core.compression import is_local_address
from ferry.consumer.figures.counters import Counters

__all__ = ["Greeting"]

_INFO, _WARNING, _ERROR = logging.INFO, logging.WARNING, logging.ERROR


class Greeting:
    """The core's answers to HELLOs and strangers. ``config``: the core's :class:`~.consumer.CoreConfig`."""

    def __init__(self, config: Any, *, session: int, peers: Peers, counters: Counters,
                 describe: Callable[[bytes], str]) -> None:
        self.config, self.session, self.peers, self.counters = config, session, peers, counters
        self.bad_peers = BadPeers(describe)
        self.sharded = False  # an admitted producer serves a sharded dataset (HELLO dataset.sharded)
        self._leaving: OrderedDict[str, None] = OrderedDict()  # local producers asked to stop (host:pid)

    def leaving(self, name: str) -> None:
        """The local producer ``name`` (host:pid) is asked to stop: never admit it again (told to say HELLO, it
        would be, and then lost as unreachable once its socket closed)."""
        self._leaving[name] = None
        while len(self._leaving) > MAX_TRACKED_PEERS:
            self._leaving.popitem(last=False)

    def hello(self, peer: bytes, header: dict[str, Any], now: float, address: str) -> tuple[list[Action], list[Loss]]:
        """The answer to a HELLO from ``peer`` (``address`` as ZeroMQ reports it), and the registrations it
        replaced (losses for the core to settle)."""
        out: list[Action] = []
        if f"{header['host']}:{header['pid']}" in self._leaving:  # asked to stop: it is on its way out
            return [self._send(peer, protocol.REJECT, reason="asked to stop: fewer producers needed",
                               permanent=True)], []
        admission = self.peers.admit(peer, header, now)
        c = self.config
        if admission.reject is not None:
            out.append(Log(_ERROR if admission.refused else _WARNING,
                           f"rejected producer {admission.name}: {admission.reject}"))
            out.append(self._send(peer, protocol.REJECT, reason=admission.reject, permanent=True))
            return out, []
        if admission.naming:  # a pool: it opens our dataset and says HELLO again announcing it (common/pool.py)
            assert c.dataset_spec is not None
            out.append(Log(_INFO, f"naming dataset {c.dataset_spec!r} to pool producer {admission.name}"))
            out.append(self._welcome(peer, header, dataset=named_dataset(c.dataset_spec, c.dataset_args)))
            return out, []
        if header["dataset"].get("sharded") is True:
            self.sharded = True
        if admission.adopted:
            out.append(Log(_INFO, f"producer {admission.name} set the dataset: {admission.adopted}"))
        if admission.warning:
            out.append(Log(_WARNING, admission.warning))
        if admission.joined is not None:
            joined = admission.joined
            ahead = f", {joined.ahead} ahead" if joined.ahead else ""
            out.append(Log(_INFO, f"producer {admission.name} joined ({joined.slots} slots{ahead}); "
                                  f"{admission.live} live"))
        info = self.peers.dispatcher.producers.get(peer)
        if info is not None:  # admitted (perhaps reconnected from elsewhere): is its link local?
            info.remote = not info.shared and not is_local_address(address)
            info.pickle_ok = same_user_ipc(address)
        out.append(self._welcome(peer, header, **({"weight": c.weight} if c.weight != 1.0 else {}),
                                 **({"pickle": True} if info is not None and info.pickle_ok else {})))
        return out, list(admission.losses)

    def stranger(self, peer: bytes, header: dict[str, Any], now: float) -> list[Action]:
        """A message from a peer that is not (or no longer) registered.

        Raises:
            ProtocolError: a message only a registered producer may send (not a result, PING or BYE).
        """
        kind = header["type"]
        if kind in (protocol.BATCH, protocol.FAIL):
            if header["session"] == self.session:
                self.counters.duplicates += 1  # the result of a task already re-issued
            else:
                self.counters.stale += 1
        elif kind not in (protocol.PING, protocol.BYE):
            raise ProtocolError(f"{kind} from an unregistered peer")
        if kind != protocol.BYE and self.bad_peers.reject_due(peer, now, self.config.heartbeat):
            return [self._send(peer, protocol.REJECT, reason="unknown producer: say HELLO", permanent=False)]
        return []

    def invalid(self, peer: bytes, reason: str, now: float) -> list[Action]:
        """An invalid message from ``peer``: counted, and logged as :class:`BadPeers` allows."""
        self.counters.invalid_messages += 1
        return [Log(_WARNING, line) for line in self.bad_peers.invalid(peer, reason, now)]

    def _welcome(self, peer: bytes, header: dict[str, Any], **fields: Any) -> Send:
        c = self.config
        return self._send(peer, protocol.WELCOME, session=self.session, heartbeat=c.heartbeat, nonce=header["nonce"],
                          codecs=list(c.codecs), frame_bytes=DEFAULT_FRAME_BYTES, max_batch_bytes=c.max_batch_bytes,
                          **fields)

    @staticmethod
    def _send(peer: bytes, kind: str, **fields: Any) -> Send:
        return Send(peer, [protocol.pack(kind, **fields)])

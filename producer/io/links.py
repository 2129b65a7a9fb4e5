"""One consumer connection of a producer: its DEALER socket (and, with CURVE, that socket's monitor) and the
state machine of its connection. Only the producer's main loop (:mod:`ferry.producer.io.service`) touches a Link.

A Link registers its sockets with the loop's poller itself, so that a rebuilt socket (a fresh one after a
protocol error, or after a consumer denied our CURVE key) replaces the old one there too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import zmq

from ferry.common.constants import (
    DEFAULT_FRAME_BYTES, MAX_FRAME_BYTES, MAX_HEADER_BYTES, MIN_FRAME_BYTES, RECEIVE_BURST, RECONNECT_IVL_MAX_MS,
    RECONNECT_IVL_MS, SOCKET_HWM,
)
from ferry.common.deadlinks import give_up_dead_links
from ferry.common.errors import ConfigError

from ferry.producer.loading.compressing import LinkCodec
from ferry.producer.core.connection import Connection

__all__ = ["Link", "announced_frame_bytes"]


@dataclass
class Link:
    """One consumer endpoint: the socket (owned by the loop) and the state machine of its connection."""

    key: int
    endpoint: str
    conn: Connection
    compression: LinkCodec  # the codec of each task's batch on this connection
    ctx: zmq.Context
    poller: zmq.Poller
    #: the producer's own liveness window (--heartbeat x --liveness): a TCP connection whose data goes unacknowledged
    #: this long is given up, and ZeroMQ makes a fresh one (common/deadlinks.py). [Unit: second]
    give_up_after: float
    curve: Any = None  # the producer's CurveClient, or None
    sock: zmq.Socket | None = None
    monitor: zmq.Socket | None = None  # with CURVE: ``sock``'s event socket, which reports a denied key
    said_bye: bool = False
    frame_bytes: int = DEFAULT_FRAME_BYTES  # leaves up to this travel as one frame: what its WELCOME announced
    max_batch_bytes: int | None = None  # the largest batch its consumer accepts (WELCOME); None: not announced
    pickle_ok: bool = False  # its consumer's WELCOME allows pickled values (we are one of its local producers)
    watching_out: bool = False  # the poller watches ``sock`` for POLLOUT too (see watch_writable)
    #: what follows the producer's id in this connection's HELLO: "" for an endpoint, "/ADDRESS" for an address a
    #: name resolved to, so that two addresses of one consumer (a multi-homed host, a load balancer) are two
    #: producers to it, not one that restarts its work at each HELLO of the other
    id_suffix: str = ""
    #: the dataset this connection serves (a producer/loading/pool.py Served): its producer's own until its consumer names
    #: another; None: none (a pool without --dataset)
    served: Any = None
    hello_extra: dict = field(default_factory=dict)  # what its HELLO says of its dataset: "dataset", or "refused"
    opening: str | None = None  # the key of the dataset its consumer named, while it opens (producer/loading/pool.py)
    weight: float = 1.0  # its consumer's share against the others' (its WELCOME's; producer/core/fairshare.py)
    load: dict = field(default_factory=dict)  # its consumer's last PING load: its demand and stall (sharing.py)

    def open(self) -> None:
        """Make the socket (and its monitor) and connect it. Not yet registered: see :meth:`register`."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a consumer that is not there
        sock.setsockopt(zmq.SNDHWM, SOCKET_HWM)
        sock.setsockopt(zmq.RCVHWM, SOCKET_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_HEADER_BYTES)  # a producer only receives control messages
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        give_up_dead_links(sock, self.give_up_after)  # a link that was down: reconnect, not back off
        if self.curve is not None:
            self.curve.apply_client(sock)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise ConfigError(f"cannot connect to {self.endpoint!r}: {exc}") from None
        self.sock = sock
        if self.curve is not None:  # libzmq says so only through a monitor (Connection.auth_denied)
            self.monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)

    def register(self) -> None:
        self.poller.register(self.sock, zmq.POLLIN)
        if self.monitor is not None:
            self.poller.register(self.monitor, zmq.POLLIN)
        self.watching_out = False

    def unregister(self) -> None:
        """Take the sockets off the loop's poller (before :meth:`close`, or a rebuild)."""
        self.poller.unregister(self.sock)
        if self.monitor is not None:
            self.poller.unregister(self.monitor)

    def rebuild(self) -> None:
        """A fresh socket: libzmq never reconnects one that hit a protocol error, nor retries a denied key."""
        self.unregister()
        self.close(linger=0)
        self.open()
        self.register()

    def watch_writable(self) -> None:
        """Poll the socket for POLLOUT exactly while its connection waits for one (a HELLO that found no
        connection): with IMMEDIATE a DEALER is writable only once connected, so this wakes the loop the moment
        libzmq connects. Never otherwise: a connected socket is almost always writable, and the loop would spin."""
        wanted = self.conn.wants_writable
        if wanted != self.watching_out:
            self.poller.modify(self.sock, zmq.POLLIN | (zmq.POLLOUT if wanted else 0))
            self.watching_out = wanted

    def auth_denials(self, events: dict[Any, int]) -> int:
        """How many denied handshakes the monitor reported in this poll's ``events`` (0 without CURVE)."""
        if self.monitor is None or not events.get(self.monitor, 0) & zmq.POLLIN:
            return 0
        from zmq.utils.monitor import recv_monitor_message

        denied = 0
        for _ in range(RECEIVE_BURST):
            try:
                event = recv_monitor_message(self.monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            denied += event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        return denied

    def close(self, linger: int) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(0)
            self.monitor = None
        if self.sock is not None:
            self.sock.close(linger=linger)


def announced_frame_bytes(welcome: dict[str, Any]) -> int:
    """The frame bound a WELCOME announces (validated as a positive int by parse_header), clamped into
    [MIN_FRAME_BYTES, MAX_FRAME_BYTES]: a hostile or broken WELCOME can neither split a batch into more than
    MAX_FRAMES frames nor do more than send leaves whole."""
    return min(max(welcome["frame_bytes"], MIN_FRAME_BYTES), MAX_FRAME_BYTES)

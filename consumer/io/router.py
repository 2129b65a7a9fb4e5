"""The consumer's ROUTER socket with its context and CURVE authenticator. Only the io thread uses it.

Sends never block: a peer that is gone (``ROUTER_MANDATORY``) or not reading makes :meth:`Router.send` return
False. No *frame* is larger than ``max_batch_bytes`` (``MAXMSGSIZE``, which libzmq checks per frame of a
multipart message, not on the message's total: a peer that sends a bigger frame loses its connection). The
bound on a whole batch, whatever its frames, is the decoder's (``decode_tree(max_bytes=...)``). A TCP connection
whose data goes unacknowledged for the liveness window is given up, so that a producer whose link was down
comes back on a fresh one (:mod:`ferry.common.deadlinks`).

Closing says BYE to every producer and keeps the connections until each has *read* it: a producer answers a
BYE with its own at once (a HELLO, which one says once it serves no more, counts too), at most
``CONSUMER_BYE_LINGER_MS`` in all. A producer's DEALER (``IMMEDIATE``) drops what it has not read yet the moment
its connection goes, and the connection used to go about half a millisecond after the BYE arrived: a producer
whose main loop did not read within that lost the BYE and waited out its liveness window instead.
"""

from __future__ import annotations

import math
import time
from typing import Any, Iterable

import zmq

from ferry.common import protocol
from ferry.common.constants import CONSUMER_RCVHWM, CONSUMER_BYE_LINGER_MS, RECEIVE_BURST, SOCKET_HWM
from ferry.common.deadlinks import give_up_dead_links
from ferry.common.errors import ConfigError, ProtocolError


class Router:
    """The bound ROUTER. ``give_up_after``: the consumer's liveness window, heartbeat x liveness. [Unit: second]

    Raises:
        ConfigError: an endpoint cannot be bound.
    """

    def __init__(self, endpoints: Iterable[str], *, max_batch_bytes: int, give_up_after: float,
                 curve: Any = None) -> None:
        # libzmq mallocs every received frame; ferry.keep_freed_memory(), the script's choice, keeps freed frames
        # for reuse rather than a fresh mmap (a fault per page) each time (docs/tuning.md#frame-size)
        ctx = zmq.Context()
        auth = sock = None
        try:
            auth = curve.start_authenticator(ctx) if curve is not None else None
            sock = ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a vanished peer raises instead of vanishing
            sock.setsockopt(zmq.SNDHWM, SOCKET_HWM)
            sock.setsockopt(zmq.RCVHWM, CONSUMER_RCVHWM)  # what a flooding peer can make it hold
            sock.setsockopt(zmq.MAXMSGSIZE, max_batch_bytes)
            give_up_dead_links(sock, give_up_after)  # a link that was down: reconnect, not back off
            if curve is not None:
                curve.apply_server(sock)
            for endpoint in endpoints:
                _bind(sock, endpoint)
        except BaseException:
            if sock is not None:
                sock.close(0)
            if auth is not None:
                auth.stop()
            ctx.term()
            raise
        self._ctx, self._auth, self.sock = ctx, auth, sock

    def recv(self) -> list[Any] | None:
        """The next message's frames (zero-copy), or None if none is waiting."""
        try:
            return self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None

    def send(self, peer: bytes, frames: list[Any]) -> bool:
        try:
            self.sock.send_multipart([peer, *frames], flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError:  # EHOSTUNREACH (gone) or EAGAIN (not reading)
            return False

    @property
    def closed(self) -> bool:
        return self._ctx.closed

    def close(self, goodbye: Iterable[bytes] = ()) -> set[bytes]:
        """Say BYE to the peers ``goodbye``, wait until each has read it (see the module docstring), then close
        the socket and the context. Takes at most ``CONSUMER_BYE_LINGER_MS`` (one round trip when every peer
        answers). Returns the peers told that did not answer within it (none: every one read its BYE)."""
        if self._ctx.closed:
            return set()
        deadline = time.monotonic() + CONSUMER_BYE_LINGER_MS / 1000
        told = {peer for peer in goodbye if self.send(peer, [protocol.pack(protocol.BYE)])}
        self._await_readers(told, deadline)
        self.sock.close(linger=_ms_left(deadline) if told else 0)  # what is still queued: until the deadline
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()
        return told

    def _await_readers(self, told: set[bytes], deadline: float) -> None:
        """Read (and drop) what arrives until every peer in ``told`` has sent a HELLO or a BYE, each of which it
        sends only once it no longer serves this consumer: it has read our BYE. Bounded by ``deadline``
        (time.monotonic()); ``told`` keeps the peers that did not answer."""
        while told:
            if not self.sock.poll(_ms_left(deadline), zmq.POLLIN):
                return
            for _ in range(RECEIVE_BURST):
                frames = self.recv()
                if frames is None:
                    break
                if len(frames) >= 2 and _leaves(frames[1]):
                    told.discard(bytes(frames[0]))


def _leaves(header: Any) -> bool:
    """Whether a message whose frame 0 is ``header`` says its producer no longer serves us (HELLO or BYE)."""
    try:
        return protocol.parse_header(header)["type"] in (protocol.HELLO, protocol.BYE)
    except ProtocolError:
        return False


def _ms_left(deadline: float) -> int:
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))


def _bind(sock: zmq.Socket, endpoint: str) -> None:
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        hint = (" (is another trainer or rank already bound there? Under torchrun each rank binds port + LOCAL_RANK; "
                "ranks started otherwise need an endpoint each)") if exc.errno == zmq.EADDRINUSE else ""
        raise ConfigError(f"cannot bind the consumer to {endpoint}: {exc.strerror}{hint}") from None

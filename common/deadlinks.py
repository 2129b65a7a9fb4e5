"""A TCP link that cannot deliver is given up within the liveness window, on both sides' sockets.

While a link is down, each end's unacknowledged data is retransmitted with exponential back-off (0.2 s, 0.4 s,
... doubling, up to 2 minutes apart). Kept, such a connection carries nothing until its next retransmission: after
a 15 s outage a producer's HELLOs reached its consumer, but the WELCOMEs waited 12 s behind the consumer's own
unacknowledged PINGs, and the producer flapped between joined and lost meanwhile. ``ZMQ_TCP_MAXRT`` (Linux:
``TCP_USER_TIMEOUT``) makes the kernel drop a connection whose oldest unacknowledged data is older than the
window; ZeroMQ then reconnects on a fresh connection. A connect whose SYNs are lost too is abandoned after the
window (``ZMQ_CONNECT_TIMEOUT``, never under MIN_CONNECT_TIMEOUT_S) and tried again, RECONNECT_IVL_MAX_MS at most
later, rather than waiting for a SYN the kernel resends ever further apart. So a producer is back within a few
seconds of the link, however long it was down.

It does not cut a connection that is merely slow or whose training loop stalls: data is acknowledged as it
arrives, and the consumer's io thread reads every batch the credits allow whatever the loop does (as ZeroMQ's I/O
thread reads them into its queue), so nothing stays unacknowledged that long unless nothing gets through. A reader
whose ZeroMQ queue is full (its high-water mark) does advertise a zero window, and its peer gives the connection
up after the window (measured with bare sockets: a ROUTER that never reads, RCVHWM 1, a 0.3 s window: the DEALER
reconnects every 0.7 s); in Ferry that needs an io thread or producer loop stuck for the liveness window, which has
dropped the session already. A connection given up costs no work that the liveness window had not already lost.
Other transports (ipc) ignore both options.

A producer sets its window from its own ``--heartbeat`` and ``--liveness`` when it makes the socket, before any
WELCOME: with a loader whose ``heartbeat`` is longer than its producers', an outage between the two windows
makes the producer give up a connection its consumer would have kept, and its tasks in flight are re-issued
(no sample lost, the work redone). Give producers the loader's heartbeat where it is raised.
"""

from __future__ import annotations

import zmq

from ferry.common.constants import MIN_CONNECT_TIMEOUT_S

__all__ = ["give_up_dead_links"]


def give_up_dead_links(sock: zmq.Socket, window: float) -> None:
    """Make each TCP connection of ``sock`` give up once data it sent stays unacknowledged for ``window`` seconds,
    its side's liveness window (heartbeat x liveness), and each connect that has not completed within it (at least
    MIN_CONNECT_TIMEOUT_S) be tried afresh. Set before ``bind`` or ``connect``: ZeroMQ applies them to the
    connections made after. [Unit: second]"""
    sock.setsockopt(zmq.TCP_MAXRT, max(1, round(window * 1000)))
    sock.setsockopt(zmq.CONNECT_TIMEOUT, round(max(window, MIN_CONNECT_TIMEOUT_S) * 1000))

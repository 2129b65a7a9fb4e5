"""The producer service: one main loop that owns every DEALER socket.

Lifecycle of each consumer connection (one DEALER per ``--connect`` endpoint)::

    GREETING --WELCOME--> SERVING --(consumer silent LIVENESS x heartbeat, BYE, or REJECT)--> GREETING
        \\--REJECT(permanent)--> CLOSED

While GREETING, the producer says HELLO every heartbeat. While SERVING it runs TASKs and PINGs. Leaving
SERVING drops that consumer's pending work (its results are discarded, not sent) and draws a new
``nonce``, so the consumer can tell a fresh HELLO from a repeated one. If, while GREETING, no HELLO can
even be queued (no connection: IMMEDIATE is set) for LIVENESS heartbeats on a socket that had been
welcomed, the endpoint gets a fresh DEALER socket: libzmq does not reconnect after a protocol error (an oversized frame, say), so a broken or hostile
peer would otherwise cut this endpoint off for good. A connection that merely waits (a cut link) keeps its
socket, and the batches queued on it still arrive late, to be dropped by the consumer as duplicates.

Threads: the main loop (this module), plus the batcher's pools (:mod:`ferry.producer.batcher`). Shutdown order,
on SIGTERM / SIGINT / ``stop()``: the main loop leaves its poll, says BYE on every serving connection,
stops the batcher (waits for running samples, cancels queued ones), then closes sockets with LINGER=0
and terminates its own zmq context.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import queue
import random
import signal
import socket as pysocket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import zmq

from ferry.common import protocol
from ferry.common.constants import MAX_HEADER_BYTES, MAX_SLOTS, SOCKET_HWM
from ferry.common.datasets import dataset_fingerprint
from ferry.common.errors import ProtocolError
from ferry.common.waker import Waker

from ferry.producer.batcher import Batcher, Job, Outcome
from ferry.producer.config import ProducerConfig

log = logging.getLogger("ferry.producer")

BYE_LINGER_MS = 500
EXIT_OK = 0
EXIT_REJECTED = 3


class ConnState(enum.IntEnum):
    GREETING = 1
    SERVING = 2
    CLOSED = 3


@dataclass
class Connection:
    key: int
    endpoint: str
    sock: zmq.Socket
    state: ConnState = ConnState.GREETING
    session: int | None = None
    nonce: int = field(default_factory=lambda: random.getrandbits(62))
    heartbeat: float = 1.0
    last_heard: float = 0.0
    last_sent: float = 0.0
    started: float = field(default_factory=time.monotonic)
    warned_unreachable: bool = False
    pending: int = 0  # tasks of the current session not yet answered
    said_bye: bool = False
    unsendable_since: float | None = None  # GREETING, and no connection to queue a HELLO on, since when
    welcomed_here: bool = False  # a consumer welcomed us on this socket (so a connection existed)


class Producer:
    """Serves a dataset to one or more consumers until stopped."""

    def __init__(self, config: ProducerConfig, dataset: Any) -> None:
        self.config = config
        self.dataset = dataset
        self.dataset_len = len(dataset)
        self.fingerprint = dataset_fingerprint(dataset)
        self.producer_id = uuid.uuid4().hex[:12]
        self.name = f"{pysocket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()
        self._waker = Waker()
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._ctx = zmq.Context()
        self._conns: dict[int, Connection] = {}
        self._slab = self._map_slab(config.shared_memory)
        self._batcher = Batcher(
            dataset,
            threads=config.threads,
            batch_workers=config.slots * max(1, len(config.endpoints)),
            done=self._done,
            waker=self._waker,
        )
        self.batches_sent = 0
        self.bytes_sent = 0
        self.shared_batches = 0  # batches written into the consumer's shared-memory slab
        self.invalid_messages = 0
        self.stale_messages = 0
        self._keys = itertools.count()
        self._poller = zmq.Poller()
        self._metrics = None
        try:
            for endpoint in config.endpoints:
                conn = self._connect(endpoint)
                self._conns[conn.key] = conn
            if config.metrics_port:
                from ferry.common.metrics import MetricsServer

                self._metrics = MetricsServer(config.metrics_port, self.figures, "ferry_producer")
        except BaseException:
            self._close()
            raise

    # --- public -------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the main loop to finish. Safe from any thread and from a signal handler."""
        self._stop.set()
        self._waker.wake()

    def run(self) -> int:
        """Serve until stopped or permanently rejected everywhere. Returns the process exit code."""
        cfg = self.config
        log.info(
            "ferry producer %s (id %s) serving %s: %d samples, fingerprint %s, %d threads, %d slots -> %s",
            self.name, self.producer_id, cfg.dataset_label, self.dataset_len, self.fingerprint,
            cfg.threads, cfg.slots, ", ".join(cfg.endpoints),
        )
        poller = self._poller
        poller.register(self._waker.fileno(), zmq.POLLIN)
        for conn in self._conns.values():
            poller.register(conn.sock, zmq.POLLIN)
        code = EXIT_OK
        try:
            while not self._stop.is_set():
                if all(c.state is ConnState.CLOSED for c in self._conns.values()):
                    log.error("every consumer rejected this producer permanently; exiting")
                    code = EXIT_REJECTED
                    break
                events = dict(poller.poll(timeout=self._poll_timeout_ms()))
                if self._waker.fileno() in events:
                    self._waker.drain()
                for conn in self._conns.values():
                    if conn.sock in events:
                        self._receive(conn)
                self._send_outcomes()
                self._tick(time.monotonic())
            for conn in self._conns.values():
                if conn.state is ConnState.SERVING:
                    conn.said_bye = self._send(conn, [protocol.pack(protocol.BYE)])
        finally:
            self._close()
        log.info("ferry producer %s stopped after %d batches", self.name, self.batches_sent)
        return code

    # --- sockets ------------------------------------------------------------------------------------
    def _connect(self, endpoint: str) -> Connection:
        return Connection(key=next(self._keys), endpoint=endpoint, sock=self._socket(endpoint),
                          heartbeat=self.config.heartbeat)

    def _socket(self, endpoint: str) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a consumer that is not there
        sock.setsockopt(zmq.SNDHWM, SOCKET_HWM)
        sock.setsockopt(zmq.RCVHWM, SOCKET_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_HEADER_BYTES)  # a producer only receives control messages
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        if self.config.curve is not None:
            self.config.curve.apply_client(sock)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise ValueError(f"cannot connect to {endpoint!r}: {exc}") from None
        return sock

    def _reconnect(self, conn: Connection) -> None:
        """A fresh socket for ``conn``: libzmq never reconnects one that hit a protocol error."""
        log.warning("no connection to %s for %d heartbeats: rebuilding the socket", conn.endpoint,
                    self.config.liveness)
        self._poller.unregister(conn.sock)
        conn.sock.close(0)
        conn.sock = self._socket(conn.endpoint)
        conn.welcomed_here = False  # libzmq connects a fresh socket by itself once a consumer listens
        self._poller.register(conn.sock, zmq.POLLIN)

    def _send(self, conn: Connection, frames: list[Any]) -> bool:
        try:
            conn.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False  # not connected, or the consumer stopped reading: it will re-issue
        conn.last_sent = time.monotonic()
        return True

    def figures(self) -> dict[str, Any]:
        """What the metrics endpoint exports (read from its thread; plain int reads)."""
        return {
            "batches_sent": self.batches_sent, "bytes_sent": self.bytes_sent, "shared_batches": self.shared_batches,
            "invalid_messages": self.invalid_messages, "stale_messages": self.stale_messages,
            "pending": self._batcher.pending,
            "consumers": sum(1 for c in list(self._conns.values()) if c.state is ConnState.SERVING),
        }

    def _close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
        self._batcher.close()
        for conn in self._conns.values():
            conn.sock.close(linger=BYE_LINGER_MS if conn.said_bye else 0)  # let a BYE leave, bounded
        self._ctx.term()
        self._waker.close()

    # --- receiving ------------------------------------------------------------------------------------
    def _receive(self, conn: Connection) -> None:
        for _ in range(256):  # bounded burst, then let the loop breathe
            try:
                frames = conn.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                header = protocol.parse_header(frames[0])
                self._handle(conn, header, len(frames))
            except ProtocolError as exc:
                self.invalid_messages += 1
                if self.invalid_messages <= 10 or self.invalid_messages % 1000 == 0:
                    log.warning("invalid message #%d from %s dropped: %s", self.invalid_messages, conn.endpoint, exc)

    def _handle(self, conn: Connection, header: dict[str, Any], nframes: int) -> None:
        kind = header["type"]
        now = time.monotonic()
        if kind == protocol.WELCOME:
            if header["nonce"] != conn.nonce:
                raise ProtocolError("WELCOME for an earlier HELLO")
            if conn.state is ConnState.GREETING:
                conn.state, conn.session = ConnState.SERVING, header["session"]
                conn.welcomed_here = True
                conn.heartbeat = min(max(float(header["heartbeat"]), 0.05), 60.0)
                conn.last_heard, conn.warned_unreachable = now, False
                log.info("serving consumer at %s (session %x)", conn.endpoint, conn.session)
            return
        if kind == protocol.REJECT:
            if header["permanent"]:
                log.error("consumer at %s rejected this producer: %s", conn.endpoint, header["reason"])
                self._reset(conn, ConnState.CLOSED)
            elif conn.state is ConnState.SERVING:  # while GREETING we are saying HELLO already
                log.info("consumer at %s asks for a new HELLO: %s", conn.endpoint, header["reason"])
                self._reset(conn, ConnState.GREETING)
            return
        if conn.state is not ConnState.SERVING:
            if kind not in (protocol.PING, protocol.TASK, protocol.BYE):
                raise ProtocolError(f"{kind} before WELCOME")
            # sent before the consumer saw our new HELLO (say, across a link that was down): stale
            self.stale_messages += 1
            return
        conn.last_heard = now
        if kind == protocol.TASK:
            self._accept_task(conn, header, nframes)
        elif kind == protocol.BYE:
            log.info("consumer at %s said BYE", conn.endpoint)
            self._reset(conn, ConnState.GREETING)
        elif kind != protocol.PING:
            raise ProtocolError(f"unexpected {kind} from a consumer")

    def _accept_task(self, conn: Connection, header: dict[str, Any], nframes: int) -> None:
        if nframes != 1:
            raise ProtocolError(f"TASK with {nframes} frames")
        if header["session"] != conn.session:
            raise ProtocolError(f"TASK for session {header['session']:x}, serving {conn.session:x}")
        indices = header["indices"]
        bad = next((i for i in indices if i >= self.dataset_len), None)
        if bad is not None:
            raise ProtocolError(f"TASK index {bad} out of range for {self.dataset_len} samples")
        if conn.pending >= 2 * MAX_SLOTS:
            raise ProtocolError(f"TASK beyond {2 * MAX_SLOTS} pending tasks")
        slot = None
        if "slot" in header and self._slab is not None:  # a consumer without our slab never sends one
            try:
                slot = self._slab.writer(tuple(header["slot"]))
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None
        conn.pending += 1
        self._batcher.submit(
            Job(conn.key, conn.session, header["task"], header["epoch"], header["seq"], indices, header["on_error"],
                slot)
        )

    # --- sending ------------------------------------------------------------------------------------
    def _send_outcomes(self) -> None:
        while True:
            try:
                outcome = self._done.get_nowait()
            except queue.Empty:
                return
            conn = self._conns[outcome.job.conn_key]
            if conn.state is not ConnState.SERVING or conn.session != outcome.job.session:
                self._release(outcome, None)
                continue  # the session it belonged to is gone
            conn.pending -= 1
            frames, tracker = outcome.frames, None
            if outcome.buffer is not None:
                # track the pooled buffer's own frames: send_multipart(track=True) would only track the
                # last part, a small label frame that pyzmq copies, so its tracker says nothing
                k = outcome.buffer_frames
                own = [zmq.Frame(f, copy=False, track=True) for f in frames[1 : 1 + k]]
                tracker = zmq.MessageTracker(*[f.tracker for f in own])
                frames = [frames[0], *own, *frames[1 + k :]]
                del own  # a tracker completes only once no Python Frame refers to its message
            sent = self._send(conn, frames)
            del frames
            self._release(outcome, tracker if sent else None)
            if sent and not outcome.failed:
                self.batches_sent += 1
                self.bytes_sent += sum(len(f) for f in outcome.frames[1:])
                if outcome.job.slot is not None and outcome.job.slot.used:
                    self.shared_batches += 1
                    self.bytes_sent += outcome.job.slot.used

    def _release(self, outcome: Outcome, tracker: Any) -> None:
        if outcome.buffer is not None:
            self._batcher.pool.release(outcome.buffer, tracker)

    def _tick(self, now: float) -> None:
        for conn in self._conns.values():
            if conn.state is ConnState.GREETING and now - conn.last_sent >= conn.heartbeat:
                if self._send(conn, [self._hello(conn)]):
                    conn.unsendable_since = None
                elif conn.unsendable_since is None:
                    conn.unsendable_since = now
                elif conn.welcomed_here and now - conn.unsendable_since > self.config.liveness * conn.heartbeat:
                    self._reconnect(conn)  # libzmq may have given up on this connection for good
                    conn.unsendable_since = None
                conn.last_sent = now  # also when the send found no peer: retry next heartbeat
                waited = now - conn.started
                if not conn.warned_unreachable and waited > self.config.unreachable_warning_s:
                    conn.warned_unreachable = True
                    log.warning("no consumer has answered at %s for %.0f s; still trying", conn.endpoint, waited)
            elif conn.state is ConnState.SERVING:
                if now - conn.last_heard > self.config.liveness * conn.heartbeat:
                    log.warning("consumer at %s silent for %.1f s; dropping its work and saying HELLO again",
                                conn.endpoint, now - conn.last_heard)
                    self._reset(conn, ConnState.GREETING)
                elif now - conn.last_sent >= conn.heartbeat:
                    load = {"pending": conn.pending, "sent": self.batches_sent}
                    self._send(conn, [protocol.pack(protocol.PING, load=load)])

    def _hello(self, conn: Connection) -> bytes:
        return protocol.pack(
            protocol.HELLO,
            producer=self.producer_id,
            nonce=conn.nonce,
            host=pysocket.gethostname(),
            pid=os.getpid(),
            slots=self.config.slots,
            dataset={"spec": self.config.dataset_label, "len": self.dataset_len, "fingerprint": self.fingerprint},
            **({"shm": self.config.shared_memory[1]} if self._slab is not None else {}),
        )

    @staticmethod
    def _map_slab(shared_memory: tuple[str, str] | None) -> Any:
        if shared_memory is None:
            return None
        from ferry.common.shm import SlabMapping

        try:
            return SlabMapping(shared_memory[0])
        except (OSError, ValueError) as exc:  # still correct without it: batches go over the socket
            log.warning("cannot map the consumer's shared memory %s (%s); sending batches over the socket",
                        shared_memory[0], exc)
            return None

    def _reset(self, conn: Connection, state: ConnState) -> None:
        conn.state, conn.session, conn.pending = state, None, 0
        conn.nonce = random.getrandbits(62)
        conn.started = time.monotonic()
        conn.last_sent = 0.0  # say HELLO at once

    def _poll_timeout_ms(self) -> int:
        beat = min((c.heartbeat for c in self._conns.values()), default=1.0)
        return max(10, int(beat * 250))


def install_signal_handlers(producer: Producer) -> None:
    """SIGTERM and SIGINT stop the producer cleanly (BYE, exit 0). Main thread only."""

    def handler(signum: int, frame: Any) -> None:
        producer.stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)

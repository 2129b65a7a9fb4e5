"""The relay's socket loop: it feeds the core (``core.py``) its events and applies its actions, and decides nothing.

Threads: this loop (the caller of :meth:`Relay.run`: the ``ferry relay`` process's main thread), the loader thread
(``loading.py``), and the loader's own. The loop owns every socket: the listening one (TCP, on the loopback
interface only), the client's, and a waker that the loader thread writes to when it posts an answer. Sends never
block: each connection has a queue of whole messages written as the socket takes them, so a client that reads
slowly (its model step) never stops the loop from reading its credits or answering its commands.

Shutdown (:meth:`Relay.stop`, from any thread or a signal handler; or a client's ``bye`` with ``stop 1``): the loop
leaves, closes the loader (a pull waiting for a batch ends), stops and joins the loader thread, closes every
socket, removes the payload folder and the connection file it wrote.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import selectors
import socket
import time
from collections import deque
from typing import Any

from ferry.common.constants import RELAY_DEFAULT_WINDOW, RELAY_HEARTBEAT_S, RELAY_PROTOCOL_VERSION
from ferry.common.errors import ConfigError, RelayError
from ferry.consumer.relay.core import RelayCore
from ferry.consumer.relay.events import Close, Log, RunLoader, Send, SendItem, SendStats, Stop, refusal
from ferry.consumer.relay.framing import MessageReader, encode, text_parts
from ferry.consumer.relay.loading import LoaderThread
from ferry.consumer.relay.messages import item_message
from ferry.consumer.relay.payload import PayloadFiles

__all__ = ["Relay", "LOOPBACK"]

log = logging.getLogger("ferry.relay")

#: The only addresses a relay listens on: a client on this machine; never every interface.
LOOPBACK = ("127.0.0.1", "::1", "localhost")
_TICK_S = 0.25
_RECV_BYTES = 1 << 16


class _Connection:
    def __init__(self, sock: socket.socket, number: int) -> None:
        self.sock = sock
        self.number = number
        self.reader = MessageReader()
        self.out: deque[memoryview] = deque()
        self.closing = False

    def __repr__(self) -> str:
        return f"connection {self.number}"


class Relay:
    """A loader's batches served to one client; see the module docstring.

    Args:
        loader: the RemoteLoader (the relay closes it when it stops).
        host: the loopback address to listen on (127.0.0.1, ::1 or localhost).
        port: the TCP port; 0 picks a free one (:attr:`port` says which).
        connection_file: where to write what a client needs to connect (port, token, payload folder), readable by
            this user only; None: into the relay's private folder (:attr:`connection_file`).
        window: the items sent ahead to a client whose hello names none (at most ``buffer_batches``).
        heartbeat: seconds of silence after which the client gets a ping. [Unit: second]
        payload_files: offer a client on this machine its arrays in files (``payload file``).

    Raises:
        ConfigError: ``host`` is not a loopback address, or the port cannot be bound.
    """

    def __init__(self, loader: Any, *, host: str = "127.0.0.1", port: int = 0, connection_file: str | None = None,
                 window: int = RELAY_DEFAULT_WINDOW, heartbeat: float = RELAY_HEARTBEAT_S,
                 payload_files: bool = True) -> None:
        if host not in LOOPBACK:
            raise ConfigError(f"a relay listens on the loopback interface only (127.0.0.1, ::1, localhost), not "
                              f"{host!r}: its client runs on this machine. For another machine, run the relay there")
        self.loader = loader
        self.token = secrets.token_hex(16)
        self._payload = PayloadFiles() if payload_files else None
        self._private = self._payload.folder if self._payload else None
        family = socket.AF_INET6 if host == "::1" else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.bind((host, port))
        except OSError as exc:
            self._listener.close()
            self._close_payload()
            raise ConfigError(f"the relay cannot listen on {host}:{port}: {exc}") from None
        self._listener.listen(4)
        self._listener.setblocking(False)
        self.host, self.port = host, self._listener.getsockname()[1]
        self.core = RelayCore(token=self.token, max_window=loader.buffer_batches, default_window=window,
                              heartbeat=heartbeat, hello_timeout=max(10.0, 2 * heartbeat),
                              payload_folder=self._private, state=loader.state_dict())
        self._answers: "queue.Queue[Any]" = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._loading = LoaderThread(loader, self._post)
        self._selector = selectors.DefaultSelector()
        self._connections = 0
        self._stopping = False
        self._closed = False
        self.connection_file = connection_file or (os.path.join(self._private, "connection") if self._private
                                                   else None)
        self._wrote_connection_file = False
        self._write_connection_file()  # the socket listens already: a client that comes before run() waits in its backlog

    # --- lifecycle ---
    def run(self) -> None:
        """Serve until :meth:`stop` (or a client's ``bye`` with ``stop 1``), then shut down."""
        try:
            self._loading.start()
            self._selector.register(self._listener, selectors.EVENT_READ, "listen")
            self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            next_tick = time.monotonic()
            while not self._stopping:
                for key, mask in self._selector.select(max(0.0, next_tick - time.monotonic())):
                    self._event(key, mask)
                now = time.monotonic()
                if now >= next_tick:
                    self._apply(self.core.tick(now))
                    next_tick = now + _TICK_S
        finally:
            self._shutdown()

    def stop(self) -> None:
        """Make :meth:`run` return (from any thread, or a signal handler)."""
        self._stopping = True
        try:
            self._wake_w.send(b"s")
        except OSError:
            pass

    def _post(self, answer: Any) -> None:  # the loader thread's way in
        self._answers.put(answer)
        try:
            self._wake_w.send(b"a")
        except OSError:  # the waker is full (it still wakes the loop) or closed (stopping)
            pass

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.loader.close()  # a pull waiting for a batch ends with LoaderClosedError
        self._loading.stop()
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, _Connection):
                key.data.sock.close()
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._wrote_connection_file and self.connection_file and os.path.exists(self.connection_file):
            os.unlink(self.connection_file)
        self._close_payload()

    def _close_payload(self) -> None:
        if self._payload is not None:
            self._payload.close()

    def _write_connection_file(self) -> None:
        if self.connection_file is None:
            return
        lines = ["ferry-relay", f"version {RELAY_PROTOCOL_VERSION}", f"host {self.host}", f"port {self.port}",
                 f"token {self.token}", f"pid {os.getpid()}"]
        if self._private:
            lines.append(f"payload {self._private}")
        temporary = f"{self.connection_file}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(temporary, self.connection_file)  # whole or absent: a client polling for it never reads half
        self._wrote_connection_file = True

    # --- events ---
    def _event(self, key: selectors.SelectorKey, mask: int) -> None:
        now = time.monotonic()
        if key.data == "listen":
            self._accept(now)
        elif key.data == "wake":
            try:
                while self._wake_r.recv(4096):
                    pass
            except BlockingIOError:
                pass
            while True:
                try:
                    answer = self._answers.get_nowait()
                except queue.Empty:
                    break
                self._apply(self.core.answered(answer, now))
        else:
            conn: _Connection = key.data
            if mask & selectors.EVENT_READ:
                self._read(conn, now)
            if mask & selectors.EVENT_WRITE and conn.sock.fileno() >= 0:
                self._flush(conn)

    def _accept(self, now: float) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        self._connections += 1
        conn = _Connection(sock, self._connections)
        self._selector.register(sock, selectors.EVENT_READ, conn)
        self._apply(self.core.opened(conn, now))

    def _read(self, conn: _Connection, now: float) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, now)
            return
        try:
            messages = conn.reader.feed(data)
        except RelayError as exc:
            log.warning("ferry relay: %s sent what is not the relay protocol: %s", conn, exc)
            self._apply(refusal(conn, f"not the ferry relay protocol: {exc}"))
            return
        for header, parts in messages:
            if conn.closing:
                return
            texts = {name: value.decode("utf-8", "replace") for name, value in parts.items()}
            self._apply(self.core.received(conn, header, texts, now))

    def _drop(self, conn: _Connection, now: float) -> None:
        if conn.sock.fileno() >= 0:
            self._selector.unregister(conn.sock)
            conn.sock.close()
        conn.out.clear()
        self._apply(self.core.closed(conn, now))

    def _flush(self, conn: _Connection) -> None:
        while conn.out:
            try:
                sent = conn.sock.send(conn.out[0])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(conn, time.monotonic())
                return
            head = conn.out[0]
            if sent < len(head):
                conn.out[0] = head[sent:]
                break
            conn.out.popleft()
        if not conn.out and conn.closing:
            self._drop(conn, time.monotonic())
            return
        self._selector.modify(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0), conn)

    # --- actions ---
    def _apply(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, RunLoader):
                self._loading.submit(action.command)
            elif isinstance(action, Send):
                parts, data = text_parts(action.texts)
                self._queue(action.conn, [encode(action.type, action.fields, parts), *data])
            elif isinstance(action, SendItem):
                self._queue(action.conn, item_message(action, self._payload))
            elif isinstance(action, SendStats):
                figures = {"relay": action.figures, "loader": self.loader.stats()}
                parts, data = text_parts({"stats": json.dumps(figures, default=str)})
                self._queue(action.conn, [encode("stats", {"reply": "stats"}, parts), *data])
            elif isinstance(action, Close):
                action.conn.closing = True
                if action.conn.sock.fileno() >= 0:
                    self._flush(action.conn)
            elif isinstance(action, Stop):
                log.info("ferry relay: stopping: %s", action.reason)
                self._stopping = True
            elif isinstance(action, Log):
                getattr(log, action.level)("ferry relay: %s", action.text)

    def _queue(self, conn: _Connection, pieces: list[Any]) -> None:
        if conn.sock.fileno() < 0:
            return
        conn.out.extend(memoryview(p) if not isinstance(p, memoryview) else p for p in pieces if len(p))
        self._flush(conn)

    def __repr__(self) -> str:
        return f"<Relay {self.host}:{self.port} {self.core._figures()}>"

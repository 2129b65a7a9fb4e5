"""A relay's client in Python: the reference implementation of docs/relay-protocol.md (the tests drive relays with
it; R's client, ``clients/r``, does the same in base R).

    with RelayClient("/tmp/relay/connection") as client:
        for epoch in range(2):
            client.set_epoch(epoch)
            for batch in client.epoch():      # a tree of numpy arrays, as the loader's batch
                ...
            state = client.state_dict()       # resume a new client with client.load_state_dict(state)
"""

from __future__ import annotations

import json
import os
import socket
from collections import deque
from typing import Any, Iterator

import numpy as np

from ferry.common.constants import RELAY_DEFAULT_WINDOW, RELAY_PROTOCOL_VERSION
from ferry.common.errors import RelayError
from ferry.consumer.relay.framing import (
    LENGTH, WIRE_DTYPES, Header, Part, decode_name, encode, header_length, parse_header, part_nbytes, stream_parts,
    text_parts,
)

__all__ = ["RelayClient", "RemoteError", "read_connection_file"]


class RemoteError(RelayError):
    """An error the relay sent: ``cls`` and ``classes`` name the Python exception (most derived first),
    ``remote_traceback`` is where it was raised; ``consumed``: it took a batch's place."""

    def __init__(self, header: Header, texts: dict[str, str]) -> None:
        self.cls = header.get("class", "")
        self.classes = tuple(c for c in header.get("classes", "").split(",") if c)
        self.consumed = header.get("consumed") == "1"
        self.index = header.integer("index", -1)
        self.remote_traceback = texts.get("traceback", "")
        super().__init__(f"{self.cls}: {texts.get('message', '')}")


def read_connection_file(path: str) -> dict[str, str]:
    """A relay's connection file as ``key`` → value."""
    with open(path) as f:
        lines = f.read().splitlines()
    if not lines or lines[0] != "ferry-relay":
        raise RelayError(f"{path} is not a ferry relay connection file")
    return dict(line.partition(" ")[::2] for line in lines[1:] if line)


class RelayClient:
    """One connection to a relay; see the module docstring.

    Args:
        connection_file: the relay's connection file (port, token, payload folder); or give ``port`` and ``token``.
        order: ``"C"`` (row-major, as numpy) or ``"F"``.
        dtypes: the dtypes this client reads (default: all); others are converted by the relay.
        window: items the relay may send ahead (default: the relay's).
        payload: ``"inline"`` or ``"file"`` (arrays read from the relay's payload files).
        resume: ``(pass, consumed)`` of an earlier connection of this client, to go on where it was.
        timeout: seconds one read may wait (the relay pings every few seconds). [Unit: second]

    Raises:
        RelayError: the relay refused the client (the message is the relay's reason), or cannot be reached.
    """

    def __init__(self, connection_file: str | None = None, *, port: int | None = None, token: str = "",
                 host: str = "127.0.0.1", order: str = "C", dtypes: tuple[str, ...] | None = None,
                 window: int | None = None, payload: str = "inline", name: str = "python",
                 resume: tuple[int, int] | None = None, version: int = RELAY_PROTOCOL_VERSION,
                 timeout: float = 60.0) -> None:
        if connection_file is not None:
            info = read_connection_file(connection_file)
            host, port, token = info.get("host", host), int(info["port"]), info.get("token", "")
        if port is None:
            raise RelayError("give the relay's connection file, or its port and token")
        self.order = order
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._queue: deque[tuple[Header, dict[str, Any]]] = deque()
        fields: dict[str, Any] = {"version": version, "token": token, "order": order, "payload": payload,
                                  "client": f"{name} (pid {os.getpid()})"}
        if dtypes is not None:
            fields["dtypes"] = ",".join(dtypes)
        if window is not None:
            fields["window"] = window
        if resume is not None:
            fields["pass"], fields["consumed"] = resume
        self._send("hello", fields)
        header, texts = self._read()
        if header.type == "refuse":
            self._sock.close()
            raise RelayError(f"the relay refused this client: {texts.get('reason', '')}")
        if header.type != "welcome":
            self._sock.close()
            raise RelayError(f"the relay answered a hello with {header.type!r}")
        self.welcome = header
        self.window = header.integer("window", RELAY_DEFAULT_WINDOW)
        self.folder = header.get("folder")
        self.pass_no, self.consumed = header.integer("pass", 0), header.integer("consumed", 0)
        self.active = header.get("active") == "1"
        self.ended = False

    # --- iteration ---
    def start(self) -> dict[str, int]:
        """Start a new pass over the next epoch (Python's ``iter(loader)``): its epoch, first and length."""
        reply, _ = self._command("iter")
        self.pass_no, self.consumed, self.active = reply.integer("pass"), 0, True
        self._queue = deque(m for m in self._queue if int(m[0].get("pass", -1)) == self.pass_no)
        return {key: reply.integer(key) for key in ("epoch", "first", "length")}

    def next(self) -> Any:
        """The next batch of the pass (starting one if none is active); None at its end. A batch's error is
        raised here (:class:`RemoteError`), in its place."""
        if not self.active:
            self.start()
        while True:
            header, parts = self._next_item()
            self.consumed += 1
            self._send("credit", {"n": 1, "pass": self.pass_no})
            if header.type == "end":
                self.active = False
                return None
            if header.type == "error":
                raise RemoteError(header, parts)
            return _tree(header, parts, self.order)

    def epoch(self) -> Iterator[Any]:
        """A new pass's batches."""
        self.start()
        while True:
            batch = self.next()
            if batch is None:
                return
            yield batch

    # --- commands ---
    def set_epoch(self, epoch: int) -> None:
        self._command("set_epoch", {"epoch": epoch})

    def state_dict(self) -> dict[str, Any]:
        return json.loads(self._command("state")[1]["state"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._command("load_state", texts={"state": json.dumps(state)})
        self.active = False  # the next batch is the resumed pass's

    def stats(self) -> dict[str, Any]:
        return json.loads(self._command("stats")[1]["stats"])

    def close(self, stop: bool = False) -> None:
        """Say bye (``stop``: and stop the relay) and close the connection."""
        try:
            self._send("bye", {"stop": int(stop)})
        except OSError:
            pass
        self._sock.close()

    def drop(self) -> None:
        """Close the connection without a word, as a client that dies."""
        self._sock.close()

    def __enter__(self) -> "RelayClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- the wire ---
    def _command(self, kind: str, fields: dict[str, Any] | None = None,
                 texts: dict[str, str] | None = None) -> tuple[Header, dict[str, str]]:
        """Send a command; its reply's header and texts. Items that arrive meanwhile wait in the queue.

        Raises:
            RemoteError: the reply is an error (the command raised in the relay).
        """
        self._send(kind, fields or {}, texts or {})
        while True:
            header, parts = self._read()
            if header.get("reply") is not None:
                replied = {k: v for k, v in parts.items() if isinstance(v, str)}
                if header.type == "error":
                    raise RemoteError(header, replied)
                return header, replied
            if header.type != "ping":
                self._queue.append((header, parts))

    def _next_item(self) -> tuple[Header, dict[str, Any]]:
        while True:
            header, parts = self._queue.popleft() if self._queue else self._read()
            if header.type in ("batch", "error", "end") and header.integer("pass", -1) == self.pass_no:
                return header, parts
            if header.type not in ("ping", "batch", "error", "end"):
                raise RelayError(f"the relay sent {header.type!r} where an item was due")

    def _send(self, kind: str, fields: dict[str, Any], texts: dict[str, str] | None = None) -> None:
        parts, data = text_parts(texts or {})
        self._sock.sendall(encode(kind, fields, parts) + b"".join(data))

    def _read(self) -> tuple[Header, dict[str, Any]]:
        header = parse_header(self._exact(header_length(self._exact(LENGTH.size))))
        parts: dict[str, Any] = {}
        for part in stream_parts(header):
            data = self._exact(part_nbytes(part))
            parts[part.name] = data.decode() if part.kind == "text" else data
        if header.get("file") is not None:
            with open(os.path.join(self.folder or "", header.get("file", "")), "rb") as f:
                for part in header.parts:
                    if part.kind == "array":
                        parts[part.name] = f.read(part_nbytes(part))
        return header, parts

    def _exact(self, n: int) -> bytes:
        buffer = bytearray(n)
        view, got = memoryview(buffer), 0
        while got < n:
            k = self._sock.recv_into(view[got:])
            if not k:
                raise RelayError("the relay closed the connection")
            got += k
        return bytes(buffer)


def _tree(header: Header, parts: dict[str, Any], order: str) -> Any:
    """A batch message's parts as the batch: numpy arrays, strings, bytes and None, in dicts and lists."""
    root: Any = None
    for part in header.parts:
        value = _value(part, parts.get(part.name), order)
        path = decode_name(part.name)
        if not path:
            return value
        if root is None:
            root = [] if isinstance(path[0], int) else {}
        node = root
        for segment, following in zip(path, path[1:] + [None]):
            if following is None:
                _put(node, segment, value)
            else:
                node = _child(node, segment, [] if isinstance(following, int) else {})
    return root


def _value(part: Part, data: Any, order: str) -> Any:
    if part.kind == "array":
        return np.frombuffer(data, WIRE_DTYPES[part.dtype]).reshape(part.dims, order=order)
    return None if part.kind == "null" else data


def _put(node: Any, segment: Any, value: Any) -> None:
    if isinstance(node, list):
        node.extend([None] * (segment + 1 - len(node)))
        node[segment] = value
    else:
        node[segment] = value


def _child(node: Any, segment: Any, empty: Any) -> Any:
    if isinstance(node, list):
        if segment >= len(node) or node[segment] is None:
            _put(node, segment, empty)
        return node[segment]
    return node.setdefault(segment, empty)

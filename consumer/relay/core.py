"""The relay's decisions, without sockets, threads or a clock: events in, actions out (docs/relay-protocol.md).

Events: a connection opened or closed, a client's message (its header and text parts), the loader thread's answer
to a command, a tick. Actions: messages to send, items to send (the server encodes a batch for its client), a
command for the loader thread, a connection to close, the relay to stop. The server (``server.py``) feeds events in
and applies actions, and nothing else.

What it keeps:

* **one client**, the connection whose hello was accepted; another is refused while it is connected;
* **the pass**: an iteration of the loader (``iter``), numbered; its items are the batches, the errors that take a
  batch's place (or that a wait for one raised) and its end, numbered from 0;
* **held**: the items of the pass pulled from the loader and not yet consumed by the client (sent or not).
  **held + (1 if a pull is running) ≤ window ≤ the loader's buffer_batches**, at every moment: the loader is asked
  for the next item only below it, so the relay holds no more than its client's window, and the loader's own window
  (its buffered and in-flight batches) bounds the rest;
* **credits**: a client's ``credit N`` says it consumed the N oldest items it was sent; they leave ``held``, and the
  state after the last of them becomes the client's state (what ``state`` answers: exactly where a resume goes on);
* **reconnect**: a client that says ``pass P`` and ``consumed K`` in its hello (the same client, its connection
  lost) has its first K items of pass P counted as consumed; every other item held is sent again, in order. A new
  client (no ``pass``) gets every held item: it goes on where the last one was.

The loader thread runs one command at a time; the client's commands (``iter``, ``set_epoch``, ``load_state``) wait
for a running pull, and go before the next.
"""

from __future__ import annotations

import hmac
import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from ferry.common.constants import RELAY_PROTOCOL_VERSION
from ferry.common.errors import RelayError
from ferry.consumer.relay.events import (
    Close, Done, ErrorReport, Item, LoadState, Log, PassStarted, PullItem, Pulled, RunLoader, Send, SendItem, SendStats,
    SetEpoch, StartPass, Stop, refusal,
)
from ferry.consumer.relay.framing import WIRE_DTYPES, Header

__all__ = ["RelayCore"]


@dataclass
class _Client:
    conn: Any
    window: int
    name: str
    order: str
    dtypes: frozenset[str]
    payload: str
    sent: int = 0  # held items sent to it, from held[0]
    last_send: float = 0.0


class RelayCore:
    """See the module docstring. ``max_window``: the loader's ``buffer_batches``; ``heartbeat``: seconds of silence
    after which the client gets a ``ping``; ``hello_timeout``: seconds a connection may take to say hello."""

    def __init__(self, *, token: str, max_window: int, default_window: int, heartbeat: float, hello_timeout: float,
                 payload_folder: str | None, state: dict[str, Any]) -> None:
        self.token = token
        self.max_window = max_window
        self.window = min(default_window, max_window)
        self.heartbeat = heartbeat
        self.hello_timeout = hello_timeout
        self.payload_folder = payload_folder
        self.opened_at: dict[Any, float] = {}  # connections that have not said hello yet
        self.client: _Client | None = None
        self.pass_no = 0
        self.pass_epoch = 0
        self.pass_ended = False  # its end item was pulled
        self.pass_done = True  # its end item was consumed (or there is no pass)
        self.held: deque[Item] = deque()
        self.consumed = 0  # items of the pass the client consumed
        self.pulled = 0  # items of the pass pulled
        self.state = state  # the state after what the client consumed
        self.busy: tuple[Any, str, Any] | None = None  # (connection, its message type, command) the loader runs
        self.pending: deque[tuple[Any, str, Any]] = deque()  # clients' commands waiting for the loader thread
        self.free_slots = list(range(max_window))
        self.figures = {"items_sent": 0, "items_resent": 0, "items_consumed": 0, "clients": 0, "refused": 0}

    # --- events ---
    def opened(self, conn: Any, now: float) -> list[Any]:
        self.opened_at[conn] = now
        return []

    def closed(self, conn: Any, now: float) -> list[Any]:
        self.opened_at.pop(conn, None)
        if self.client is not None and self.client.conn is conn:
            self.client = None
            return [Log("info", f"client {conn} left; {len(self.held)} item(s) held for the next one")]
        return []

    def tick(self, now: float) -> list[Any]:
        actions: list[Any] = []
        for conn, since in list(self.opened_at.items()):
            if now - since > self.hello_timeout:
                del self.opened_at[conn]
                actions += refusal(conn, f"no hello within {self.hello_timeout:g} s")
        client = self.client
        if client is not None and now - client.last_send >= self.heartbeat:
            actions.append(self._send(Send(client.conn, "ping"), now))
        return actions

    def received(self, conn: Any, header: Header, texts: dict[str, str], now: float) -> list[Any]:
        if conn in self.opened_at:
            del self.opened_at[conn]
            return self._hello(conn, header, now)
        client = self.client
        if client is None or client.conn is not conn:
            return refusal(conn, "this connection is not the relay's client")
        try:
            return self._command(conn, header, texts, now)
        except RelayError as exc:  # a malformed line (a credit without n): this client does not speak the protocol
            self.closed(conn, now)
            return refusal(conn, f"invalid {header.type}: {exc}")

    def _command(self, conn: Any, header: Header, texts: dict[str, str], now: float) -> list[Any]:
        kind = header.type
        if kind == "credit":
            return self._credit(header.integer("n"), header.integer("pass"), now)
        if kind == "state":
            return [self._send(Send(conn, "state", {"reply": "state"}, {"state": json.dumps(self.state)}), now)]
        if kind == "stats":
            return [SendStats(conn, self._figures())]
        if kind == "bye":
            actions: list[Any] = [Close(conn)]
            self.closed(conn, now)
            if header.get("stop") == "1":
                actions.append(Stop("the client said bye with stop 1"))
            return actions
        if kind == "iter":
            command: Any = StartPass(0)  # numbered when it runs
        elif kind == "set_epoch":
            command = SetEpoch(header.integer("epoch"))
        elif kind == "load_state":
            try:
                command = LoadState(json.loads(texts.get("state", "")))
            except ValueError as exc:
                return [self._reply_error(conn, kind, ErrorReport("ConfigError", ("ConfigError", "ValueError"),
                                                                  f"load_state: the state is not JSON: {exc}", ""),
                                          now)]
        else:
            return [self._reply_error(conn, kind, ErrorReport("RelayError", ("RelayError",),
                                                              f"unknown command {kind!r}", ""), now)]
        self.pending.append((conn, kind, command))
        return self._pump(now)

    def answered(self, answer: Any, now: float) -> list[Any]:
        """The loader thread's answer to the command it was given."""
        conn, what, _ = self.busy or (None, "", None)
        self.busy = None
        if isinstance(answer, Pulled):
            return self._pulled(answer.item, now) + self._pump(now)
        actions = []
        if isinstance(answer, PassStarted):
            if answer.error is not None:
                self.pass_done, self.pass_ended = True, True
                actions.append(self._reply_error(conn, what, answer.error, now))
            else:
                self.pass_epoch, self.state = answer.epoch, answer.state
                actions.append(self._reply(conn, Send(conn, "pass", {
                    "reply": what, "pass": answer.pass_no, "epoch": answer.epoch, "first": answer.first,
                    "length": answer.length}), now))
        elif isinstance(answer, Done):
            if answer.error is not None:
                actions.append(self._reply_error(conn, what, answer.error, now))
            else:
                if self.pass_done and answer.state is not None:  # mid-pass, the state stays the pass's position
                    self.state = answer.state
                actions.append(self._reply(conn, Send(conn, "ok", {"reply": what}), now))
        return [a for a in actions if a is not None] + self._pump(now)

    # --- decisions ---
    def _hello(self, conn: Any, header: Header, now: float) -> list[Any]:
        reason = self._refused(header)
        if reason is not None:
            self.figures["refused"] += 1
            return refusal(conn, reason)
        order, payload = header.get("order", "C"), header.get("payload", "inline")
        if payload == "file" and self.payload_folder is None:
            payload = "inline"  # the relay could not make its folder: the welcome says what the client gets
        self.figures["clients"] += 1
        self.window = min(header.integer("window", self.window), self.max_window)
        dtypes = frozenset(header.get("dtypes", ",".join(WIRE_DTYPES)).split(",")) - {""}
        self.client = client = _Client(conn, self.window, header.get("client", "") or "a client", order, dtypes,
                                       payload)
        if header.get("pass") is not None and header.integer("pass") == self.pass_no:
            self._consume(header.integer("consumed", 0) - self.consumed)
        fields: dict[str, Any] = {"version": RELAY_PROTOCOL_VERSION, "pass": self.pass_no, "epoch": self.pass_epoch,
                                  "consumed": self.consumed, "active": int(not self.pass_done),
                                  "window": self.window, "payload": payload}
        if payload == "file":
            fields["folder"] = self.payload_folder
        actions: list[Any] = [self._send(Send(conn, "welcome", fields), now)]
        for item in self.held:
            actions.append(self._send(self._item(item), now))
        client.sent = resend = len(self.held)
        self.figures["items_resent"] += resend if self.figures["clients"] > 1 else 0
        actions.append(Log("info", f"{client.name} connected (window {self.window}, order {order}, payload {payload})"
                                   + (f"; {resend} item(s) sent again" if resend else "")))
        return actions + self._pump(now)

    def _refused(self, header: Header) -> str | None:
        """Why a hello is refused, or None."""
        if header.type != "hello":
            return f"the first message must be a hello, not {header.type!r}"
        version = header.get("version")
        if version != str(RELAY_PROTOCOL_VERSION):
            return (f"this relay speaks the ferry relay protocol version {RELAY_PROTOCOL_VERSION}, the "
                    f"client version {version if version is not None else '(none: no version line)'}: "
                    f"use a client of version {RELAY_PROTOCOL_VERSION} (clients/r of the same Ferry as the relay), "
                    "or a relay of the client's version")
        if not hmac.compare_digest(header.get("token", "").encode(), self.token.encode()):
            return ("wrong token: read it from the relay's connection file (ferry relay --connection-file), which "
                    "only the relay's user can read")
        if self.client is not None:
            return f"the relay serves one client at a time and {self.client.name} is connected"
        order = header.get("order", "C")
        dtypes = [d for d in header.get("dtypes", ",".join(WIRE_DTYPES)).split(",") if d]
        unknown = [d for d in dtypes if d not in WIRE_DTYPES]
        if order not in ("C", "F") or unknown or not dtypes:
            return (f"order must be C or F (got {order!r}) and dtypes a list of {', '.join(WIRE_DTYPES)} "
                    f"(unknown: {', '.join(unknown) or 'none'})")
        for key in ("window", "pass", "consumed"):
            value = header.get(key)
            if value is not None and not (value.isdigit() and (key != "window" or int(value) >= 1)):
                return f"{key} must be a{' positive' if key == 'window' else ''} whole number, got {value!r}"
        if header.get("payload", "inline") not in ("inline", "file"):
            return f"payload must be inline or file, got {header.get('payload')!r}"
        return None

    def _credit(self, n: int, pass_no: int, now: float) -> list[Any]:
        if pass_no != self.pass_no:  # for items of a pass abandoned since: they are gone
            return []
        client = self.client
        if n < 1 or client is None or n > client.sent:
            return [Log("warning", f"credit {n} for {client.sent if client else 0} item(s) sent: ignored")]
        self._consume(n)
        client.sent -= n
        return self._pump(now)

    def _consume(self, n: int) -> None:
        for _ in range(max(0, min(n, len(self.held)))):
            item = self.held.popleft()
            self.consumed += 1
            self.figures["items_consumed"] += 1
            self.state = item.state
            if item.slot >= 0:
                self.free_slots.append(item.slot)
            if item.kind == "end":
                self.pass_done = True

    def _pulled(self, item: Item, now: float) -> list[Any]:
        if item.pass_no != self.pass_no:
            return []  # a pull of a pass abandoned meanwhile
        self.pulled += 1
        if item.kind == "end":
            self.pass_ended = True
        if item.kind == "batch":
            self.free_slots.sort()
            item.slot = self.free_slots.pop(0)
        self.held.append(item)
        client = self.client
        if client is None:
            return []
        client.sent += 1
        return [self._send(self._item(item), now)]

    def _pump(self, now: float) -> list[Any]:
        """Give the loader thread its next command: a client's command first, else the next pull, if any."""
        if self.busy is not None:
            return []
        if self.pending:
            conn, what, command = self.pending.popleft()
            if isinstance(command, StartPass):
                self._abandon()
                self.pass_no += 1
                self.pass_done = self.pass_ended = False
                command = StartPass(self.pass_no)
            self.busy = (conn, what, command)
            return [RunLoader(command)]
        if not self.pass_ended and self.pass_no and len(self.held) < self.window:
            command = PullItem(self.pass_no, self.pulled)
            self.busy = (None, "pull", command)
            return [RunLoader(command)]
        return []

    def _abandon(self) -> None:
        """A new pass: the old one's items are dropped (the client drops those it has, by their pass number)."""
        for item in self.held:
            if item.slot >= 0:
                self.free_slots.append(item.slot)
        self.held.clear()
        self.consumed = self.pulled = 0
        if self.client is not None:
            self.client.sent = 0

    # --- helpers ---
    def _item(self, item: Item) -> SendItem:
        client = self.client
        assert client is not None
        return SendItem(client.conn, item, client.order, client.dtypes, client.payload)

    def _send(self, action: Any, now: float) -> Any:
        if self.client is not None and action.conn is self.client.conn:
            self.client.last_send = now
            if isinstance(action, SendItem):
                self.figures["items_sent"] += 1
        return action

    def _reply(self, conn: Any, message: Send, now: float) -> Any:
        if conn is None or self.client is None or self.client.conn is not conn:
            return None  # its client left: nobody to answer
        return self._send(message, now)

    def _reply_error(self, conn: Any, what: str, error: ErrorReport, now: float) -> Any:
        return self._reply(conn, Send(conn, "error", {"reply": what, "class": error.cls,
                                                      "classes": ",".join(error.classes), "consumed": 0},
                                      {"message": error.message, "traceback": error.traceback}), now)

    def _figures(self) -> dict[str, Any]:
        return {**self.figures, "held": len(self.held), "window": self.window, "max_window": self.max_window,
                "pulling": int(isinstance(self.busy, PullItem)), "pass": self.pass_no, "consumed": self.consumed,
                "pulled": self.pulled, "client": self.client.name if self.client else None}

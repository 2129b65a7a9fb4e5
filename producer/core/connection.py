"""One producer's connection to one consumer, as a pure state machine: events in, actions out.

No sockets, no clock, no randomness of its own: the poll loop (:mod:`ferry.producer.io.service`) reads the
clock, passes ``now`` with every event, and applies the actions it gets back. So every transition can be
tested without a socket (tests/test_connection.py)::

    GREETING --WELCOME--> SERVING --(consumer silent LIVENESS x heartbeat, BYE, or REJECT)--> GREETING
        \\--REJECT(permanent)--> CLOSED  <--REJECT(permanent)-- SERVING

While GREETING, the producer says HELLO at once, then every heartbeat. A HELLO that cannot even be queued
(no connection yet: the socket has IMMEDIATE set) is sent again the moment the socket becomes writable, which
the loop watches for while :attr:`Connection.wants_writable` (event :meth:`~Connection.writable`): a producer
started before its consumer binds is welcomed as soon as libzmq connects, not a heartbeat later.

While SERVING it runs TASKs and PINGs, and answers a consumer's BYE with its own (:class:`AnswerBye`: the
consumer keeps the connection until then). Leaving SERVING drops that consumer's pending work (outcomes of the
old session are no longer :meth:`owns`-ed, so the loop discards them) and draws a new ``nonce``, so the
consumer can tell a fresh HELLO from a repeated one. If, while GREETING, no HELLO can even be queued (no connection: the socket has IMMEDIATE set) for
LIVENESS heartbeats on a socket that had been welcomed, the machine asks for a fresh socket
(:class:`Rebuild`): libzmq does not reconnect after a protocol error (an oversized frame, say), so a broken
or hostile peer would otherwise cut this endpoint off for good. A connection that merely waits (a cut
link, a consumer not started yet) keeps its socket.

While GREETING, no answer is warned about with back-off: after ``unreachable_warning_s`` (w, 10 s by
default), 3w, 6w, then every 30w (10 s, 30 s, 60 s, then every 5 minutes). Each warning asks the loop to
resolve the endpoint's host again (:class:`CheckAddress`, done off the loop); a host that does not resolve
is named as a DNS failure in the next warning.

Events: :meth:`Connection.receive` (a parsed message), :meth:`~Connection.tick` (time passes),
:meth:`~Connection.address_checked` (what resolving the host found),
:meth:`~Connection.sent` / :meth:`~Connection.hello_unsent` (what became of a send),
:meth:`~Connection.writable` (a connection came up while a HELLO waits for one),
:meth:`~Connection.stop`, :meth:`~Connection.invalid` (a message that failed validation: too many drop the
session), :meth:`~Connection.dataset_bound` (what became of the dataset a WELCOME named: a pool, common/pool.py;
such a WELCOME leaves the machine GREETING and asks the loop to :class:`OpenDataset`), and the task ledger
:meth:`~Connection.task_started` / :meth:`~Connection.task_finished`.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, Callable, Iterable

from ferry.common import protocol
from ferry.common.constants import (
    AUTH_RETRY_FIRST_S, AUTH_RETRY_MAX_S, MAX_INVALID_FROM_CONSUMER, MAX_PENDING_TASKS, MAX_WELCOME_HEARTBEAT_S,
    MIN_WELCOME_HEARTBEAT_S,
)
from ferry.common.errors import ProtocolError

# the actions this machine returns, declared in producer/core/actions.py (imported from here too)
from ferry.producer.core.actions import (
    Action, AnswerBye, CheckAddress, FailTask, Log, OpenDataset, Phase, Rebuild, RunTask, SendBye, SendHello,
    SendPing, Stale,
)
# the process's exit statuses are declared in producer/exits.py (these two are imported from here too)
from ferry.producer.exits import EXIT_OK, EXIT_REJECTED

__all__ = [
    "Phase", "Connection", "SendHello", "SendPing", "SendBye", "AnswerBye", "RunTask", "FailTask", "CheckAddress",
    "Stale", "Rebuild", "OpenDataset", "Log", "Action",
    "exit_code", "warning_due", "EXIT_OK", "EXIT_REJECTED",
]


def warning_due(w: float, given: int) -> float:
    """Seconds of waiting after which "no consumer has answered" warning number ``given`` (from 0) is due, for a
    first warning after ``w``: w, 3w, 6w, then every 30w."""
    return (w, 3 * w, 6 * w)[given] if given < 3 else 6 * w + 30 * w * (given - 2)


class Connection:
    """The state of one consumer endpoint, changed only by events.

    Args:
        endpoint: the consumer's endpoint (for log lines only).
        now: the clock at creation. [Unit: second]
        heartbeat: seconds between HELLOs until a WELCOME sets the consumer's own. [Unit: second]
        liveness: heartbeats of silence after which a consumer is gone.
        unreachable_warning_s: first warn when no consumer answered for this long, then with back-off.
            [Unit: second]
        dataset_len: samples in the dataset; a TASK index beyond it is a protocol error.
        new_nonce: draws a fresh nonce (the loop's randomness, injected). By default from the OS: never from the
            process's global ``random``, whose stream is the dataset's, seeded as a DataLoader worker's.
    """

    def __init__(self, endpoint: str, *, now: float, heartbeat: float, liveness: int,
                 unreachable_warning_s: float, dataset_len: int,
                 new_nonce: Callable[[], int] = lambda: secrets.randbits(62)) -> None:
        self.endpoint = endpoint
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.unreachable_warning_s = unreachable_warning_s
        self.dataset_len = dataset_len
        self._new_nonce = new_nonce
        self.phase = Phase.GREETING
        self.session: int | None = None
        self.nonce = new_nonce()
        self.pending = 0  # tasks of the current session not yet answered
        self.started = now  # when the current GREETING began
        self.last_heard = 0.0
        self.last_sent = 0.0  # 0: say HELLO at the first tick
        self.warnings = 0  # "no consumer answers" warnings given in this GREETING
        self.address_problem: str | None = None  # the endpoint's host does not resolve: why
        self.unsendable_since: float | None = None  # GREETING, and no HELLO could be queued, since when
        self.welcomed_here = False  # a consumer welcomed us on this socket (so a connection existed)
        self.awaiting_connection = False  # GREETING, and the last HELLO found no connection to go out on
        self.denials = 0  # the consumer refused our CURVE key this many times in a row
        self.rebuild_at: float | None = None  # when to retry with a fresh socket after a denial
        self.invalid_messages = 0  # invalid messages of the current session (see invalid)
        self.held = False  # the producer takes no work (hold): no HELLO goes out, no WELCOME is taken

    @property
    def serving(self) -> bool:
        return self.phase is Phase.SERVING

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED

    @property
    def wants_writable(self) -> bool:
        """Whether the loop should tell this machine when the socket becomes writable (:meth:`writable`)."""
        return self.awaiting_connection and self.phase is Phase.GREETING

    def owns(self, session: int) -> bool:
        """Whether an outcome of ``session`` may still be sent (else the loop discards it)."""
        return self.phase is Phase.SERVING and self.session == session

    # --- events -----------------------------------------------------------------------------------------
    def receive(self, header: dict[str, Any], nframes: int, now: float) -> list[Action]:
        """A message from the consumer, already validated by :func:`ferry.common.protocol.parse_header`.

        Raises:
            ProtocolError: the message is not acceptable now (the loop counts and drops it).
        """
        kind = header["type"]
        if kind == protocol.WELCOME:
            return self._welcome(header, now)
        if kind == protocol.REJECT:
            return self._reject(header, now)
        if self.phase is not Phase.SERVING:
            if kind not in (protocol.PING, protocol.TASK, protocol.BYE):
                raise ProtocolError(f"{kind} before WELCOME")
            return [Stale()]  # sent before the consumer saw our new HELLO (across a link that was down)
        self.last_heard = now
        if kind == protocol.TASK:
            return self._tasks(header, nframes)
        if kind == protocol.BYE:  # answered at once: the consumer closes the connection once we have read it
            return [AnswerBye(), *self._reset(Phase.GREETING, now, logging.INFO,
                                              f"consumer at {self.endpoint} said BYE", "consumer_bye")]
        if kind != protocol.PING:
            raise ProtocolError(f"unexpected {kind} from a consumer")
        return []

    def tick(self, now: float) -> list[Action]:
        """Time passes: HELLO while greeting, PING or give up on a silent consumer while serving."""
        self.held = False
        if self.rebuild_at is not None and now >= self.rebuild_at:  # retry a denied key (auth_denied)
            self.rebuild_at = None
            return [Rebuild()]
        if self.phase is Phase.GREETING and now - self.last_sent >= self.heartbeat:
            self.last_sent = now  # also when the send finds no peer: retry next heartbeat
            actions: list[Action] = [SendHello(self.nonce)]
            waited = now - self.started
            if waited > self._warning_due(self.warnings):
                self.warnings += 1
                dns = f"; {self.address_problem}" if self.address_problem else ""
                actions += [Log(logging.WARNING, f"no consumer has answered at {self.endpoint} for {waited:.0f} s"
                                                 f"{dns}; still trying (next warning after "
                                                 f"{self._warning_due(self.warnings):.0f} s)",
                                {"event": "unreachable", "waited_s": round(waited, 1)}), CheckAddress()]
            return actions
        if self.phase is Phase.SERVING:
            silent = now - self.last_heard
            if silent > self.liveness * self.heartbeat:
                return self._reset(Phase.GREETING, now, logging.WARNING,
                                   f"consumer at {self.endpoint} silent for {silent:.1f} s; "
                                   "dropping its work and saying HELLO again", "consumer_silent")
            if now - self.last_sent >= self.heartbeat:
                return [SendPing(self.pending)]
        return []

    def hold(self, now: float) -> None:
        """Instead of :meth:`tick` while the producer takes no work (producer/core/stuck.py): a greeting connection
        says no HELLO, and its wait for a consumer starts again when the hold ends (no warning that no consumer
        answers: none was asked). A serving one is not held."""
        if self.phase is Phase.GREETING:
            self.started, self.warnings, self.last_sent, self.awaiting_connection = now, 0, 0.0, False
            self.held = True  # until the next tick: a WELCOME to an earlier HELLO is not taken meanwhile

    def _warning_due(self, given: int) -> float:
        """Seconds of GREETING after which warning number ``given`` (from 0) is due: w, 3w, 6w, then every 30w."""
        return warning_due(self.unreachable_warning_s, given)

    def auth_denied(self, now: float) -> list[Action]:
        """The consumer refused this producer's CURVE key. libzmq never retries a denied handshake on its own,
        so the machine asks for a fresh socket after a back-off (AUTH_RETRY_FIRST_S, doubling up to
        AUTH_RETRY_MAX_S): a key that the consumer authorizes later (it reads its folder at every handshake)
        gets in without a restart. Warned about once per run of denials."""
        delay = min(AUTH_RETRY_FIRST_S * 2 ** min(self.denials, 16), AUTH_RETRY_MAX_S)
        self.denials += 1
        self.rebuild_at = now + delay
        level = logging.WARNING if self.denials == 1 else logging.DEBUG
        return [Log(level, f"the consumer at {self.endpoint} denied this producer's CURVE key (is its public key "
                           f"in the consumer's authorized folder?); trying again in {delay:.1f} s, then with back-off",
                    {"event": "auth_denied", "retry_s": delay})]

    def address_checked(self, problem: str | None) -> None:
        """What resolving the endpoint's host found: None (it resolves, or it has no host), else why not."""
        self.address_problem = problem

    def sent(self, now: float) -> None:
        """A message left on this connection's socket (any message: a batch postpones the next PING)."""
        self.last_sent = now
        if self.phase is Phase.GREETING:  # greeting, the only message sent is HELLO
            self.unsendable_since = None
            self.awaiting_connection = False

    def writable(self, now: float) -> list[Action]:
        """The socket can take a message now. While a HELLO waits for a connection, say it at once."""
        if not self.wants_writable:
            return []
        self.awaiting_connection = False
        self.last_sent = now  # the heartbeat's HELLO schedule counts from this one
        return [SendHello(self.nonce)]

    def hello_unsent(self, now: float) -> list[Action]:
        """A HELLO could not even be queued: the socket has no connection. It goes out once it is writable."""
        self.awaiting_connection = self.phase is Phase.GREETING
        if self.unsendable_since is None:
            self.unsendable_since = now
            return []
        if self.welcomed_here and now - self.unsendable_since > self.liveness * self.heartbeat:
            self.unsendable_since = None
            self.welcomed_here = False  # libzmq connects a fresh socket by itself once a consumer listens
            return [Log(logging.WARNING, f"no connection to {self.endpoint} for {self.liveness} heartbeats: "
                                         "rebuilding the socket", {"event": "rebuild"}), Rebuild()]
        return []

    def stop(self) -> list[Action]:
        """The producer stops: say BYE where a consumer is being served."""
        return [SendBye()] if self.phase is Phase.SERVING else []

    def task_started(self) -> None:
        self.pending += 1

    def task_finished(self) -> None:
        self.pending -= 1

    # --- transitions ------------------------------------------------------------------------------------
    def invalid(self, now: float) -> list[Action]:
        """A message from this consumer failed validation (the loop counted and dropped it). The
        MAX_INVALID_FROM_CONSUMER-th of one session drops that session, as a silent consumer's is: its work is
        dropped and a new HELLO goes out, so that a broken or hostile consumer holds nothing of the producer's."""
        if self.phase is not Phase.SERVING:
            return []
        self.invalid_messages += 1
        if self.invalid_messages < MAX_INVALID_FROM_CONSUMER:
            return []
        return self._reset(Phase.GREETING, now, logging.WARNING,
                           f"consumer at {self.endpoint} sent {self.invalid_messages} invalid messages: dropping its "
                           "work and saying HELLO again", "consumer_invalid")

    def dataset_bound(self, dataset_len: int, refused: str | None, now: float) -> list[Action]:
        """What became of the dataset a WELCOME named (:class:`OpenDataset`): this connection now serves it,
        TASK indices below ``dataset_len``; or it may not (``refused``: why). Either way the next HELLO, said at
        once, announces it or the refusal (common/pool.py)."""
        if self.phase is not Phase.GREETING:
            return []
        self.dataset_len = dataset_len
        self.last_sent = now
        actions: list[Action] = [SendHello(self.nonce)]
        if self.held:  # it goes out at the first tick after the hold
            self.last_sent, actions = 0.0, []
        if refused is not None:
            actions.insert(0, Log(logging.ERROR, f"consumer at {self.endpoint} named a dataset this producer does "
                                                 f"not serve: {refused}", {"event": "dataset_refused"}))
        return actions

    def _welcome(self, header: dict[str, Any], now: float) -> list[Action]:
        if header["nonce"] != self.nonce:
            raise ProtocolError("WELCOME for an earlier HELLO")
        if self.phase is not Phase.GREETING or self.held:
            return []  # a repeated WELCOME (we said HELLO twice before it came), or one the hold does not take
        if "dataset" in header:  # not admitted yet: the consumer names the dataset it wants (common/pool.py)
            self.last_heard = now
            return [OpenDataset(header["dataset"]["spec"], header["dataset"]["args"])]
        self.phase, self.session, self.invalid_messages = Phase.SERVING, header["session"], 0
        self.welcomed_here, self.awaiting_connection = True, False
        self.denials, self.rebuild_at = 0, None
        self.heartbeat = min(max(float(header["heartbeat"]), MIN_WELCOME_HEARTBEAT_S), MAX_WELCOME_HEARTBEAT_S)
        self.last_heard, self.warnings, self.address_problem = now, 0, None
        return [Log(logging.INFO, f"serving consumer at {self.endpoint} (session {self.session:x})",
                    {"event": "welcomed", "session": f"{self.session:x}"})]

    def _reject(self, header: dict[str, Any], now: float) -> list[Action]:
        if header["permanent"]:
            return self._reset(Phase.CLOSED, now, logging.ERROR,
                               f"consumer at {self.endpoint} rejected this producer: {header['reason']}", "rejected",
                               reason=header["reason"])
        if self.phase is Phase.SERVING:  # while GREETING we are saying HELLO already
            return self._reset(Phase.GREETING, now, logging.INFO,
                               f"consumer at {self.endpoint} asks for a new HELLO: {header['reason']}", "rehello",
                               reason=header["reason"])
        return []

    def _tasks(self, header: dict[str, Any], nframes: int) -> list[Action]:
        """A TASK: one action per task it carries (several when the consumer bundled them: HELLO ``tasks``)."""
        if nframes != 1:
            raise ProtocolError(f"TASK with {nframes} frames")
        if header["session"] != self.session:
            raise ProtocolError(f"TASK for session {header['session']:x}, serving {self.session:x}")
        tasks = protocol.task_headers(header)
        if self.pending + len(tasks) > MAX_PENDING_TASKS:
            raise ProtocolError(f"TASK beyond {MAX_PENDING_TASKS} pending tasks")
        return [self._task(task) for task in tasks]

    def _task(self, header: dict[str, Any]) -> RunTask | FailTask:
        bad = next((i for i in header["indices"] if i >= self.dataset_len), None)
        if bad is not None:
            return FailTask(header, bad, f"sample index {bad} is out of range for {self.dataset_len} samples")
        return RunTask(header)

    def _reset(self, phase: Phase, now: float, level: int, why: str, event: str, **fields: str) -> list[Action]:
        self.phase, self.session, self.pending = phase, None, 0
        self.nonce = self._new_nonce()
        self.started, self.warnings = now, 0
        self.last_sent = 0.0  # say HELLO at the next tick
        self.awaiting_connection = False
        return [Log(level, why, {"event": event, **fields})]


def exit_code(connections: Iterable[Connection]) -> int | None:
    """The producer's exit code once every consumer rejected it for good; None while one may still serve."""
    return EXIT_REJECTED if all(c.closed for c in connections) else None

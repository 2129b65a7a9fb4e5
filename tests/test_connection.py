"""The producer's connection state machine, without sockets: every transition, driven by events and a
clock the test controls."""

from __future__ import annotations

import itertools
import logging

import pytest

from ferry.common import protocol
from ferry.common.constants import AUTH_RETRY_FIRST_S, AUTH_RETRY_MAX_S, MAX_PENDING_TASKS
from ferry.common.errors import ProtocolError
from tests.helpers import welcome_fields
from ferry.producer.core.connection import (
    EXIT_REJECTED, AnswerBye, CheckAddress, Connection, FailTask, Log, Phase, Rebuild, RunTask, SendBye, SendHello,
    SendPing, Stale, exit_code,
)

HEARTBEAT = 1.0
LIVENESS = 3


def make(now: float = 100.0, **kwargs) -> Connection:
    nonces = itertools.count(1)
    options = dict(now=now, heartbeat=HEARTBEAT, liveness=LIVENESS, unreachable_warning_s=10.0, dataset_len=50,
                   new_nonce=lambda: next(nonces))
    options.update(kwargs)
    return Connection("tcp://trainer:5555", **options)


def welcome(conn: Connection, session: int = 0xA, heartbeat: float = HEARTBEAT, nonce: int | None = None) -> dict:
    return protocol.make_header(protocol.WELCOME, session=session, heartbeat=heartbeat,
                                nonce=conn.nonce if nonce is None else nonce, **welcome_fields())


def task(session: int = 0xA, indices=(0, 1), **extra) -> dict:
    return protocol.make_header(protocol.TASK, session=session, task=7, epoch=0, seq=3, indices=list(indices),
                                on_error="raise", **extra)


def reject(permanent: bool) -> dict:
    return protocol.make_header(protocol.REJECT, reason="why not", permanent=permanent)


def serving(now: float = 100.0) -> Connection:
    conn = make(now)
    conn.tick(now)
    conn.sent(now)
    conn.receive(welcome(conn), 1, now)
    assert conn.phase is Phase.SERVING
    return conn


def kinds(actions) -> list[type]:
    return [type(a) for a in actions if not isinstance(a, Log)]


# --- GREETING ------------------------------------------------------------------------------------------------
def test_greeting_says_hello_at_once_then_every_heartbeat():
    conn = make(100.0)
    assert conn.tick(100.0) == [SendHello(conn.nonce)]
    conn.sent(100.0)
    assert conn.tick(100.5) == []  # not yet a heartbeat later
    assert conn.tick(101.0) == [SendHello(conn.nonce)]
    assert conn.phase is Phase.GREETING


def test_a_hello_that_finds_no_peer_is_retried_a_heartbeat_later_not_at_once():
    conn = make(100.0)
    assert kinds(conn.tick(100.0)) == [SendHello]
    assert conn.hello_unsent(100.0) == []  # the first unsendable HELLO only starts the count
    assert conn.tick(100.2) == []
    assert kinds(conn.tick(101.0)) == [SendHello]


def test_a_hello_that_finds_no_connection_goes_out_the_moment_the_socket_is_writable():
    conn = make(100.0)
    assert not conn.wants_writable  # nothing to wait for before the first HELLO
    assert kinds(conn.tick(100.0)) == [SendHello]
    conn.hello_unsent(100.0)
    assert conn.wants_writable  # the loop now watches the socket for POLLOUT
    assert conn.tick(100.01) == []  # the tick schedule alone would wait a heartbeat
    assert conn.writable(100.012) == [SendHello(conn.nonce)]  # libzmq connected: at once, not at the next tick
    assert not conn.wants_writable  # one HELLO per connection event, never a stream of them
    assert conn.writable(100.013) == []
    conn.sent(100.012)
    assert conn.tick(100.5) == []  # the heartbeat schedule counts from that HELLO
    assert kinds(conn.tick(101.012)) == [SendHello]


def test_a_hello_sent_on_writable_that_still_finds_no_connection_waits_again():
    conn = make(100.0)
    conn.tick(100.0)
    conn.hello_unsent(100.0)
    assert kinds(conn.writable(100.01)) == [SendHello]
    conn.hello_unsent(100.01)  # the connection dropped again in between
    assert conn.wants_writable and conn.unsendable_since == 100.0  # the Rebuild count is not restarted
    conn.receive(welcome(conn), 1, 100.02)
    assert not conn.wants_writable and conn.writable(100.03) == []  # serving: POLLOUT means nothing


def test_writable_while_serving_or_after_a_hello_went_out_does_nothing():
    conn = make(100.0)
    conn.tick(100.0)
    conn.sent(100.0)
    assert not conn.wants_writable and conn.writable(100.1) == []
    conn = serving()
    conn.tick(104.5)  # silent consumer: back to GREETING, HELLO due at the next tick, not on POLLOUT
    assert conn.phase is Phase.GREETING and not conn.wants_writable


def test_welcome_starts_serving_with_the_consumers_heartbeat_bounded():
    conn = make()
    actions = conn.receive(welcome(conn, session=0xBEEF, heartbeat=0.001), 1, 100.0)
    assert conn.phase is Phase.SERVING and conn.session == 0xBEEF and conn.serving
    assert conn.heartbeat == 0.05  # a consumer cannot make us spin
    assert any(isinstance(a, Log) and "beef" in a.message for a in actions)
    conn = make()
    conn.receive(welcome(conn, heartbeat=1e9), 1, 100.0)
    assert conn.heartbeat == 60.0


def test_welcome_for_an_earlier_hello_is_a_protocol_error():
    conn = make()
    with pytest.raises(ProtocolError, match="earlier HELLO"):
        conn.receive(welcome(conn, nonce=conn.nonce + 1), 1, 100.0)
    assert conn.phase is Phase.GREETING


def test_a_repeated_welcome_while_serving_changes_nothing():
    conn = serving()
    assert conn.receive(welcome(conn, session=0xC), 1, 101.0) == []
    assert conn.session == 0xA


@pytest.mark.parametrize("kind", [protocol.PING, protocol.TASK, protocol.BYE])
def test_messages_of_a_left_session_while_greeting_are_stale(kind):
    conn = make()
    header = task() if kind == protocol.TASK else protocol.make_header(kind, load={})
    assert conn.receive(header, 1, 100.0) == [Stale()]
    assert conn.phase is Phase.GREETING


def test_other_messages_before_welcome_are_protocol_errors():
    conn = make()
    with pytest.raises(ProtocolError, match="before WELCOME"):
        conn.receive(protocol.make_header(protocol.HELLO), 1, 100.0)


def unreachable_warnings(conn: Connection, start: float, seconds: int) -> list[tuple[int, Log, bool]]:
    """(second, warning, whether an address check came with it), ticking once a second."""
    out = []
    for second in range(0, seconds):
        actions = conn.tick(start + second)
        conn.hello_unsent(start + second)
        out += [(second, a, CheckAddress() in actions) for a in actions if isinstance(a, Log)
                and a.level == logging.WARNING]
    return out


def test_unreachable_consumer_is_warned_with_back_off_10_30_60_then_every_5_minutes():
    conn = make(100.0, unreachable_warning_s=10.0)
    warnings = unreachable_warnings(conn, 100.0, 1000)
    assert [second for second, _, _ in warnings] == [11, 31, 61, 361, 661, 961]
    assert all("still trying" in w.message and checked for _, w, checked in warnings)
    assert "for 11 s" in warnings[0][1].message and "next warning after 30 s" in warnings[0][1].message


def test_a_host_that_does_not_resolve_is_named_as_a_dns_failure_and_forgotten_once_welcomed():
    conn = make(100.0, unreachable_warning_s=5.0)
    conn.address_checked("its host 'trainr' does not resolve (DNS: Name or service not known)")
    first = unreachable_warnings(conn, 100.0, 8)
    assert len(first) == 1 and "'trainr' does not resolve (DNS" in first[0][1].message
    conn.address_checked(None)  # the name resolves now (a DNS record appeared)
    later = unreachable_warnings(conn, 108.0, 10)
    assert len(later) == 1 and "DNS" not in later[0][1].message
    conn.address_checked("bad")
    conn.receive(welcome(conn), 1, 120.0)
    assert conn.address_problem is None and conn.warnings == 0


def test_warnings_start_over_when_a_served_consumer_goes_silent():
    conn = make(100.0)
    assert len(unreachable_warnings(conn, 100.0, 40)) == 2  # 10 s and 30 s, the next one due at 60 s
    conn.receive(welcome(conn), 1, 140.0)
    conn.tick(150.0)  # silent for 10 s > LIVENESS heartbeats: back to GREETING, at 150
    assert conn.phase is Phase.GREETING
    assert [second for second, _, _ in unreachable_warnings(conn, 151.0, 40)] == [10, 30]


# --- SERVING -------------------------------------------------------------------------------------------------
def test_serving_pings_every_heartbeat_and_a_sent_batch_postpones_the_ping():
    conn = serving(100.0)
    assert conn.tick(100.5) == []
    assert conn.tick(101.0) == [SendPing(0)]
    conn.sent(101.0)
    conn.receive(protocol.make_header(protocol.PING, load={}), 1, 101.5)
    conn.sent(101.8)  # a batch left
    assert conn.tick(102.5) == []
    assert conn.tick(102.8) == [SendPing(0)]


def test_task_is_run_and_counted_until_answered():
    conn = serving()
    header = task()
    assert conn.receive(header, 1, 100.5) == [RunTask(header)]
    conn.task_started()
    assert conn.pending == 1 and conn.tick(101.0) == [SendPing(1)]
    assert conn.owns(0xA) and not conn.owns(0xB)
    conn.task_finished()
    assert conn.pending == 0


@pytest.mark.parametrize("header, nframes, match", [
    (task(session=0xB), 1, "session b, serving a"),
    (task(), 2, "2 frames"),
])
def test_bad_tasks_are_protocol_errors(header, nframes, match):
    conn = serving()
    with pytest.raises(ProtocolError, match=match):
        conn.receive(header, nframes, 100.5)
    assert conn.phase is Phase.SERVING and conn.pending == 0


def test_a_task_naming_a_sample_outside_the_dataset_is_answered_with_a_fail_naming_it():
    conn = serving()
    header = task(indices=(0, 50))
    assert conn.receive(header, 1, 100.5) == [FailTask(header, 50, "sample index 50 is out of range for 50 samples")]
    assert conn.phase is Phase.SERVING and conn.pending == 0  # answered at once, nothing runs


def test_tasks_beyond_the_pending_bound_are_refused():
    conn = serving()
    for _ in range(MAX_PENDING_TASKS):
        conn.receive(task(), 1, 100.5)
        conn.task_started()
    with pytest.raises(ProtocolError, match="pending"):
        conn.receive(task(), 1, 100.5)


def test_a_silent_consumer_is_left_its_work_dropped_and_hello_said_again():
    conn = serving(100.0)
    conn.receive(task(), 1, 100.0)
    conn.task_started()
    old_nonce = conn.nonce
    assert conn.tick(100.0 + LIVENESS * HEARTBEAT) == [SendPing(1)]  # exactly LIVENESS beats: still alive
    actions = conn.tick(100.1 + LIVENESS * HEARTBEAT)
    assert [a.level for a in actions if isinstance(a, Log)] == [logging.WARNING]
    assert conn.phase is Phase.GREETING and conn.pending == 0 and conn.session is None
    assert conn.nonce != old_nonce  # the consumer tells the new HELLO from the old one
    assert not conn.owns(0xA)  # results of the dropped work are discarded, not sent
    assert kinds(conn.tick(103.2)) == [SendHello]  # at once, not a heartbeat later


def test_messages_keep_a_consumer_alive():
    conn = serving(100.0)
    for second in range(1, 20):
        conn.receive(protocol.make_header(protocol.PING, load={}), 1, 100.0 + second)
        conn.tick(100.0 + second)
    assert conn.phase is Phase.SERVING


def test_bye_from_the_consumer_is_answered_at_once_and_returns_to_greeting():
    conn = serving()
    actions = conn.receive(protocol.make_header(protocol.BYE), 1, 101.0)
    assert actions[0] == AnswerBye() and [type(a) for a in actions[1:]] == [Log], actions  # the answer first
    assert conn.phase is Phase.GREETING and conn.session is None
    assert SendHello(conn.nonce) in conn.tick(101.0)  # the answer does not postpone the HELLO


def test_unexpected_message_while_serving_is_a_protocol_error():
    conn = serving()
    with pytest.raises(ProtocolError, match="unexpected HELLO"):
        conn.receive(protocol.make_header(protocol.HELLO), 1, 101.0)


def test_temporary_reject_while_serving_asks_for_a_new_hello_and_is_ignored_while_greeting():
    conn = serving()
    nonce = conn.nonce
    conn.receive(reject(permanent=False), 1, 101.0)
    assert conn.phase is Phase.GREETING and conn.nonce != nonce
    nonce = conn.nonce
    assert conn.receive(reject(permanent=False), 1, 101.5) == []
    assert conn.phase is Phase.GREETING and conn.nonce == nonce  # saying HELLO already: nothing to redo


@pytest.mark.parametrize("start", ["greeting", "serving"])
def test_permanent_reject_closes_and_a_closed_connection_is_silent(start):
    conn = make() if start == "greeting" else serving()
    actions = conn.receive(reject(permanent=True), 1, 101.0)
    assert conn.phase is Phase.CLOSED and conn.closed
    assert [a.level for a in actions if isinstance(a, Log)] == [logging.ERROR]
    assert conn.tick(200.0) == [] and conn.stop() == []


def test_exit_code_only_once_every_connection_is_closed():
    one, two = make(), serving()
    assert exit_code([one, two]) is None
    one.receive(reject(permanent=True), 1, 101.0)
    assert exit_code([one, two]) is None
    two.receive(reject(permanent=True), 1, 101.0)
    assert exit_code([one, two]) == EXIT_REJECTED


def test_stop_says_bye_only_while_serving():
    assert make().stop() == []
    assert serving().stop() == [SendBye()]


# --- rebuild after a protocol error, rejoin after a consumer restart --------------------------------------
def test_socket_is_rebuilt_when_a_welcomed_connection_cannot_send_hello_for_liveness_heartbeats():
    conn = serving(100.0)
    conn.tick(104.0)  # the consumer dropped the connection (say, a frame too big): silent, back to GREETING
    assert conn.phase is Phase.GREETING
    now, rebuilt = 104.0, []
    while now < 120.0 and not rebuilt:
        now += HEARTBEAT
        for action in conn.tick(now):
            if isinstance(action, SendHello):
                rebuilt = [a for a in conn.hello_unsent(now) if isinstance(a, Rebuild)]
    assert rebuilt == [Rebuild()]
    # the first unsendable HELLO starts the count; the rebuild comes once LIVENESS beats more have passed
    assert now == 105.0 + (LIVENESS + 1) * HEARTBEAT
    assert not conn.welcomed_here and conn.unsendable_since is None
    for _ in range(10):  # a fresh socket that never connected is not rebuilt again and again
        now += HEARTBEAT
        conn.tick(now)
        assert not any(isinstance(a, Rebuild) for a in conn.hello_unsent(now))


def test_a_socket_that_never_connected_is_kept():
    conn = make(100.0)
    for second in range(1, 30):
        conn.tick(100.0 + second)
        assert conn.hello_unsent(100.0 + second) == []  # a consumer not started yet: libzmq keeps trying


def test_a_hello_that_goes_out_resets_the_unsendable_count():
    conn = serving(100.0)
    conn.tick(104.0)  # silent consumer: GREETING
    rebuilt_at = []
    for now in (105.0, 106.0, 107.0, 108.0, 109.0, 110.0, 111.0, 112.0):
        assert kinds(conn.tick(now)) == [SendHello]
        if now == 107.0:
            conn.sent(now)  # the link came back for a moment: the count starts over
        elif any(isinstance(a, Rebuild) for a in conn.hello_unsent(now)):
            rebuilt_at.append(now)
    assert rebuilt_at == [112.0]  # 108 + more than LIVENESS beats; without the reset it would be 109


def test_a_denied_key_asks_for_a_fresh_socket_after_a_back_off_that_doubles_and_warns_once():
    conn = make(100.0)
    conn.tick(100.0)
    actions = conn.auth_denied(100.0)
    assert [a.level for a in actions if isinstance(a, Log)] == [logging.WARNING]
    assert "denied this producer's CURVE key" in actions[0].message
    assert Rebuild not in kinds(conn.tick(100.0 + AUTH_RETRY_FIRST_S - 0.01))
    assert kinds(conn.tick(100.0 + AUTH_RETRY_FIRST_S)) == [Rebuild]
    assert Rebuild not in kinds(conn.tick(100.0 + AUTH_RETRY_FIRST_S + 0.01))  # once per denial
    now = 101.0
    again = conn.auth_denied(now)  # denied again: twice the delay, and no second warning
    assert [a.level for a in again if isinstance(a, Log)] == [logging.DEBUG]
    assert Rebuild not in kinds(conn.tick(now + 2 * AUTH_RETRY_FIRST_S - 0.01))
    assert kinds(conn.tick(now + 2 * AUTH_RETRY_FIRST_S)) == [Rebuild]
    for _ in range(40):  # the back-off is bounded
        conn.auth_denied(now)
    assert conn.rebuild_at == now + AUTH_RETRY_MAX_S


def test_a_welcome_forgets_the_denials():
    conn = make(100.0)
    conn.tick(100.0)
    conn.sent(100.0)
    conn.auth_denied(100.0)
    conn.auth_denied(100.0)
    conn.receive(welcome(conn), 1, 100.2)
    assert conn.denials == 0 and conn.rebuild_at is None
    assert Rebuild not in kinds(conn.tick(200.0))
    assert [a.level for a in conn.auth_denied(300.0) if isinstance(a, Log)] == [logging.WARNING]  # a new run: warned


def test_rejoin_after_a_consumer_restart():
    conn = serving(100.0)
    conn.receive(task(), 1, 100.2)
    conn.task_started()
    # the consumer process dies: silence, then the producer says HELLO again with a new nonce
    conn.tick(104.0)
    assert conn.phase is Phase.GREETING
    actions = conn.tick(104.0)
    assert actions == [SendHello(conn.nonce)]
    conn.sent(104.0)
    # a TASK of the old consumer that was still on the wire is stale, not an error
    assert conn.receive(task(), 1, 104.1) == [Stale()]
    # the restarted consumer welcomes the new HELLO with a new session
    conn.receive(welcome(conn, session=0xB), 1, 104.5)
    assert conn.phase is Phase.SERVING and conn.session == 0xB and conn.pending == 0
    assert conn.owns(0xB) and not conn.owns(0xA)
    header = task(session=0xB)
    assert conn.receive(header, 1, 104.6) == [RunTask(header)]
    with pytest.raises(ProtocolError):
        conn.receive(task(session=0xA), 1, 104.7)


def test_stop_from_a_signal_handler_that_interrupted_the_waker_does_not_deadlock():
    """A second SIGTERM once deadlocked a producer: its handler ran stop() on the main thread while that
    thread was inside a lock stop() needed. stop() must complete even when its thread holds the waker's lock."""
    import threading

    from ferry.common.waker import Waker

    waker = Waker()
    done = threading.Event()

    def handler_inside_wake():  # what a signal handler does when it interrupts wake() on the same thread
        with waker._lock:
            waker.wake()
        done.set()

    worker = threading.Thread(target=handler_inside_wake, daemon=True)
    worker.start()
    worker.join(5)
    waker.close()
    assert done.is_set(), "wake() deadlocked on its own thread's lock"

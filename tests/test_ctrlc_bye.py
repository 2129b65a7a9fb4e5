"""Ctrl-C of a training script reaches its producers as a BYE at once, not after their liveness window.

A producer's DEALER (IMMEDIATE) drops what it has not read yet the moment its connection goes, and the
consumer's close used to close the connection right after its BYE left: a producer whose main loop did not
read within that fraction of a millisecond (busy, or only waiting for the GIL) lost the BYE and called the
consumer silent a liveness window later. Here each producer is stopped (SIGSTOP) until the BYE waits in its
socket, so its loop cannot read it sooner, and continued at once: the consumer must keep the connection until
the producer has read the BYE. Real producer processes, a real trainer process sent SIGINT; every wait bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import zmq

from ferry.common import protocol
from ferry.common.constants import CONSUMER_BYE_LINGER_MS
from ferry.consumer.io.router import Router

from .helpers import REPO, HandMadeConsumer, producer_env, welcome_fields, wait_for

#: well below the trainer's liveness window (heartbeat 10 s x liveness 2)
BYE_WITHIN_S = 2.0


def unread_bytes(pid: int, port: int) -> int:
    """Bytes waiting unread in the receive queues of process ``pid``'s TCP connections to ``port``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    waiting = 0
    with open(f"/proc/{pid}/net/tcp") as table:
        next(table)  # the header
        for row in table:
            cols = row.split()  # sl local remote state tx:rx ... uid timeout inode
            if cols[9] in inodes and int(cols[2].split(":")[1], 16) == port:
                waiting += int(cols[4].split(":")[1], 16)
    return waiting


def test_sigint_of_the_trainer_says_bye_to_producers_that_read_it_late(endpoint, spawn, tmp_path):
    port = int(endpoint.rsplit(":", 1)[1])
    producers = [spawn(endpoint, "synthetic", {"length": 64}) for _ in range(2)]
    out = tmp_path / "trainer.out"
    with open(out, "w") as sink:
        trainer = subprocess.Popen([sys.executable, "-m", "tests.ctrlc_trainer", endpoint], cwd=REPO,
                                   env=producer_env(), stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)

    def missed() -> list[int]:
        return [p.pid for p in producers if "said BYE" not in p.output()]

    try:
        wait_for(lambda: "READY" in out.read_text(), 60, "the trainer's first batches")
        wait_for(lambda: all("serving consumer" in p.output() for p in producers), 10, "every producer to serve")
        wait_for(lambda: not any(unread_bytes(p.pid, port) for p in producers), 10, "every producer to read all")
        for p in producers:
            p.proc.send_signal(signal.SIGSTOP)
        trainer.send_signal(signal.SIGINT)  # the trainer is in its step
        sent = time.monotonic()
        wait_for(lambda: all(unread_bytes(p.pid, port) for p in producers), 10, "the BYE in every producer's socket",
                 interval=0.002)
        for p in producers:
            p.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: not missed(), BYE_WITHIN_S, "every producer to log the consumer's BYE", interval=0.01)
        took = time.monotonic() - sent
        code = trainer.wait(15)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; producers without it: {missed()}\n--- trainer\n{out.read_text()}\n"
                             + "\n".join(f"--- producer {p.pid}\n{p.output()}" for p in producers)) from None
    finally:
        for p in producers:
            p.proc.send_signal(signal.SIGCONT)
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(10)
    assert code == -signal.SIGINT, (code, out.read_text())  # the KeyboardInterrupt ended it, through `with`
    assert took < BYE_WITHIN_S and not any("silent for" in p.output() for p in producers), took


def test_close_waits_for_each_producer_to_answer_its_bye_and_no_longer_than_its_bound(endpoint):
    """Router.close keeps the connections until each peer answered its BYE; one that never does costs
    CONSUMER_BYE_LINGER_MS, not more."""
    router = Router([endpoint], max_batch_bytes=1 << 20, give_up_after=5.0)
    ctx = zmq.Context()
    dealers: dict[bytes, zmq.Socket] = {}  # by the routing id the router knows each by
    for _ in range(2):
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IMMEDIATE, 1)  # as a producer's
        dealer.connect(endpoint)
        dealer.send(protocol.pack(protocol.PING, load={}))
        frames = wait_for(router.recv, 10, "the peer's first message")
        dealers[bytes(frames[0])] = dealer
    answering, silent = dealers

    def answer() -> None:
        sock = dealers[answering]
        if sock.poll(10_000) and protocol.parse_header(sock.recv())["type"] == protocol.BYE:
            sock.send(protocol.pack(protocol.BYE))

    answerer = threading.Thread(target=answer, name="test-answerer")
    answerer.start()
    try:
        start = time.monotonic()
        unanswered = router.close(dealers)
        took = time.monotonic() - start
    finally:
        answerer.join(15)
        for dealer in dealers.values():
            dealer.close(0)
        ctx.term()
    assert unanswered == {silent} and router.closed
    assert CONSUMER_BYE_LINGER_MS / 1000 - 0.01 <= took < 2, took  # the silent one: its bound, and no more


def test_a_busy_producer_answers_the_bye_at_once_though_its_load_holds_back_its_hello():
    """What lets the closing consumer stop waiting: the answer goes out as the BYE is read, while the load of the
    task the consumer gave up still fills the producer's one thread (producer/core/stuck.py: no HELLO until it returns)."""
    consumer = HandMadeConsumer()
    try:
        consumer.start("synthetic", {"length": 8, "shape": [2], "delay": 5.0}, threads=1, slots=1)
        hello, _ = consumer.next_message(protocol.HELLO)
        consumer.send(protocol.WELCOME, session=7, heartbeat=0.2, nonce=hello["nonce"], **welcome_fields())
        consumer.send(protocol.TASK, session=7, task=1, epoch=0, seq=0, indices=[0], on_error="raise")
        wait_for(lambda: consumer.next_message(protocol.PING)[0]["load"]["pending"] == 1, 10, "the task to load")
        consumer.send(protocol.BYE)
        start = time.monotonic()
        kinds: list[str] = []

        def answered() -> bool:
            while consumer.sock.poll(0):
                kinds.append(protocol.parse_header(consumer.sock.recv_multipart()[1])["type"])
            return protocol.BYE in kinds

        wait_for(answered, 10, "the producer's answer")
        took = time.monotonic() - start
    finally:
        consumer.close()
    assert kinds[-1] == protocol.BYE and protocol.HELLO not in kinds, kinds  # before any HELLO, and no BATCH
    assert took < 2.5, took  # not after the 5 s load

"""The io thread's narrow API to the training thread (health, the dataset's length), over a real ROUTER and
a hand-made producer; and a failing io thread surfacing in the loop as FerryThreadError."""

import queue

import numpy as np

import pytest
import zmq

from ferry import RemoteLoader
from ferry.common.errors import FerryThreadError
from ferry.consumer.core import CoreConfig
from ferry.consumer.figures.counters import Counters
from ferry.consumer.io.thread import IoThread

from .helpers import dealer, hello, next_message, wait_for


@pytest.fixture
def io_thread(endpoint):
    config = CoreConfig(capacity=4, heartbeat=0.2, liveness=5, on_error="raise", max_batch_bytes=1 << 20,
                        task_timeout=60.0, max_attempts=3)
    io = IoThread(config, endpoints=(endpoint,), handoff=queue.Queue(), counters=Counters())
    io.start()
    yield io
    io.close(10)


def test_health_follows_producers_joining_and_leaving(io_thread, endpoint):
    before = io_thread.health()
    assert before.alive and before.failure is None and before.live_producers == before.producers_seen == 0
    assert io_thread.wait_dataset(0.05) is None  # no producer yet: not known
    ctx = zmq.Context()
    try:
        peer = dealer(ctx, endpoint)
        peer.send(hello("p", slots=2, length=42, fingerprint="f"))
        assert peer.poll(10_000), "no WELCOME"
        assert io_thread.wait_dataset(10) == (42, False)
        health = wait_for(lambda: (h := io_thread.health()).live_producers == 1 and h, 10, "the producer to join")
        assert health.producers_seen == 1
        peer.close(0)
        health = wait_for(lambda: (h := io_thread.health()).live_producers == 0 and h, 10,
                          "the silent producer to be lost")
        assert health.producers_seen == 1 and health.no_producer_since > before.no_producer_since
    finally:
        ctx.term()


def test_a_failed_io_thread_reports_its_failure(io_thread):
    io_thread.start_run(object(), 0)  # a bug: not a sequencer
    health = wait_for(lambda: (h := io_thread.health()).failure is not None and h, 10, "the io thread to fail")
    assert isinstance(health.failure, AttributeError)
    wait_for(lambda: not io_thread.health().alive, 10, "the io thread to end")


def test_the_loop_raises_the_io_threads_failure(endpoint):
    with RemoteLoader(endpoint=endpoint, batch_size=2, timeout=30) as loader:
        loader._io.start_run(object(), 0)
        with pytest.raises(FerryThreadError, match="io thread failed") as info:
            iter(loader)  # waits for the dataset's length, checking the threads' health
        assert isinstance(info.value.__cause__, AttributeError)


# --- a TASK that finds its producer gone ------------------------------------------------------------------------
def _drive_until_a_task_finds_the_producer_gone(endpoint: str, says_bye: bool) -> IoThread:
    """An io thread driven step by step from this thread (its own loop never started), with a hand-made producer
    (2 slots, nothing ahead) that answers the first of its two tasks and then leaves: with a BYE (``says_bye``) or
    without. The answer is fed alone, so its freed credit sends the next TASK to a producer whose connection is
    gone while its BYE still waits unread, the order a real io thread meets when a BYE and a closed pipe race its
    send."""
    from ferry.common import protocol
    from ferry.common.codec import encode_tree
    from ferry.common.plan import EpochPlan
    from ferry.consumer.core import sequencer_for

    config = CoreConfig(capacity=4, heartbeat=0.2, liveness=50, on_error="raise", max_batch_bytes=1 << 20,
                        task_timeout=60.0, max_attempts=1)
    io = IoThread(config, endpoints=(endpoint,), handoff=queue.Queue(), counters=Counters())
    ctx = zmq.Context()
    try:
        peer = dealer(ctx, endpoint)
        peer.send(hello("p", slots=2, length=40, fingerprint="f"))
        wait_for(lambda: io._receive() or io._core.dispatcher.producers, 10, "the producer to be admitted")
        plan = EpochPlan.from_indices(0, np.arange(40), 4, False)
        io._event(lambda now: io._core.start_run(sequencer_for(1, plan, 0, (0, 0), in_order=True), 0, now))
        task, _ = next_message(peer, protocol.TASK)  # seq 0's (seq 1's follows; the producer never answers it)
        spec, frames = encode_tree([np.asarray(task["indices"], dtype=np.int64)])
        peer.send_multipart([protocol.pack(protocol.BATCH, session=task["session"], task=task["task"],
                                           epoch=task["epoch"], seq=task["seq"], tree=spec, errors=[]), *frames])
        if says_bye:
            peer.send(protocol.pack(protocol.BYE))
        peer.setsockopt(zmq.LINGER, 5000)
        peer.close()  # its messages leave, then its connection closes
        batch = wait_for(io._router.recv, 10, "the BATCH")
        ping = [protocol.pack(protocol.PING, load={})]
        wait_for(lambda: not io._router.send(batch[0].bytes, ping), 10, "the ROUTER to see the connection gone")
        io._event(lambda now: io._core.received_burst([([f.buffer for f in batch], batch, "")], now))
    finally:
        ctx.term()
    return io


def test_a_bye_that_waits_unread_when_a_task_finds_its_producer_gone_costs_no_attempt(endpoint, caplog):
    caplog.set_level("INFO", logger="ferry.consumer")
    io = _drive_until_a_task_finds_the_producer_gone(endpoint, says_bye=True)
    try:
        losses = [r.getMessage() for r in caplog.records if " lost (" in r.getMessage()]
        assert len(losses) == 1 and "said BYE" in losses[0], losses
        assert not [r for r in caplog.records if "not issued again" in r.getMessage()], \
            "max_attempts=1: a charged loss would have poisoned batch 1"
        assert io._core.dispatcher.reissued == 2 and not io._unsent  # batches 1 and 2, both free
    finally:
        io.close(10)


def test_a_task_that_finds_its_producer_gone_without_a_bye_charges_what_it_held_not_what_never_reached_it(
        endpoint, caplog):
    io = _drive_until_a_task_finds_the_producer_gone(endpoint, says_bye=False)
    try:
        losses = [r.getMessage() for r in caplog.records if " lost (" in r.getMessage()]
        assert len(losses) == 1 and "unreachable" in losses[0], losses
        poisoned = [r.getMessage() for r in caplog.records if "not issued again" in r.getMessage()]
        # batch 1 reached it (it may have crashed on it); batch 2's TASK never did: it costs batch 2 nothing
        assert len(poisoned) == 1 and poisoned[0].startswith("batch 1 of epoch 0"), poisoned
    finally:
        io.close(10)

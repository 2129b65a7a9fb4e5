"""The io thread's narrow API to the training thread (health, the dataset's length), over a real ROUTER and
a hand-made producer; and a failing io thread surfacing in the loop as FerryThreadError."""

import queue

import pytest
import zmq

from ferry import RemoteLoader
from ferry.common.errors import FerryThreadError
from ferry.consumer.core import CoreConfig
from ferry.consumer.figures.counters import Counters
from ferry.consumer.io.thread import IoThread

from .helpers import dealer, hello, wait_for


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

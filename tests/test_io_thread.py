"""The io thread's narrow API to the training thread (health, the dataset's length), over a real ROUTER and
a hand-made producer; and a failing io thread surfacing in the loop as FerryThreadError."""

import pytest
import zmq

from ferry import RemoteLoader
from ferry.common.errors import FerryThreadError
from ferry.common.waker import Waker
from ferry.consumer.buffer import ReorderBuffer
from ferry.consumer.io_thread import IoConfig, IoThread, StartRun
from ferry.consumer.figures.counters import Counters

from .helpers import dealer, hello, wait_for


@pytest.fixture
def io_thread(endpoint):
    waker = Waker()
    buffer = ReorderBuffer(in_order=True, on_release=waker.wake)
    config = IoConfig(endpoints=(endpoint,), capacity=4, heartbeat=0.2, liveness=5, on_error="raise",
                      max_batch_bytes=1 << 20, task_timeout=60.0, dataset_len=None, fingerprint=None)
    io = IoThread(config, buffer, Counters(), waker)
    io.start()
    yield io
    io.close(10)


def test_health_follows_producers_joining_and_leaving(io_thread, endpoint):
    before = io_thread.health()
    assert before.alive and before.failure is None and before.live_producers == before.producers_seen == 0
    assert io_thread.wait_dataset_len(0.05) is None  # no producer yet: not known
    ctx = zmq.Context()
    try:
        peer = dealer(ctx, endpoint)
        peer.send(hello("p", slots=2, length=42, fingerprint="f"))
        assert peer.poll(10_000), "no WELCOME"
        assert io_thread.wait_dataset_len(10) == 42
        health = wait_for(lambda: (h := io_thread.health()).live_producers == 1 and h, 10, "the producer to join")
        assert health.producers_seen == 1
        peer.close(0)
        health = wait_for(lambda: (h := io_thread.health()).live_producers == 0 and h, 10,
                          "the silent producer to be lost")
        assert health.producers_seen == 1 and health.no_producer_since > before.no_producer_since
    finally:
        ctx.term()


def test_a_failed_io_thread_reports_its_failure(io_thread):
    io_thread.start_run(StartRun(run=1, epoch=0, plan=None, order=None))  # a bug: the order is not a sequence
    health = wait_for(lambda: (h := io_thread.health()).failure is not None and h, 10, "the io thread to fail")
    assert isinstance(health.failure, TypeError)
    wait_for(lambda: not io_thread.health().alive, 10, "the io thread to end")


def test_the_loop_raises_the_io_threads_failure(endpoint):
    with RemoteLoader(endpoint=endpoint, batch_size=2, timeout=30) as loader:
        loader._io.start_run(StartRun(run=99, epoch=0, plan=None, order=None))
        with pytest.raises(FerryThreadError, match="io thread failed") as info:
            iter(loader)  # waits for the dataset's length, checking the threads' health
        assert isinstance(info.value.__cause__, TypeError)

"""Poison tasks end in an error (issue 11, item 1): a sample index outside the dataset raises at once, a task
lost on every one of its ``max_attempts`` attempts raises naming the batch, and producers that keep joining
and leaving without delivering hit the no-progress timeout. Real producer processes; every wait bounded."""

from __future__ import annotations

import re
import threading
import time

import pytest
import zmq

from ferry import NoProducersError, PoisonTaskError, RemoteLoader, SampleIndexError
from ferry.common import protocol

from .helpers import dealer, hello, wait_for, welcome_fields


def test_a_sampler_index_outside_the_dataset_raises_at_its_batch_within_10_s(endpoint, spawn):
    spawn(endpoint, "tests.datasets:PairDataset", {"length": 20}, threads=1, slots=2)
    with RemoteLoader(endpoint=endpoint, batch_size=1, sampler=[3, 99], heartbeat=0.2, timeout=30) as loader:
        wait_for(lambda: loader.stats()["producers"] == 1, 20, "the producer")
        began = time.monotonic()
        it = iter(loader)
        _, label = next(it)
        assert label.tolist() == [3]  # the batch before it is delivered, as DataLoader would
        with pytest.raises(SampleIndexError) as caught:
            next(it)
        assert time.monotonic() - began < 10
        assert isinstance(caught.value, IndexError) and (caught.value.index, caught.value.length) == (99, 20)
        assert "sample index 99" in str(caught.value) and "20 samples" in str(caught.value)
        assert loader.stats()["reissued"] == 0  # never re-issued
        with pytest.raises(StopIteration):
            next(it)


def test_a_producer_answers_a_task_outside_its_dataset_with_a_fail_naming_the_index(spawn):
    """The producer side on its own: a hand-made consumer sends the TASK a careless one might."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        spawn(f"tcp://127.0.0.1:{port}", "tests.datasets:PairDataset", {"length": 20}, threads=1, slots=1)
        assert router.poll(20_000), "no HELLO within 20 s"
        peer, frame = router.recv_multipart()
        hello = protocol.parse_header(frame)
        assert hello["type"] == protocol.HELLO
        router.send_multipart([peer, protocol.pack(protocol.WELCOME, session=5, heartbeat=0.2, nonce=hello["nonce"],
                                                   **welcome_fields())])
        router.send_multipart([peer, protocol.pack(protocol.TASK, session=5, task=1, epoch=0, seq=0, indices=[3, 99],
                                                   on_error="skip")])
        deadline = time.monotonic() + 10
        while True:
            assert router.poll(max(1, int((deadline - time.monotonic()) * 1000))), "no answer to the TASK"
            header = protocol.parse_header(router.recv_multipart()[1])
            if header["type"] == protocol.FAIL:
                break
        assert header["task"] == 1 and header["errors"][0]["index"] == 99
        assert header["errors"][0]["exc_type"] == "SampleIndexError" and "20 samples" in header["errors"][0]["message"]
    finally:
        router.close(0)
        ctx.term()


def test_a_sample_slower_than_task_timeout_raises_poison_naming_the_batch_and_each_attempt(endpoint, spawn):
    producer = spawn(endpoint, "tests.poison_datasets:SlowSampleDataset", {"length": 20, "slow": [5], "sleep": 30},
                     threads=2, slots=2)
    began = time.monotonic()
    with RemoteLoader(endpoint=endpoint, batch_size=2, heartbeat=0.2, task_timeout=2, max_attempts=2,
                      timeout=60) as loader:
        labels = []
        with pytest.raises(PoisonTaskError) as caught:
            for _, y in loader:
                labels.extend(y.tolist())
        assert time.monotonic() - began < 45
    error = caught.value
    assert labels == [0, 1, 2, 3] and (error.epoch, error.seq, error.indices) == (0, 2, [4, 5])
    assert len(error.attempts) == 2
    assert all(who.endswith(f":{producer.pid}") and "task_timeout=2" in why for who, why in error.attempts)
    assert "samples 4, 5" in str(error) and "attempt 2" in str(error)


def test_producers_that_keep_rejoining_without_delivering_hit_the_no_progress_timeout(endpoint):
    """A broken producer (hand-made, on its own thread) says HELLO afresh every 0.2 s and answers no task: it is
    admitted and lost again and again, so live producers alone never trip the no-producer timeout; the
    no-progress one (4 s) must end it. (A real producer whose loads hang does not rejoin: the next test.)"""
    ctx = zmq.Context()
    stop = threading.Event()

    def churn() -> None:
        sock = dealer(ctx, endpoint)
        try:
            for nonce in range(1, 200):  # at most 40 s; stopped by the test long before
                sock.send(protocol.pack(protocol.HELLO, producer="churner", nonce=nonce, host="h", pid=1, slots=2,
                                        dataset={"spec": "x", "len": 20, "fingerprint": "f"}))
                while sock.poll(0):
                    sock.recv_multipart()  # WELCOMEs and TASKs, never answered
                if stop.wait(0.2):  # the pace of this peer's HELLOs
                    return
        finally:
            sock.close(0)

    churner = threading.Thread(target=churn, name="churner")
    try:
        with RemoteLoader(endpoint=endpoint, batch_size=2, heartbeat=0.2, task_timeout=0.5, max_attempts=30,
                          no_producer_timeout=4) as loader:
            churner.start()
            wait_for(lambda: loader.stats()["producers"] == 1, 10, "the hand-made producer")
            began = time.monotonic()
            with pytest.raises(NoProducersError, match="kept joining and leaving") as caught:
                next(iter(loader))
            assert time.monotonic() - began < 20
            assert loader.stats()["producers_seen"] >= 2  # it did rejoin: live producers alone never tripped it
    finally:
        stop.set()
        churner.join(10)
        ctx.term()
    assert not churner.is_alive()
    assert "producer h:1 restarted its work (new HELLO)" in str(caught.value), str(caught.value)


@pytest.mark.slow  # the hold itself is proven in the default suite by tests/test_stuck_loads.py
def test_a_producer_whose_one_loading_thread_hangs_stays_out_and_the_error_names_its_loss(endpoint, spawn):
    """Every sample takes 30 s and the task timeout is 0.5 s: the producer is lost once and, its one loading thread
    held by the load its consumer gave up on, says no HELLO until it returns (producer/core/stuck.py). The no-producer
    timeout ends the wait, naming that loss."""
    producer = spawn(endpoint, "tests.datasets:PairDataset", {"length": 20, "delay": 30}, threads=1, slots=1)
    with RemoteLoader(endpoint=endpoint, batch_size=2, heartbeat=0.2, task_timeout=0.5, max_attempts=30,
                      no_producer_timeout=4) as loader:
        wait_for(lambda: loader.stats()["producers"] == 1, 60, "the producer")  # after its canary load: 30 s
        began = time.monotonic()
        with pytest.raises(NoProducersError, match="no producer alive") as caught:
            next(iter(loader))
        assert time.monotonic() - began < 20
        assert loader.stats()["producers_seen"] == 1  # it did not come back to take tasks it could not start
    assert re.search(rf"The last one lost: producer \S+:{producer.pid} held a task for more than task_timeout=0.5 s",
                     str(caught.value)), str(caught.value)


def test_the_consumer_checks_the_plan_itself_and_never_sends_an_index_outside_the_dataset(endpoint):
    """A hand-made producer that would answer anything: the consumer must not even send it the bad TASK."""
    ctx = zmq.Context()
    sock = dealer(ctx, endpoint)
    try:
        with RemoteLoader(endpoint=endpoint, batch_size=2, sampler=[1, 25], heartbeat=0.2, timeout=30) as loader:
            sock.send(hello("hand", slots=4, length=20, fingerprint="f"))
            wait_for(lambda: loader.stats()["producers"] == 1, 10, "the hand-made producer")
            with pytest.raises(SampleIndexError, match="sample index 25 is out of range for a dataset of 20"):
                next(iter(loader))
            tasks = []
            while sock.poll(0):
                header = protocol.parse_header(sock.recv_multipart()[0])
                tasks += [header] if header["type"] == protocol.TASK else []
        assert tasks == []
    finally:
        sock.close(0)
        ctx.term()


def test_the_errors_are_ferry_errors_of_the_usual_kinds_and_survive_pickling():
    import pickle

    from ferry import FerryError

    index_error = SampleIndexError(index=99, length=20, epoch=1, seq=4)
    poison = PoisonTaskError(epoch=1, seq=4, indices=[8, 9], attempts=[("h:1", "silent for 5.0 s"), ("h:2", "x")])
    assert isinstance(index_error, (FerryError, IndexError)) and isinstance(poison, (FerryError, RuntimeError))
    for error in (index_error, poison):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
    assert "epoch 1, batch 4" in str(index_error)
    assert "batch 4 of epoch 1 (samples 8, 9)" in str(poison) and "attempt 1: producer h:1: silent" in str(poison)

"""Isolation between the jobs of one producer pool, with real processes (sleeping samples, so that 2 cores measure
producer time): a job that stops reading holds only its credits and costs the others at most 10 % of their
throughput; a job that joins or leaves is rebalanced within 5 s; a consumer sending malformed messages is dropped
without touching the others."""

from __future__ import annotations

import threading

import msgpack
import pytest
import zmq

from ferry import RemoteLoader
from ferry.common import protocol
from ferry.common.datasets import SyntheticDataset
from tests.helpers import assert_epoch_matches, free_port, wait_for, welcome_fields
from tests.pool_jobs import PRODUCERS, Job, job_figures, spawn_pool, window


def served_by_all(*jobs: Job) -> bool:
    return all(job.loader.stats()["producers"] == PRODUCERS and job.batches >= 10 for job in jobs)


@pytest.mark.slow  # a measurement of rates: 12 s each (.ci/run runs -m slow)
def test_a_paused_job_holds_at_most_its_credits_and_costs_the_others_under_10_percent(spawn):
    a, b, evaluation = Job(), Job(), Job(pause_after=3, buffer_batches=8)
    jobs = [a, b, evaluation]
    try:
        producers = spawn_pool(spawn, jobs, metrics=True)
        a.start(), b.start()
        wait_for(lambda: served_by_all(a, b), 60, "every producer serving both jobs")
        alone, seconds = window([a, b], 400)
        rate_alone = sum(alone) / seconds
        evaluation.start()
        wait_for(lambda: evaluation.paused.is_set() and evaluation.loader.stats()["in_flight"] == 0, 60,
                 "the evaluation paused with every credit spent")
        held = evaluation.loader.stats()
        assert 0 < held["buffered"] + held["in_flight"] <= 8  # its credits, no more
        for producer in producers:  # and nothing of it waits or runs at any producer
            figures = job_figures(producer.metrics_port)[evaluation.endpoint]
            assert figures["queued"] == 0 and figures["running"] == 0, figures
        beside, seconds = window([a, b], 400)
        rate_beside = sum(beside) / seconds
        print(f"the two jobs alone: {rate_alone:.1f} batches/s; beside a paused one: {rate_beside:.1f}")
        assert rate_beside >= 0.9 * rate_alone
        evaluation.resume()
        wait_for(lambda: evaluation.batches >= 20, 60, "the evaluation resumed")
    finally:
        for job in jobs:
            job.close()


@pytest.mark.slow  # a measurement of rates: 12 s each (.ci/run runs -m slow)
def test_a_job_joining_and_leaving_is_rebalanced_within_5_s(spawn):
    a, b, heavy = Job(), Job(), Job(weight=2.0)
    jobs = [a, b, heavy]
    try:
        spawn_pool(spawn, jobs)
        a.start(), b.start()
        wait_for(lambda: served_by_all(a, b), 60, "every producer serving both jobs")
        before, seconds = window([a, b], 300)
        rate_before = sum(before) / seconds
        heavy.start()
        wait_for(lambda: heavy.first_at is not None, 30, "the joining job's first batch")
        joined, seconds = window(jobs, 250)  # from its first batch on
        shares = [c / sum(joined) for c in joined]
        print(f"joined: {joined} in {seconds:.1f} s")
        assert seconds < 5.0 and shares == pytest.approx([0.25, 0.25, 0.5], rel=0.10), shares
        heavy.close()  # leaves: BYE, its share goes back to the others at once
        left, seconds = window([a, b], 250)
        print(f"left: {left} in {seconds:.1f} s, {sum(left) / seconds:.1f} batches/s (before: {rate_before:.1f})")
        assert seconds < 5.0 and [c / sum(left) for c in left] == pytest.approx([0.5, 0.5], rel=0.10)
        assert sum(left) / seconds >= 0.9 * rate_before
    finally:
        for job in jobs:
            job.close()


def _malformed_consumer(endpoint: str, stop: threading.Event, seen: dict) -> None:
    """A consumer that welcomes every producer, then sends it garbage; counts the HELLOs (nonces) it gets."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    garbage = [b"\xc1", msgpack.packb([1, 2]), protocol.pack(protocol.TASK, session=1, task=1, epoch=0, seq=0,
                                                             indices=[0], on_error="raise"),
               protocol.pack("NOPE")]
    try:
        while not stop.is_set():
            if not router.poll(100):
                continue
            peer, frame, *_ = router.recv_multipart()
            header = protocol.parse_header(frame)
            if header["type"] != protocol.HELLO:
                continue
            seen.setdefault(header["producer"], set()).add(header["nonce"])
            router.send_multipart([peer, protocol.pack(protocol.WELCOME, session=5, heartbeat=0.2, nonce=header["nonce"],
                                                       **welcome_fields())])
            for i in range(40):
                router.send_multipart([peer, garbage[i % len(garbage)]])
    finally:
        router.close(0)
        ctx.term()


def test_a_consumer_sending_malformed_messages_is_dropped_without_touching_the_others(endpoint, spawn):
    hostile = f"tcp://127.0.0.1:{free_port()}"
    other = f"tcp://127.0.0.1:{free_port()}"
    stop, seen = threading.Event(), {}
    thread = threading.Thread(target=_malformed_consumer, args=(hostile, stop, seen), name="hostile")
    thread.start()
    args = {"length": 40, "shape": [2], "dtype": "float32", "delay": 0.005}
    try:
        producers = [spawn([hostile, endpoint, other], "", threads=4, slots=2) for _ in range(2)]
        with RemoteLoader(endpoint=endpoint, dataset="synthetic", dataset_args=args, batch_size=4, shuffle=True,
                          seed=1, heartbeat=0.2, timeout=30) as first, \
                RemoteLoader(endpoint=other, dataset="synthetic", dataset_args=args, batch_size=3, shuffle=True,
                             seed=2, heartbeat=0.2, timeout=30) as second:
            for epoch in range(3):
                first.set_epoch(epoch)
                second.set_epoch(epoch)
                assert_epoch_matches(first, SyntheticDataset(**args), epoch=epoch, batch_size=4, seed=1)
                assert_epoch_matches(second, SyntheticDataset(**args), epoch=epoch, batch_size=3, seed=2)
            wait_for(lambda: all(len(nonces) >= 2 for nonces in seen.values()) and len(seen) == 2, 30,
                     "each producer dropping the hostile consumer's session and saying HELLO again")
            for loader in (first, second):
                stats = loader.stats()
                assert stats["reissued"] == 0 and stats["producers"] == 2 and stats["producers_seen"] == 2
        for producer in producers:
            assert producer.proc.poll() is None
            assert "invalid messages: dropping its work" in producer.output()
    finally:
        stop.set()
        thread.join(10)


def test_a_dataset_slow_to_open_stalls_no_other_job(spawn):
    served = Job()
    other = f"tcp://127.0.0.1:{free_port()}"
    try:
        spawn([served.endpoint, other], "", threads=8, slots=2, extra=["--allow-dataset", "tests.datasets:SlowToOpen"])
        served.start()
        wait_for(lambda: served.batches >= 10, 60, "the first job served")
        before = served.batches
        with RemoteLoader(endpoint=other, dataset="tests.datasets:SlowToOpen", dataset_args={"length": 8, "open_s": 3},
                          batch_size=4, heartbeat=0.2, timeout=60) as slow:
            labels = [y.tolist() for _, y in slow]  # waits out the 3 s opening, then the epoch
        assert labels == [[0, 1, 2, 3], [4, 5, 6, 7]]
        stats = served.loader.stats()
        # its producer was never lost (its heartbeats went on: liveness is 1 s) and kept serving it meanwhile
        assert stats["reissued"] == 0 and stats["producers"] == 1 and stats["producers_seen"] == 1
        assert served.batches - before >= 20
    finally:
        served.close()

"""The producer's zero-copy send, through the real ZeroMQ MessageTracker: a batch buffer handed to
``send(copy=False)`` is read by libzmq after ``send`` returns, so it may be reused only once its tracker says
the send is done.

A hand-made consumer (a raw ROUTER) gives a real producer many tasks at once, then reads its big batches
slowly, with a one-message receive queue: sends pile up in the producer while it keeps assembling new
batches. Every batch that arrives must equal the dataset, and the pooled buffers must have been reused."""

import threading
import time
from typing import Any

import numpy as np
import zmq

from ferry.common import protocol
from ferry.common.codec import decode_tree
from ferry.common.datasets import SyntheticDataset
from ferry.producer import ProducerConfig
from ferry.producer.io.service import Producer

from .helpers import pooled_buffer_ids, producer_buffer_pool, welcome_fields

TASKS, BATCH = 40, 4
SESSION = 99


def _indices(task: int, length: int) -> list[int]:
    return [(task * BATCH + k) % length for k in range(BATCH)]


def _serve_slowly(router: zmq.Socket, peer: bytes, nonce: int, dataset: SyntheticDataset) -> int:
    """WELCOME the producer, give it every task at once, then read each batch slowly and check it against the
    dataset. Returns the number of batches checked."""
    router.send_multipart([peer, protocol.pack(protocol.WELCOME, session=SESSION, heartbeat=1.0, nonce=nonce,
                                                     **welcome_fields())])
    for task in range(TASKS):
        router.send_multipart([peer, protocol.pack(protocol.TASK, session=SESSION, task=task + 1, epoch=0, seq=task,
                                                   indices=_indices(task, len(dataset)), on_error="raise")])
    checked = 0
    deadline = time.monotonic() + 60
    while checked < TASKS:
        assert time.monotonic() < deadline, f"only {checked} of {TASKS} batches arrived"
        router.send_multipart([peer, protocol.pack(protocol.PING, load={})])
        if not router.poll(200):
            continue
        frames = router.recv_multipart(copy=False)
        header = protocol.parse_header(frames[1])
        if header["type"] != protocol.BATCH:
            continue
        assert not header["errors"], header["errors"]
        x, y = decode_tree(header["tree"], [f.buffer for f in frames[2:]])
        indices = _indices(header["task"] - 1, len(dataset))
        for row, index in enumerate(indices):
            assert np.array_equal(x[row], dataset.sample_array(index)), (
                f"task {header['task']}, row {row}: not sample {index} (its buffer was overwritten in flight?)")
        assert y.tolist() == [i % dataset.num_classes for i in indices]
        del frames, x, y
        checked += 1
        time.sleep(0.01)  # a slow consumer: the producer's sends queue up
    return checked


def serve_slowly_watching_the_pool(endpoint: str, dataset: Any) -> tuple[int, list[int], Any]:
    """A real producer serving ``dataset`` to a slow hand-made consumer (``_serve_slowly``, which checks
    every batch against the dataset), with its pool's ``acquire`` watched. Returns the batches checked, the
    ids of the buffers the pool handed out, in order, and the pool."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVHWM, 1)  # libzmq does not read ahead for us: the sender feels a slow reader
    router.setsockopt(zmq.RCVBUF, 1 << 16)
    router.bind(endpoint)
    producer = Producer(ProducerConfig(endpoints=(endpoint,), dataset="synthetic", threads=4, slots=8,
                                       heartbeat=0.2), dataset)
    pool = producer_buffer_pool(producer)
    acquired: list[int] = []
    real_acquire = pool.acquire

    def spy(*a, **k):  # the real pool, watched: which buffers it hands out
        buffer = real_acquire(*a, **k)
        acquired.append(id(buffer))
        return buffer

    pool.acquire = spy
    serving = threading.Thread(target=producer.run, name="test-producer")
    serving.start()
    try:
        assert router.poll(20_000), "the producer never said HELLO"
        peer, hello = router.recv_multipart()
        checked = _serve_slowly(router, peer, protocol.parse_header(hello)["nonce"], dataset)
    finally:
        producer.stop()
        serving.join(20)
        router.close(0)
        ctx.term()
    assert not serving.is_alive()
    return checked, acquired, pool


def test_pooled_send_buffers_are_reused_only_after_libzmq_is_done_with_them(endpoint):
    dataset = SyntheticDataset(length=64, shape=[1 << 20], dtype="uint8")  # 4 MiB batches over tcp
    checked, acquired, pool = serve_slowly_watching_the_pool(endpoint, dataset)
    assert checked == TASKS
    owned = pooled_buffer_ids(pool)
    reuses = sum(1 for i in acquired if i in owned) - len(owned)
    assert len(acquired) == TASKS
    assert reuses >= 1, f"no pooled buffer was reused ({len(owned)} pooled, {len(acquired)} batches)"

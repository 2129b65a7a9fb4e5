"""The frame bound a consumer announces in WELCOME (``frame_bytes``), obeyed by a real producer process.

A hand-made consumer (a raw ROUTER speaking the protocol) welcomes a real ``python -m ferry.producer`` with a
chosen bound, sends one TASK for a 20 MiB leaf and looks at the frames on the wire.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ferry import RemoteLoader
from ferry.common import protocol
from ferry.common.codec import Chunked, decode_tree
from ferry.common.constants import DEFAULT_FRAME_BYTES, MAX_FRAME_BYTES, MIN_FRAME_BYTES
from ferry.common.datasets import SyntheticDataset

from .helpers import HandMadeConsumer, ProducerProcess, free_port, welcome_fields

ARGS = {"length": 4, "shape": [5, 1024, 1024], "dtype": "float32"}  # 20 MiB a sample
LEAF = 5 * 1024 * 1024 * 4
SESSION = 7


class FrameConsumer(HandMadeConsumer):
    """A hand-made consumer (tests/helpers.py) and a real producer of ARGS' 20 MiB samples, 1 slot."""

    def __init__(self) -> None:
        super().__init__()
        self.start("synthetic", ARGS, threads=1, slots=1)
        self.tasks = 0

    def welcome(self, **extra) -> None:
        hello, _ = self.next_message(protocol.HELLO)
        self.send(protocol.WELCOME, session=SESSION, heartbeat=0.2, nonce=hello["nonce"], **welcome_fields(**extra))

    def batch(self, index: int = 0) -> tuple[list[bytes], np.ndarray]:
        """Ask for sample ``index`` as a batch of one; return the frames on the wire and the decoded leaf."""
        self.tasks += 1
        self.send(protocol.TASK, session=SESSION, task=self.tasks, epoch=0, seq=self.tasks, indices=[index],
                  on_error="raise")
        header, frames = self.next_message(protocol.BATCH)
        assert header["task"] == self.tasks
        leaf = decode_tree(header["tree"], frames)[0]
        if isinstance(leaf, Chunked):
            leaf = leaf.assemble_into(np.empty(leaf.nbytes, np.uint8))
        return frames, leaf


@pytest.fixture
def consumer():
    made = FrameConsumer()
    yield made
    made.close()


def expected_leaf(index: int = 0) -> np.ndarray:
    return SyntheticDataset(**ARGS)[index][0][None]


def test_leaves_up_to_the_announced_bound_travel_unsplit(consumer):
    consumer.welcome(frame_bytes=32 << 20)
    frames, leaf = consumer.batch()
    assert [len(f) for f in frames] == [LEAF, 8]  # the 20 MiB leaf whole, then the labels
    np.testing.assert_array_equal(leaf, expected_leaf())


def test_larger_leaves_go_in_frames_of_at_most_the_bound(consumer):
    consumer.welcome(frame_bytes=MIN_FRAME_BYTES)
    frames, leaf = consumer.batch(1)
    assert all(len(f) <= MIN_FRAME_BYTES for f in frames)
    assert sum(len(f) for f in frames[:-1]) == LEAF and len(frames) == LEAF // MIN_FRAME_BYTES + 1
    np.testing.assert_array_equal(leaf, expected_leaf(1))  # bit-identical to the sample, reassembled


def test_a_welcome_without_a_frame_bound_is_refused():
    """There has only ever been protocol version 1: a WELCOME must say its frame bound (no fallback for older
    consumers that never existed)."""
    from ferry.common.errors import ProtocolError

    fields = welcome_fields()
    del fields["frame_bytes"]
    with pytest.raises(ProtocolError, match="frame_bytes"):
        protocol.parse_header(protocol.pack(protocol.WELCOME, session=SESSION, heartbeat=0.2, nonce=1, **fields))


@pytest.mark.parametrize("announced, frame_sizes", [
    (1, [MIN_FRAME_BYTES] * 5),  # clamped up: never more than MAX_FRAMES frames for a batch
    ((1 << 63) - 1, [LEAF]),  # clamped down to MAX_FRAME_BYTES: whole
])
def test_an_absurd_bound_is_clamped(consumer, announced, frame_sizes):
    assert LEAF < MAX_FRAME_BYTES
    consumer.welcome(frame_bytes=announced)
    frames, leaf = consumer.batch()
    assert [len(f) for f in frames[:-1]] == frame_sizes
    np.testing.assert_array_equal(leaf, expected_leaf())


@pytest.mark.parametrize("hostile", [0, -5, "big", 1.5, True])
def test_a_hostile_bound_is_dropped_and_the_producer_serves_on(consumer, hostile):
    consumer.welcome(frame_bytes=hostile)  # invalid: the producer drops it and says HELLO again
    consumer.welcome(frame_bytes=32 << 20)
    frames, leaf = consumer.batch()
    assert [len(f) for f in frames] == [LEAF, 8]
    np.testing.assert_array_equal(leaf, expected_leaf())
    assert consumer.producer.proc.poll() is None
    assert "frame_bytes" in consumer.producer.output()  # the dropped WELCOME was logged, naming the field


def test_a_real_loader_announces_its_bound_and_gets_identical_batches():
    """RemoteLoader announces DEFAULT_FRAME_BYTES: a 20 MiB leaf comes whole, and equal to the dataset's."""
    assert LEAF <= DEFAULT_FRAME_BYTES
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    producer = ProducerProcess(endpoint, "synthetic", ARGS, threads=1, slots=1)
    try:
        with RemoteLoader(endpoint=endpoint, batch_size=1, timeout=60) as loader:
            got = [batch for batch in loader]
            assert loader.stats()["bytes"] >= 4 * LEAF
        for index, (array, label) in enumerate(got):
            assert torch.equal(array, torch.from_numpy(expected_leaf(index)))
            assert label.tolist() == [SyntheticDataset(**ARGS)[index][1]]
    finally:
        producer.close()

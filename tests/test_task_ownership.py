"""A result counts only from the producer that holds the task, and only for the run that issued it (issue 17).

Hand-made producers on raw DEALER sockets face a real RemoteLoader over its ROUTER, so that the test decides
who answers which task id, and when. A batch is ``[int64 sample indices]``; a wrong answer carries the
indices plus ``WRONG``, so a wrong batch that reached the loop would show.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch
import zmq

from ferry import RemoteLoader
from ferry.common import protocol
from ferry.common.codec import encode_tree

from .helpers import assert_tree_equal, dealer, hello, wait_for

LENGTH, BATCH = 8, 4  # two batches: samples 0-3 and 4-7
WRONG = 100


class WirePeer:
    """One hand-made producer: says HELLO, takes its WELCOME, then answers what the test tells it to."""

    def __init__(self, ctx: zmq.Context, endpoint: str, name: str) -> None:
        self.name = name
        self.sock = dealer(ctx, endpoint)
        self.sock.send(hello(name, slots=1, length=LENGTH, fingerprint="f"))
        self.session = self.receive(protocol.WELCOME)["session"]

    def receive(self, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        """The next message of ``kind``; the others are dropped. PINGs go out meanwhile, as a producer's do."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.send(protocol.pack(protocol.PING, load={}))
            if self.sock.poll(100):
                header = protocol.parse_header(self.sock.recv_multipart()[0])
                if header["type"] == kind:
                    return header
        raise AssertionError(f"{self.name}: no {kind} within {timeout} s")

    def answer(self, task: dict[str, Any], offset: int = 0) -> None:
        """Send a BATCH for ``task`` (its task id, seq and epoch) holding its indices plus ``offset``."""
        spec, frames = encode_tree([np.asarray(task["indices"], dtype=np.int64) + offset])
        self.sock.send_multipart([protocol.pack(protocol.BATCH, session=task["session"], task=task["task"],
                                                epoch=task["epoch"], seq=task["seq"], tree=spec, errors=[]),
                                  *frames])


@pytest.fixture
def peer(endpoint):
    """Start hand-made producers on ``endpoint``; their sockets and context are closed at teardown."""
    ctx = zmq.Context()
    started: list[WirePeer] = []

    def start(name: str) -> WirePeer:
        started.append(WirePeer(ctx, endpoint, name))
        return started[-1]

    yield start
    for p in started:
        p.sock.close(0)
    ctx.term()


def _loader(endpoint: str) -> RemoteLoader:
    return RemoteLoader(endpoint=endpoint, batch_size=BATCH, dataset_len=LENGTH, heartbeat=1.0, timeout=20,
                        log_every=None)


def _settled(loader: RemoteLoader) -> dict[str, Any]:
    """Wait until the consumer has taken in one answer: as a duplicate, or (wrongly) as a batch."""
    return wait_for(lambda: (lambda s: s if s["duplicates"] + s["received"] >= 1 else None)(loader.stats()),
                    10, "the answer to be counted")


def _batch(first: int) -> list[torch.Tensor]:
    return [torch.arange(first, first + BATCH, dtype=torch.int64)]


def test_a_producer_cannot_answer_a_task_another_producer_holds(endpoint, peer):
    with _loader(endpoint) as loader:
        a = peer("a")
        it = iter(loader)
        task_a = a.receive(protocol.TASK)
        b = peer("b")  # registered: it takes the other batch
        task_b = b.receive(protocol.TASK)
        assert (task_a["seq"], task_b["seq"]) == (0, 1)
        b.answer(task_a, offset=WRONG)  # a registered producer answers a's task id
        settled = _settled(loader)  # before a's own answer comes
        a.answer(task_a)
        b.answer(task_b)
        got = [next(it), next(it)]
        stats = loader.stats()
    assert_tree_equal(got[0], _batch(0), "batch 0 (a's own answer, not b's)")
    assert_tree_equal(got[1], _batch(4), "batch 1")
    assert (settled["duplicates"], settled["received"]) == (1, 0), f"b's answer to a's task was taken: {settled}"
    assert (stats["duplicates"], stats["received"]) == (1, 2), stats


def test_a_late_answer_of_an_abandoned_run_is_no_batch_of_the_next(endpoint, peer):
    with _loader(endpoint) as loader:
        a = peer("a")
        iter(loader)
        old = a.receive(protocol.TASK)  # run 1's first task, held by a
        it = iter(loader)  # the loop abandons run 1: run 2 issues the same seq again
        new = a.receive(protocol.TASK)
        assert (old["seq"], new["seq"]) == (0, 0)
        a.answer(old, offset=WRONG)  # only now does run 1's answer come
        settled = _settled(loader)  # before run 2's answer comes
        a.answer(new)
        first = next(it)
        a.answer(a.receive(protocol.TASK))
        second = next(it)
        with pytest.raises(StopIteration):
            next(it)
        stats = loader.stats()
    assert_tree_equal(first, _batch(0), "run 2 batch 0 (its own answer, not run 1's)")
    assert_tree_equal(second, _batch(4), "run 2 batch 1")
    assert (settled["duplicates"], settled["received"]) == (1, 0), f"run 1's answer was taken in run 2: {settled}"
    assert (stats["duplicates"], stats["received"]) == (1, 2), stats

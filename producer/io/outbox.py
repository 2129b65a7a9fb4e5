"""What a producer sends, and the counts of what it sent: HELLO, PING, BYE, a FAIL for an index out of range, and
the finished batches (:class:`~ferry.producer.loading.batcher.Outcome`). Only the main loop (:mod:`ferry.producer.io.service`)
calls it; every send is non-blocking (a consumer that is not connected or not reading misses it, and re-issues).
"""

from __future__ import annotations

import os
import socket as pysocket
from typing import Any

import zmq

from ferry.common import protocol
from ferry.common.constants import MAX_SLOTS

from ferry.producer.core.actions import FailTask
from ferry.producer.loading.batcher import Outcome
from ferry.producer.io.buffers import BufferPool, tracked
from ferry.producer.io.links import Link

__all__ = ["Outbox", "hello_fields", "TASKS_PER_MESSAGE"]

#: The most tasks this producer takes in one TASK (HELLO ``tasks``): as many as it may ever hold for a consumer.
TASKS_PER_MESSAGE = MAX_SLOTS


class Outbox:
    """Sends on the links' sockets and counts what left.

    Args:
        hello: the fields of every HELLO but the nonce (producer id, host, pid, slots, dataset, shm).
        pool: the batcher's buffer pool: a pooled buffer goes back once ZeroMQ has sent its frames.
    """

    def __init__(self, hello: dict[str, Any], pool: BufferPool) -> None:
        self._hello = hello
        self._pool = pool
        self.batches_sent = 0
        self.bytes_sent = 0
        self.shared_batches = 0  # batches written into the consumer's shared-memory slab

    def send(self, link: Link, frames: list[Any], now: float) -> bool:
        """Queue ``frames`` on ``link`` without blocking; False when they cannot be (no connection, a full queue)."""
        try:
            link.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False  # not connected, or the consumer stopped reading: it will re-issue
        link.conn.sent(now)
        return True

    def hello(self, link: Link, nonce: int, now: float) -> bool:
        # what the connection serves: its producer's own dataset, one its consumer named, or why it may not (pool.py)
        fields = {**self._hello, **link.hello_extra, "producer": self._hello["producer"] + link.id_suffix}
        return self.send(link, [protocol.pack(protocol.HELLO, nonce=nonce, **fields)], now)

    def ping(self, link: Link, pending: int, now: float) -> None:
        self.send(link, [protocol.pack(protocol.PING, load={
            "pending": pending, "sent": self.batches_sent, "compression": link.compression.last or "off"})], now)

    def bye(self, link: Link, now: float) -> None:
        link.said_bye = self.send(link, [protocol.pack(protocol.BYE)], now)

    def answer_bye(self, link: Link) -> None:
        """Answer a consumer's BYE (producer/core/actions.py AnswerBye). Not a send of the connection's own: its HELLO
        still goes at the next tick, and a producer that stops later does not linger for it."""
        try:
            link.sock.send(protocol.pack(protocol.BYE), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # the consumer is gone already: nothing waits for the answer

    def index_fail(self, link: Link, action: FailTask, now: float) -> None:
        """The FAIL answering a TASK that names a sample outside the dataset (the consumer raises
        SampleIndexError for it, whatever its on_error)."""
        h = action.header
        error = {"index": action.index, "exc_type": "SampleIndexError", "message": action.message, "traceback": ""}
        self.send(link, [protocol.pack(protocol.FAIL, session=h["session"], task=h["task"], epoch=h["epoch"],
                                       seq=h["seq"], errors=[error])], now)

    def deliver(self, outcome: Outcome, link: Link | None, now: float) -> None:
        """Send a finished batch (or FAIL) to the connection it belongs to; dropped when that connection is gone
        or has left the session (the consumer re-issues it)."""
        if link is None or not link.conn.owns(outcome.job.session):
            self._release(outcome, None)
            return
        link.conn.task_finished()
        frames, tracker = outcome.frames, outcome.tracker
        count = outcome.buffer_frames if outcome.buffer is not None else 0
        if count and tracker is None:  # the pooled buffer's views: it goes back to the pool once ZeroMQ has sent them
            frames, tracker = tracked(frames, count)
        sent = self.send(link, frames, now)
        del frames
        # unsent, frames the batch worker tracked hold the buffer until the outcome goes: their tracker says when
        self._release(outcome, tracker if sent or outcome.tracker is not None else None)
        if sent and not outcome.failed:
            self.batches_sent += 1
            self.bytes_sent += sum(len(f) for f in outcome.frames[1:])
            if outcome.job.slot is not None and outcome.job.slot.used:
                self.shared_batches += 1
                self.bytes_sent += outcome.job.slot.used

    def _release(self, outcome: Outcome, tracker: Any) -> None:
        if outcome.buffer is not None:
            self._pool.release(outcome.buffer, tracker)


def hello_fields(*, producer_id: str, slots: int, ahead: int, dataset: dict[str, Any], shm_token: str | None,
                 worker: list[int] | None = None, serial: bool = False) -> dict[str, Any]:
    """The HELLO's fields but the nonce. ``ahead``: the tasks it takes beyond its ``slots``, queued until a slot is
    free. ``worker``: an iterable dataset's producer's [worker id, worker count]. ``serial``: its own dataset loads
    one sample at a time by default (a user's class, no ``--threads``)."""
    return {"producer": producer_id, "host": pysocket.gethostname(), "pid": os.getpid(), "slots": slots,
            "ahead": ahead, "dataset": dataset, "pool": True, "tasks": TASKS_PER_MESSAGE,
            **({"serial": True} if serial else {}),
            **({"shm": shm_token} if shm_token is not None else {}),
            **({"worker": worker} if worker is not None else {})}

"""Tasks a real producer takes ahead of its slots (``--ahead``): what its HELLO says, and that the tasks beyond its
slots wait their turn, in order, with never more than ``--slots`` running.

A hand-made consumer (a raw ROUTER speaking the protocol) talks to a real ``python -m ferry.producer``. The
dispatcher's side of the window (who gets how many tasks, what a loss charges) is proven without sockets in
tests/test_dispatcher.py and tests/test_core.py.
"""

from __future__ import annotations

import time

import pytest

from ferry.common import protocol

from .helpers import HandMadeConsumer, welcome_fields

SESSION = 7


@pytest.fixture
def consumer():
    made = HandMadeConsumer()
    yield made
    made.close()


@pytest.mark.parametrize("flags, env, said", [
    ((), {}, 3),  # by default as many as its slots
    (("--ahead", "5"), {}, 5),
    ((), {"FERRY_AHEAD": "0"}, 0),  # none: its slots only, as before
])
def test_the_hello_says_how_many_tasks_the_producer_takes_ahead(consumer, flags, env, said):
    consumer.start("synthetic", {"length": 8, "shape": [2]}, threads=1, slots=3, extra=flags, env=env)
    hello, _ = consumer.next_message(protocol.HELLO)
    assert hello["slots"] == 3 and hello["ahead"] == said


def test_tasks_beyond_its_slots_wait_their_turn_in_order_and_no_more_than_its_slots_run(consumer):
    delay = 0.2  # each one-sample batch sleeps this long: four at once would take one delay, one at a time four
    consumer.start("synthetic", {"length": 8, "shape": [2], "delay": delay}, threads=4, slots=1, extra=("--ahead", "3"))
    hello, _ = consumer.next_message(protocol.HELLO)
    assert hello["ahead"] == 3
    consumer.send(protocol.WELCOME, session=SESSION, heartbeat=0.2, nonce=hello["nonce"], **welcome_fields())
    start = time.monotonic()
    for task in range(1, 5):  # its whole window at once: 1 slot + 3 ahead
        consumer.send(protocol.TASK, session=SESSION, task=task, epoch=0, seq=task, indices=[task], on_error="raise")
    answered = [consumer.next_message(protocol.BATCH)[0]["task"] for _ in range(4)]
    took = time.monotonic() - start
    assert answered == [1, 2, 3, 4], "queued tasks start in the order given"
    assert took >= 4 * delay, f"4 batches of {delay} s in {took:.2f} s: more than its 1 slot ran at once"

"""The reorder buffer's rules, in isolation: plan order, the held count behind the memory bound, runs.

``held`` is half of the credit rule (``in_flight + held < buffer_batches``), so every way it could drift is
pinned here: what counts, what does not, and what a stale run may not touch.
"""

import threading

import pytest

from ferry.consumer.buffer import Delivery, EndOfRun, ReorderBuffer, is_eof


class Releases:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def make(in_order: bool = True) -> tuple[ReorderBuffer, Releases]:
    releases = Releases()
    return ReorderBuffer(in_order=in_order, on_release=releases), releases


def drain(buffer: ReorderBuffer) -> list:
    out = []
    for _ in range(100):
        item = buffer.get(timeout=0)
        if item is None:
            return out
        out.append(item if is_eof(item) else item.seq)
    raise AssertionError("the buffer never ran dry")


def test_a_plain_delivery_is_a_batch_to_count_and_yield():
    a, b = Delivery(run=0, seq=0), Delivery(run=0, seq=1)
    assert a.skipped is False and a.error is None and a.tree is None and a.nbytes == 0
    assert a.event is None
    assert a.frames == [] and a.frames is not b.frames  # each delivery keeps its own frames alive


def test_before_the_first_run_get_gives_nothing_and_held_is_zero():
    buffer, _ = make()
    assert buffer.held == 0
    assert buffer.get(timeout=0) is None  # not EndOfRun: no run has started
    assert buffer.put(Delivery(run=0, seq=0)) is False  # no run yet: refused


def test_in_order_waits_for_the_next_seq_and_ends_once():
    buffer, _ = make(in_order=True)
    buffer.reset(0, [2, 0, 1])  # plan order need not be sorted; run 0 is a run like any other
    assert buffer.put(Delivery(run=0, seq=0)) and buffer.put(Delivery(run=0, seq=1))
    assert buffer.get(timeout=0) is None  # seq 2 comes first, and it is missing
    assert buffer.put(Delivery(run=0, seq=2))
    assert drain(buffer) == [2, 0, 1, EndOfRun(0)]
    assert buffer.get(timeout=0) is None  # EndOfRun is given once


def test_out_of_order_gives_arrival_order():
    buffer, _ = make(in_order=False)
    buffer.reset(3, [0, 1, 2])
    for seq in (2, 0, 1):
        buffer.put(Delivery(run=3, seq=seq))
    assert drain(buffer) == [2, 0, 1, EndOfRun(3)]


def test_held_counts_batches_put_and_not_yet_released():
    buffer, releases = make()
    buffer.reset(1, range(4))
    assert buffer.put(Delivery(run=1, seq=0))
    assert buffer.put(Delivery(run=1, seq=1, error=ValueError("sample failed")))  # an error holds a credit too
    assert buffer.put(Delivery(run=1, seq=2, skipped=True)) is True  # accepted, but nothing to hold
    assert buffer.held == 2
    assert drain(buffer) == [0, 1]  # the skipped seq is passed over, not yielded
    assert buffer.held == 2  # taking from the buffer is not a release: the loop still holds them
    buffer.release(1)
    assert buffer.held == 1 and releases.count == 1
    buffer.release(1)
    assert buffer.held == 0 and releases.count == 2


def test_a_duplicate_seq_or_a_stale_run_changes_nothing():
    buffer, releases = make()
    buffer.reset(5, range(3))
    assert buffer.put(Delivery(run=5, seq=0)) is True
    assert buffer.put(Delivery(run=5, seq=0)) is False  # a late twin
    assert buffer.put(Delivery(run=4, seq=1)) is False  # the abandoned iteration's batch
    assert buffer.held == 1
    buffer.release(4)  # the loop dropped a batch of the abandoned iteration
    assert buffer.held == 1 and releases.count == 0
    assert drain(buffer) == [0]


def test_reset_forgets_the_old_run():
    buffer, _ = make()
    buffer.reset(1, range(3))
    buffer.put(Delivery(run=1, seq=0))
    buffer.put(Delivery(run=1, seq=2))
    assert drain(buffer) == [0]
    buffer.reset(2, range(2))
    assert buffer.held == 0
    assert buffer.put(Delivery(run=2, seq=0)) is True  # seq 0 again, in the new run: not a duplicate
    buffer.put(Delivery(run=2, seq=1))
    assert drain(buffer) == [0, 1, EndOfRun(2)]


def test_an_empty_run_ends_at_once():
    buffer, _ = make()
    buffer.reset(0, [])
    assert drain(buffer) == [EndOfRun(0)]


def test_get_wakes_up_when_the_awaited_seq_arrives():
    buffer, _ = make()
    buffer.reset(1, range(1))
    got = []
    taker = threading.Thread(target=lambda: got.append(buffer.get(timeout=30)))
    taker.start()
    buffer.put(Delivery(run=1, seq=0))
    taker.join(30)
    assert not taker.is_alive() and got and got[0].seq == 0


def test_get_times_out_with_none():
    buffer, _ = make()
    buffer.reset(1, range(1))
    assert buffer.get(timeout=0.01) is None


def test_end_of_run_is_a_named_immutable_marker():
    marker = EndOfRun(3)
    assert is_eof(marker) and not is_eof(None) and not is_eof(Delivery(run=3, seq=0))
    with pytest.raises(AttributeError):
        marker.run = 4

"""A map-style run's order and reorder buffer (MapSequencer), in isolation: plan order, the held count behind
the memory bound, resume positions.

``held`` is half of the credit rule (``in_flight + held < buffer_batches``), so every way it could drift is
pinned here: what counts, what does not.
"""

import pytest

from ferry.common.plan import EpochPlan
from ferry.common.shardplan import ShardPlan, encode_seq
from ferry.consumer.core import Delivery, EndOfRun, is_eof, sequencer_for
from ferry.consumer.core.sequencers import MapSequencer
from ferry.consumer.core.shards import ShardSequencer


def plan(n: int) -> EpochPlan:
    return EpochPlan.from_batches(0, [[i] for i in range(n)])


def drain(sequencer) -> list:
    out = []
    for _ in range(100):
        item = sequencer.take()
        if item is None:
            return out
        out.append(item if is_eof(item) else item.seq)
    raise AssertionError("the sequencer never ran dry")


def issue_all(sequencer) -> list[int]:
    return [s for s in iter(lambda: sequencer.next_seq(b"p", {b"p"}, True), None)]


def test_a_plain_delivery_is_a_batch_to_count_and_yield():
    a = Delivery(run=0, seq=0)
    assert a.skipped is False and a.error is None and a.tree is None and a.nbytes == 0
    assert a.event is None and a.frames is None


def test_new_seqs_are_issued_once_in_plan_order_from_the_first():
    s = MapSequencer(3, plan(5), 2, in_order=True)
    assert (s.run, s.first_seq, s.total, s.waiting) == (3, 2, 3, 3)
    assert issue_all(s) == [2, 3, 4]
    assert s.waiting == 0 and s.next_seq(b"q", {b"q"}, True) is None
    assert s.indices(3) == [3] and s.task_fields(3) == {}


def test_in_order_waits_for_the_next_seq_and_ends_once():
    s = MapSequencer(0, plan(3), 0, in_order=True)
    assert s.put(Delivery(run=0, seq=1)) and s.put(Delivery(run=0, seq=2))
    assert s.take() is None  # seq 0 comes first, and it is missing
    assert s.put(Delivery(run=0, seq=0))
    assert drain(s) == [0, 1, 2, EndOfRun(0)]
    assert s.take() is None  # EndOfRun is given once


def test_out_of_order_gives_arrival_order():
    s = MapSequencer(3, plan(3), 0, in_order=False)
    for seq in (2, 0):
        s.put(Delivery(run=3, seq=seq))
    assert drain(s) == [2, 0]
    s.put(Delivery(run=3, seq=1))
    assert drain(s) == [1, EndOfRun(3)]


def test_held_counts_batches_put_and_not_yet_released():
    s = MapSequencer(1, plan(4), 0, in_order=True)
    assert s.put(Delivery(run=1, seq=0))
    assert s.put(Delivery(run=1, seq=1, error=ValueError("sample failed")))  # an error holds a credit too
    assert s.put(Delivery(run=1, seq=2, skipped=True)) is True  # accepted, but nothing to hold
    assert s.held == 2
    assert drain(s) == [0, 1]  # the skipped seq is passed over, not yielded
    assert s.held == 2  # taking is not a release: the loop still holds them
    s.release()
    assert s.held == 1
    s.release()
    assert s.held == 0


def test_a_duplicate_seq_is_refused_and_holds_nothing():
    s = MapSequencer(5, plan(3), 0, in_order=True)
    assert s.put(Delivery(run=5, seq=0)) is True
    assert s.put(Delivery(run=5, seq=0)) is False  # a late twin
    assert s.held == 1
    assert drain(s) == [0]


@pytest.mark.parametrize("in_order", [True, False])
def test_an_empty_run_ends_at_once(in_order):
    assert drain(MapSequencer(0, plan(0), 0, in_order=in_order)) == [EndOfRun(0)]
    assert drain(MapSequencer(0, plan(4), 4, in_order=in_order)) == [EndOfRun(0)]  # resumed at its end


def test_a_skipped_last_seq_still_ends_the_run():
    s = MapSequencer(0, plan(2), 0, in_order=False)
    s.put(Delivery(run=0, seq=1, skipped=True))
    s.put(Delivery(run=0, seq=0))
    assert drain(s) == [0, EndOfRun(0)]


def test_end_of_run_is_a_named_immutable_marker():
    marker = EndOfRun(3)
    assert is_eof(marker) and not is_eof(None) and not is_eof(Delivery(run=3, seq=0))
    with pytest.raises(AttributeError):
        marker.run = 4


def test_the_kind_of_plan_chooses_the_sequencer_and_its_start():
    m = sequencer_for(2, plan(6), 4, (0, 0), in_order=True)
    assert isinstance(m, MapSequencer) and (m.run, m.first_seq, m.total) == (2, 4, 2)
    shards = ShardPlan(0, (2, 0, 1), batch_size=2, drop_last=False, lengths=(3, 4, 5))
    s = sequencer_for(2, shards, 3, (1, 1), in_order=False)  # a sharded run is always in plan order
    assert isinstance(s, ShardSequencer) and (s.run, s.first_seq, s.total) == (2, 3, len(shards) - 3)
    assert (s.position, s.batch) == (1, 1)
    assert sequencer_for(1, ShardPlan(0, (0,), 2, False), 0, (0, 0), in_order=True).total is None


def test_resume_positions_within_a_shard():
    assert MapSequencer.shard_after(7) == (0, 0)
    assert ShardSequencer.shard_after(encode_seq(3, 5)) == (3, 6)

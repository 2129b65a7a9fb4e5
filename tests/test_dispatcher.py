"""The dispatcher's rules, in isolation: credits, slots, re-issue order, identity of results."""

import dataclasses

import pytest

from ferry.common.constants import DEFAULT_MAX_ATTEMPTS, MAX_SLOTS
from ferry.common.plan import EpochPlan
from ferry.consumer.core.dispatcher import Attempt, Dispatcher, ProducerInfo
from ferry.consumer.core.sequencers import MapSequencer


def seqs(run: int, order) -> MapSequencer:
    """A run over the seqs ``order`` (consecutive, from its first) of a plan of one-sample batches."""
    order = list(order)
    end = order[-1] + 1 if order else 0
    return MapSequencer(run, EpochPlan.from_batches(0, [[i] for i in range(end)]), order[0] if order else 0,
                        in_order=True)


def producer(peer: bytes, slots: int = 2, nonce: int = 1, ahead: int = 0) -> ProducerInfo:
    return ProducerInfo(peer=peer, producer_id=peer.decode(), nonce=nonce, name=peer.decode(), slots=slots,
                        last_heard=0.0, joined=0.0, ahead=ahead)


def test_credits_bound_in_flight_plus_held():
    d = Dispatcher(capacity=4, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=10))
    d.start_run(seqs(1, range(20)))
    assert len(d.assign(held=0, now=0.0)) == 4
    assert d.assign(held=0, now=0.0) == []
    first = next(iter(d.tasks))
    assert d.complete(first, b"a") is not None
    assert len(d.assign(held=1, now=0.0)) == 0  # the completed batch is held: still no room
    assert len(d.assign(held=0, now=0.0)) == 1


def test_slots_bound_each_producer_and_the_freest_gets_work():
    d = Dispatcher(capacity=100, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=1))
    d.add(producer(b"b", slots=3))
    d.start_run(seqs(1, range(10)))
    tasks = d.assign(held=0, now=0.0)
    assert len(tasks) == 4
    assert [t.peer for t in tasks].count(b"b") == 3 and [t.peer for t in tasks].count(b"a") == 1
    assert [t.seq for t in tasks] == [0, 1, 2, 3]  # issued in seq order


def test_lost_producers_tasks_go_to_the_front_in_seq_order():
    d = Dispatcher(capacity=100, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=2))
    d.add(producer(b"b", slots=2))
    d.start_run(seqs(1, range(10)))
    tasks = d.assign(held=0, now=0.0)
    lost = sorted(t.seq for t in tasks if t.peer == b"a")
    d.lose(b"a")
    assert d.reissued == 2
    d.add(producer(b"c", slots=5))
    again = d.assign(held=0, now=0.0)
    assert [t.seq for t in again][:2] == lost


def test_results_are_accepted_only_from_the_identity_they_were_given_to():
    d = Dispatcher(capacity=10, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a"))
    d.start_run(seqs(1, range(3)))
    task = d.assign(held=0, now=0.0)[0]
    assert d.complete(task.task, b"zz") is None  # a stranger
    d.lose(b"a")
    d.add(producer(b"a", nonce=2))  # same peer, restarted its work
    assert d.complete(task.task, b"a") is None  # the late result of the old registration
    retry = d.assign(held=0, now=0.0)[0]
    assert retry.seq == task.seq and retry.task != task.task
    assert d.complete(retry.task, b"a") is not None
    assert d.complete(retry.task, b"a") is None  # a second copy is a duplicate


def test_reconnection_under_a_new_routing_id_keeps_the_tasks():
    d = Dispatcher(capacity=10, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a"))
    d.start_run(seqs(1, range(3)))
    task = d.assign(held=0, now=0.0)[0]
    d.move(b"a", b"a2")
    assert d.complete(task.task, b"a2") is not None


def test_new_run_forgets_old_tasks_and_overdue_finds_stuck_peers():
    d = Dispatcher(capacity=10, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a"))
    d.start_run(seqs(1, range(5)))
    old = d.assign(held=0, now=10.0)
    assert set(d.overdue_tasks(deadline=11.0)) == {b"a"} and d.overdue_tasks(deadline=5.0) == {}
    d.start_run(seqs(2, range(5)))
    assert d.in_flight == 0 and all(d.complete(t.task, b"a") is None for t in old)


# --- attempts and poison tasks -------------------------------------------------------------------------------
def test_a_seq_lost_max_attempts_times_is_poisoned_not_queued_and_its_attempts_survive_reissue():
    d = Dispatcher(capacity=10, max_attempts=3)
    d.start_run(seqs(1, range(2)))
    for n in range(3):
        d.add(producer(b"p%d" % n, slots=1))
        task = d.assign(held=0, now=0.0)[0]
        assert task.seq == 0  # the lost seq is issued again, first
        d.lose(task.peer, f"died {n}")
    poisoned = d.take_poisoned()
    assert [(p.seq, [a.cause for a in p.attempts]) for p in poisoned] == [(0, ["died 0", "died 1", "died 2"])]
    assert [a.producer for a in poisoned[0].attempts] == ["p0", "p1", "p2"]
    assert d.take_poisoned() == []  # given once
    d.add(producer(b"q", slots=5))
    assert [t.seq for t in d.assign(held=0, now=0.0)] == [1]  # seq 0 is never issued again
    assert d.reissued == 2


def test_a_loss_without_a_cause_costs_no_attempt_and_a_new_run_resets_the_count():
    d = Dispatcher(capacity=10, max_attempts=2)
    d.start_run(seqs(1, range(1)))
    for n in range(4):  # orderly leaves (BYE): re-issued each time
        d.add(producer(b"a%d" % n, slots=1))
        d.lose(d.assign(held=0, now=0.0)[0].peer)
    assert d.take_poisoned() == [] and d.queued == 1
    d.add(producer(b"b", slots=1))
    d.lose(d.assign(held=0, now=0.0)[0].peer, "died")
    d.start_run(seqs(2, range(1)))  # a new run: attempts start over
    d.add(producer(b"c", slots=1))
    d.lose(d.assign(held=0, now=0.0)[0].peer, "died")
    assert d.take_poisoned() == [] and d.queued == 1


def test_a_producer_lost_holding_several_tasks_charges_each_or_only_those_named():
    d = Dispatcher(capacity=10, max_attempts=1)
    d.start_run(seqs(1, range(6)))
    d.add(producer(b"a", slots=3))
    held = d.assign(held=0, now=0.0)
    d.lose(b"a", "died")
    assert sorted(p.seq for p in d.take_poisoned()) == [t.seq for t in held]
    d.add(producer(b"b", slots=3))
    tasks = d.assign(held=0, now=0.0)
    d.lose(b"b", "timed out", charged={tasks[0].task})  # only the overdue one is charged
    assert [p.seq for p in d.take_poisoned()] == [tasks[0].seq]
    d.add(producer(b"c", slots=3))
    assert sorted(t.seq for t in d.assign(held=0, now=0.0)[:2]) == sorted(t.seq for t in tasks[1:])  # back, uncharged


def test_an_unusable_answer_costs_an_attempt():
    d = Dispatcher(capacity=10, max_attempts=2)
    d.add(producer(b"a", slots=1))
    d.start_run(seqs(1, range(1)))
    for n in range(2):
        task = d.assign(held=0, now=0.0)[0]
        assert d.complete(task.task, b"a") is not None
        d.requeue(task, Attempt("a", "unusable"))
    assert [p.seq for p in d.take_poisoned()] == [0] and d.queued == 0


def test_a_new_producer_is_remote_and_has_delivered_nothing():
    info = producer(b"a")
    # a remote producer is never handed a shared-memory slot, and the stats start from zero
    assert info.shared is False and info.pid == 0 and info.batches == 0 and info.bytes == 0
    assert info.identity == ("a", 1) and info.room == 2


def test_tasks_cannot_be_changed_once_issued():
    d = Dispatcher(capacity=1, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a"))
    d.start_run(seqs(7, [4]))
    (task,) = d.assign(held=0, now=3.0)
    assert (task.run, task.seq, task.identity, task.peer, task.issued) == (7, 4, ("a", 1), b"a", 3.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.seq = 5


def test_before_the_first_run_nothing_is_queued_or_issued():
    d = Dispatcher(capacity=4, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a"))
    assert d.queued == 0 and d.in_flight == 0 and d.assign(held=0, now=0.0) == []
    assert d.lose(b"a") is not None and d.reissued == 0 and d.run == -1
    assert d.lose(b"a") is None  # already gone


def test_find_identity_tells_a_reconnection_from_a_restart():
    d = Dispatcher(capacity=4, max_attempts=DEFAULT_MAX_ATTEMPTS)
    a, b = producer(b"a", nonce=1), producer(b"b", nonce=1)
    d.add(a)
    d.add(b)
    assert d.find_identity(("a", 1)) is a and d.find_identity(("b", 1)) is b
    assert d.find_identity(("a", 2)) is None  # same producer, new nonce: its work is gone


def test_a_moved_producer_gets_its_new_tasks_under_the_new_routing_id():
    d = Dispatcher(capacity=10, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=2))
    d.start_run(seqs(1, range(4)))
    first = d.assign(held=0, now=0.0)
    moved = d.move(b"a", b"a2")
    assert moved.peer == b"a2" and set(d.producers) == {b"a2"}
    assert all(d.tasks[t.task].peer == b"a2" for t in first)  # results and time-outs find the new peer
    assert set(d.overdue_tasks(deadline=1.0)) == {b"a2"}
    assert d.complete(first[0].task, b"a2") is not None
    (later,) = d.assign(held=0, now=0.0)
    assert later.peer == b"a2"


def test_reissued_counts_every_seq_given_out_again():
    d = Dispatcher(capacity=10, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=2))
    d.add(producer(b"b", slots=2))
    d.start_run(seqs(1, range(10)))
    d.assign(held=0, now=0.0)
    d.lose(b"a")
    d.lose(b"b")
    assert d.reissued == 4  # two losses of two tasks each add up
    d.add(producer(b"c", slots=1))
    (task,) = d.assign(held=0, now=0.0)
    d.complete(task.task, b"c")
    d.requeue(task, Attempt("c", "unusable"))
    assert d.reissued == 5


def test_requeue_issues_an_unusable_result_again_first():
    d = Dispatcher(capacity=10, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=1))
    d.start_run(seqs(1, range(5)))
    (task,) = d.assign(held=0, now=0.0)
    assert d.complete(task.task, b"a") is task
    d.requeue(task, Attempt("a", "unusable"))
    assert d.queued == 5
    (again,) = d.assign(held=0, now=0.0)
    assert again.seq == task.seq and again.task != task.task


def test_a_task_issued_exactly_at_the_deadline_is_not_overdue():
    d = Dispatcher(capacity=10, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a"))
    d.start_run(seqs(1, range(2)))
    d.assign(held=0, now=10.0)
    assert d.overdue_tasks(deadline=10.0) == {}
    assert set(d.overdue_tasks(deadline=10.000001)) == {b"a"}


# --- what the mutation run found untested (.ci/mutation dispatcher) -------------------------------------------
def test_attempts_and_poisoned_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Attempt("p", "died").cause = "other"  # type: ignore[misc]
    d = Dispatcher(capacity=4, max_attempts=1)
    d.start_run(seqs(1, range(1)))
    d.add(producer(b"a", slots=1))
    d.lose(d.assign(held=0, now=0.0)[0].peer, "died")
    (poisoned,) = d.take_poisoned()
    with pytest.raises(dataclasses.FrozenInstanceError):
        poisoned.seq = 5  # type: ignore[misc]


def test_the_default_max_attempts_is_the_documented_one_and_nothing_is_poisoned_before_a_run():
    d = Dispatcher(capacity=1, max_attempts=DEFAULT_MAX_ATTEMPTS)
    assert DEFAULT_MAX_ATTEMPTS == 3
    d.add(producer(b"a", slots=1))
    d.lose(b"a", "died")  # a producer lost before any run held nothing
    assert d.take_poisoned() == []


def test_drop_removes_a_task_without_reissue_and_frees_its_slot():
    d = Dispatcher(capacity=4, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.start_run(seqs(1, range(3)))
    d.add(producer(b"a", slots=2))
    first, _ = d.assign(held=0, now=0.0)
    assert d.drop(first.task) == first
    assert d.drop(first.task) is None  # gone: a second drop finds nothing
    assert d.in_flight == 1 and d.producers[b"a"].room == 1
    assert d.queued == 1 and d.reissued == 0  # not queued again: its seq ends in an error instead
    assert [t.seq for t in d.assign(held=0, now=0.0)] == [2]


def test_overdue_tasks_by_peer_strictly_before_the_deadline():
    d = Dispatcher(capacity=3, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.start_run(seqs(1, range(4)))
    d.add(producer(b"a", slots=2))
    d.add(producer(b"b", slots=2))
    (early,) = d.assign(held=2, now=1.0)
    (late,) = d.assign(held=1, now=2.0)
    assert early.peer != late.peer
    assert d.overdue_tasks(1.0) == {}  # issued at the deadline is not overdue
    assert d.overdue_tasks(1.5) == {early.peer: {early.task}}
    assert d.overdue_tasks(3.0) == {early.peer: {early.task}, late.peer: {late.task}}


def test_task_ids_are_never_reused_across_runs():
    """A late answer of an abandoned run must never match a task of the next run."""
    d = Dispatcher(capacity=4, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=4))
    d.start_run(seqs(1, range(4)))
    old = {t.task for t in d.assign(held=0, now=0.0)}
    d.start_run(seqs(2, range(4)))
    new = {t.task for t in d.assign(held=0, now=0.0)}
    assert len(new) == 4 and not old & new
    assert all(d.complete(task, b"a") is None for task in old)


def test_the_first_tasks_are_dealt_one_to_each_producer_until_every_local_producer_is_live():
    """As DataLoader hands its first tasks to every worker in turn: the first producer up takes one task, not
    all of them, while the others start (issue 18: every producer's seed is seen)."""
    d = Dispatcher(capacity=8, max_attempts=DEFAULT_MAX_ATTEMPTS, deal_to=3, deal_until=30.0)
    d.add(producer(b"a", slots=4))
    d.start_run(seqs(1, range(20)))
    (first,) = d.assign(held=0, now=0.0)
    assert first.peer == b"a"
    assert d.complete(first.task, b"a") is not None
    assert d.assign(held=1, now=0.05) == [], "a producer that had its task waits for the others to start"
    d.add(producer(b"b", slots=4))
    assert [t.peer for t in d.assign(held=1, now=0.1)] == [b"b"]
    d.add(producer(b"c", slots=4))  # all three live: dealing is over, the slots are the bound again
    assert len(d.assign(held=1, now=0.2)) == 8 - 1 - 1
    assert max(len(p.in_flight) for p in d.producers.values()) > 1


def test_dealing_ends_at_its_deadline_or_at_a_death_even_if_a_producer_never_comes():
    for end in ("deadline", "death"):
        d = Dispatcher(capacity=8, max_attempts=DEFAULT_MAX_ATTEMPTS, deal_to=2, deal_until=30.0)
        d.add(producer(b"a", slots=4))
        d.start_run(seqs(1, range(20)))
        assert len(d.assign(held=0, now=1.0)) == 1
        assert d.assign(held=0, now=2.0) == []
        if end == "death":
            d.end_dealing()
        assert len(d.assign(held=0, now=30.0 if end == "deadline" else 2.0)) == 3


def test_between_producers_with_as_many_free_slots_tasks_go_in_turn():
    """One task at a time to idle producers goes round them, not always to the first one that joined."""
    d = Dispatcher(capacity=1, max_attempts=DEFAULT_MAX_ATTEMPTS)
    for name in (b"a", b"b", b"c"):
        d.add(producer(name, slots=2))
    d.start_run(seqs(1, range(9)))
    peers = []
    for _ in range(6):
        (task,) = d.assign(held=0, now=0.0)
        peers.append(task.peer)
        assert d.complete(task.task, task.peer) is not None
    assert peers == [b"a", b"b", b"c", b"a", b"b", b"c"]


def test_busy_time_counts_full_producers_since_the_last_event_and_nothing_before_it():
    d = Dispatcher(capacity=100, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=2))
    d.start_run(seqs(1, range(10)))
    assert len(d.assign(held=0, now=10.0)) == 2
    d.occupancy(10.0)  # from now on one producer has every slot in use
    assert d.busy_until(10.0) == 0.0, "no time has passed since the event"
    assert d.busy_until(9.5) == 0.0, "a clock read before the event counts nothing"
    assert d.busy_until(12.5) == pytest.approx(2.5)
    d.complete(next(iter(d.tasks)), b"a")
    d.occupancy(12.5)  # half its slots from here on
    assert d.busy_s == pytest.approx(2.5) and d.busy_until(14.5) == pytest.approx(3.5)


def test_a_producer_holds_its_slots_and_the_tasks_it_takes_ahead_within_the_capacity():
    d = Dispatcher(capacity=100, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=2, ahead=3))  # said HELLO ahead=3: a window of 5
    d.add(producer(b"b", slots=2))  # said nothing: its slots only
    d.start_run(seqs(1, range(20)))
    tasks = d.assign(held=0, now=0.0)
    assert [t.peer for t in tasks].count(b"a") == 5 and [t.peer for t in tasks].count(b"b") == 2
    assert d.assign(held=0, now=0.0) == []
    d.complete(next(t.task for t in tasks if t.peer == b"a"), b"a")
    assert [t.peer for t in d.assign(held=0, now=0.0)] == [b"a"]  # its one freed place, no more


def test_the_capacity_bounds_a_window_and_a_window_is_at_most_max_slots():
    d = Dispatcher(capacity=6, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=4, ahead=4))
    d.start_run(seqs(1, range(20)))
    assert len(d.assign(held=2, now=0.0)) == 4  # 4 + 2 held = the capacity, though its window is 8
    assert producer(b"x", slots=MAX_SLOTS, ahead=MAX_SLOTS).window == MAX_SLOTS


def test_occupancy_counts_slots_in_use_not_the_tasks_queued_ahead():
    d = Dispatcher(capacity=100, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=2, ahead=2))
    d.start_run(seqs(1, range(10)))
    assert len(d.assign(held=0, now=0.0)) == 4
    d.occupancy(0.0)
    assert d.busy_until(1.0) == pytest.approx(1.0), "a full producer counts once, its queue on top adds nothing"


def test_a_lost_producer_s_tasks_queued_ahead_cost_no_attempt_only_those_it_may_have_started():
    d = Dispatcher(capacity=100, max_attempts=2)
    d.add(producer(b"a", slots=2, ahead=2))
    d.start_run(seqs(1, range(10)))
    tasks = d.assign(held=0, now=0.0)
    assert [t.seq for t in tasks] == [0, 1, 2, 3]
    d.lose(b"a", "died")  # it runs seqs 0 and 1; 2 and 3 waited in its queue
    d.add(producer(b"b", slots=2, ahead=2, nonce=2))
    again = d.assign(held=0, now=0.0)
    assert [t.seq for t in again] == [0, 1, 2, 3]
    d.lose(b"b", "died")  # a second attempt of 0 and 1: poisoned; 2 and 3 still have both of theirs
    assert sorted(p.seq for p in d.take_poisoned()) == [0, 1]
    d.add(producer(b"c", slots=4, nonce=3))
    assert [t.seq for t in d.assign(held=0, now=0.0)] == [2, 3, 4, 5]


def test_a_task_queued_ahead_is_never_overdue_and_its_clock_starts_when_a_slot_is_its():
    d = Dispatcher(capacity=100, max_attempts=1)
    d.add(producer(b"a", slots=1, ahead=1))
    d.start_run(seqs(1, range(4)))
    first, second = d.assign(held=0, now=0.0)  # seq 0 runs, seq 1 waits behind it
    d.occupancy(0.0)
    assert d.overdue_tasks(1.0) == {b"a": {first.task}}, "the queued task has not started: it cannot be late"
    d.complete(first.task, b"a")
    d.occupancy(70.0)  # seq 0 took 70 s; seq 1 may start only now
    timeout = 50.0
    assert d.overdue_tasks(110.0 - timeout) == {}, "at 110 s seq 1 has run 40 s, not the 110 since its issue"
    assert set(d._turns) == {second.task}, "the answered task's clock is let go (no clock outlives its task)"
    assert d.overdue_tasks(121.0 - timeout) == {b"a": {second.task}}
    d.lose(b"a", "held a task too long", charged=d.overdue_tasks(121.0 - timeout)[b"a"])
    assert [p.seq for p in d.take_poisoned()] == [1]


def test_a_task_goes_to_a_free_slot_before_another_producer_s_queue():
    d = Dispatcher(capacity=8, max_attempts=DEFAULT_MAX_ATTEMPTS)
    d.add(producer(b"a", slots=2, ahead=6))  # much room, but only 2 slots
    d.add(producer(b"b", slots=2))
    d.add(producer(b"c", slots=2))
    d.start_run(seqs(1, range(20)))
    held = [t.peer for t in d.assign(held=0, now=0.0)]
    assert (held.count(b"a"), held.count(b"b"), held.count(b"c")) == (4, 2, 2), \
        "every slot busy before any task waits in a queue"

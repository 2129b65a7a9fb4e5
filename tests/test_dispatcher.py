"""The dispatcher's rules, in isolation: credits, slots, re-issue order, identity of results."""

from ferry.consumer.dispatcher import Attempt, Dispatcher, ProducerInfo


def producer(peer: bytes, slots: int = 2, nonce: int = 1) -> ProducerInfo:
    return ProducerInfo(peer=peer, producer_id=peer.decode(), nonce=nonce, name=peer.decode(), slots=slots,
                        last_heard=0.0, joined=0.0)


def test_credits_bound_in_flight_plus_held():
    d = Dispatcher(capacity=4)
    d.add(producer(b"a", slots=10))
    d.start_run(1, range(20))
    assert len(d.assign(held=0)) == 4
    assert d.assign(held=0) == []
    first = next(iter(d.tasks))
    assert d.complete(first, b"a") is not None
    assert len(d.assign(held=1)) == 0  # the completed batch is held: still no room
    assert len(d.assign(held=0)) == 1


def test_slots_bound_each_producer_and_the_freest_gets_work():
    d = Dispatcher(capacity=100)
    d.add(producer(b"a", slots=1))
    d.add(producer(b"b", slots=3))
    d.start_run(1, range(10))
    tasks = d.assign(held=0)
    assert len(tasks) == 4
    assert [t.peer for t in tasks].count(b"b") == 3 and [t.peer for t in tasks].count(b"a") == 1
    assert [t.seq for t in tasks] == [0, 1, 2, 3]  # issued in seq order


def test_lost_producers_tasks_go_to_the_front_in_seq_order():
    d = Dispatcher(capacity=100)
    d.add(producer(b"a", slots=2))
    d.add(producer(b"b", slots=2))
    d.start_run(1, range(10))
    tasks = d.assign(held=0)
    lost = sorted(t.seq for t in tasks if t.peer == b"a")
    d.lose(b"a")
    assert d.reissued == 2
    d.add(producer(b"c", slots=5))
    again = d.assign(held=0)
    assert [t.seq for t in again][:2] == lost


def test_results_are_accepted_only_from_the_identity_they_were_given_to():
    d = Dispatcher(capacity=10)
    d.add(producer(b"a"))
    d.start_run(1, range(3))
    task = d.assign(held=0)[0]
    assert d.complete(task.task, b"zz") is None  # a stranger
    d.lose(b"a")
    d.add(producer(b"a", nonce=2))  # same peer, restarted its work
    assert d.complete(task.task, b"a") is None  # the late result of the old registration
    retry = d.assign(held=0)[0]
    assert retry.seq == task.seq and retry.task != task.task
    assert d.complete(retry.task, b"a") is not None
    assert d.complete(retry.task, b"a") is None  # a second copy is a duplicate


def test_reconnection_under_a_new_routing_id_keeps_the_tasks():
    d = Dispatcher(capacity=10)
    d.add(producer(b"a"))
    d.start_run(1, range(3))
    task = d.assign(held=0)[0]
    d.move(b"a", b"a2")
    assert d.complete(task.task, b"a2") is not None


def test_new_run_forgets_old_tasks_and_overdue_finds_stuck_peers():
    d = Dispatcher(capacity=10)
    d.add(producer(b"a"))
    d.start_run(1, range(5))
    old = d.assign(held=0, now=10.0)
    assert d.overdue(deadline=11.0) == {b"a"} and d.overdue(deadline=5.0) == set()
    d.start_run(2, range(5))
    assert d.in_flight == 0 and all(d.complete(t.task, b"a") is None for t in old)


# --- attempts and poison tasks -------------------------------------------------------------------------------
def test_a_seq_lost_max_attempts_times_is_poisoned_not_queued_and_its_attempts_survive_reissue():
    d = Dispatcher(capacity=10, max_attempts=3)
    d.start_run(1, range(2))
    for n in range(3):
        d.add(producer(b"p%d" % n, slots=1))
        task = d.assign(held=0)[0]
        assert task.seq == 0  # the lost seq is issued again, first
        d.lose(task.peer, f"died {n}")
    poisoned = d.take_poisoned()
    assert [(p.seq, [a.cause for a in p.attempts]) for p in poisoned] == [(0, ["died 0", "died 1", "died 2"])]
    assert [a.producer for a in poisoned[0].attempts] == ["p0", "p1", "p2"]
    assert d.take_poisoned() == []  # given once
    d.add(producer(b"q", slots=5))
    assert [t.seq for t in d.assign(held=0)] == [1]  # seq 0 is never issued again
    assert d.reissued == 2


def test_a_loss_without_a_cause_costs_no_attempt_and_a_new_run_resets_the_count():
    d = Dispatcher(capacity=10, max_attempts=2)
    d.start_run(1, range(1))
    for n in range(4):  # orderly leaves (BYE): re-issued each time
        d.add(producer(b"a%d" % n, slots=1))
        d.lose(d.assign(held=0)[0].peer)
    assert d.take_poisoned() == [] and d.queued == 1
    d.add(producer(b"b", slots=1))
    d.lose(d.assign(held=0)[0].peer, "died")
    d.start_run(2, range(1))  # a new run: attempts start over
    d.add(producer(b"c", slots=1))
    d.lose(d.assign(held=0)[0].peer, "died")
    assert d.take_poisoned() == [] and d.queued == 1


def test_a_producer_lost_holding_several_tasks_charges_each_or_only_those_named():
    d = Dispatcher(capacity=10, max_attempts=1)
    d.start_run(1, range(6))
    d.add(producer(b"a", slots=3))
    held = d.assign(held=0)
    d.lose(b"a", "died")
    assert sorted(p.seq for p in d.take_poisoned()) == [t.seq for t in held]
    d.add(producer(b"b", slots=3))
    tasks = d.assign(held=0)
    d.lose(b"b", "timed out", charged={tasks[0].task})  # only the overdue one is charged
    assert [p.seq for p in d.take_poisoned()] == [tasks[0].seq]
    assert sorted(d._queue) == sorted(t.seq for t in tasks[1:])  # the others go back, uncharged


def test_an_unusable_answer_costs_an_attempt():
    d = Dispatcher(capacity=10, max_attempts=2)
    d.add(producer(b"a", slots=1))
    d.start_run(1, range(1))
    for n in range(2):
        task = d.assign(held=0)[0]
        assert d.complete(task.task, b"a") is not None
        d.requeue(task, Attempt("a", "unusable"))
    assert [p.seq for p in d.take_poisoned()] == [0] and d.queued == 0

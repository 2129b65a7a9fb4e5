"""Admission of producers and their liveness, in isolation: HELLO dicts in, decisions out. No sockets."""

from ferry.common.plan import EpochPlan
from ferry.consumer.core.admission import INVALID_LOG_BURST, BadPeers, Peers
from ferry.consumer.core.dispatcher import Dispatcher
from ferry.consumer.core.sequencers import MapSequencer


def seqs(run: int, n: int) -> MapSequencer:
    return MapSequencer(run, EpochPlan.from_batches(0, [[i] for i in range(n)]), 0, in_order=True)


def hello(producer: str = "p", *, nonce: int = 1, pid: int = 7, slots: int = 2, length: int = 100,
          fingerprint: str = "f", shm: str | None = None) -> dict:
    message = dict(producer=producer, nonce=nonce, host="h", pid=pid, slots=slots,
                   dataset={"spec": "s", "len": length, "fingerprint": fingerprint})
    if shm is not None:
        message["shm"] = shm
    return message


def peers(dataset_len=None, fingerprint=None, shm_token=None, capacity=100) -> Peers:
    return Peers(Dispatcher(capacity, max_attempts=3), dataset_len=dataset_len, fingerprint=fingerprint, shm_token=shm_token,
                 now=0.0)


def test_the_first_producer_sets_the_dataset_and_a_different_one_is_refused_naming_both():
    p = peers()
    assert not p.dataset_known
    first = p.admit(b"a", hello("p1", length=100, fingerprint="f"), now=1.0)
    assert first.reject is None and first.joined is not None and first.live == 1
    assert p.dataset_known and (p.dataset_len, p.fingerprint) == (100, "f")
    other = p.admit(b"b", hello("p2", length=99), now=2.0)
    assert other.joined is None and "length 99" in other.reject and "100" in other.reject
    assert "first producer h:7" in other.reject
    other = p.admit(b"b", hello("p2", fingerprint="g"), now=2.0)
    assert "fingerprint 'g'" in other.reject and "'f'" in other.reject
    assert list(p.dispatcher.producers) == [b"a"] and p.seen == 1


def test_a_consumer_given_the_dataset_refuses_another_even_from_the_first_producer():
    p = peers(dataset_len=10, fingerprint="x")
    assert p.dataset_known
    refused = p.admit(b"a", hello(length=10, fingerprint="y"), now=1.0)
    assert refused.reject is not None and "first producer" not in refused.reject
    assert p.fingerprint == "x" and not p.dispatcher.producers and p.seen == 0


def test_a_repeated_hello_changes_nothing():
    p = peers()
    p.admit(b"a", hello(), now=1.0)
    p.dispatcher.start_run(seqs(1, 10))
    tasks = p.dispatcher.assign(held=0, now=0.0)
    again = p.admit(b"a", hello(), now=2.0)
    assert again.reject is None and again.joined is None and again.losses == ()
    assert p.seen == 1 and p.dispatcher.in_flight == len(tasks) == 2


def test_a_reconnection_under_a_new_routing_id_keeps_its_tasks():
    p = peers()
    p.admit(b"a", hello(), now=1.0)
    p.dispatcher.start_run(seqs(1, 10))
    tasks = p.dispatcher.assign(held=0, now=0.0)
    moved = p.admit(b"b", hello(), now=2.0)  # same identity, new routing id
    assert moved.reject is None and moved.joined is None and moved.losses == ()
    assert list(p.dispatcher.producers) == [b"b"] and p.seen == 1
    assert {t.peer for t in p.dispatcher.tasks.values()} == {b"b"} and p.dispatcher.in_flight == len(tasks)
    assert p.dispatcher.reissued == 0


def test_a_new_nonce_means_the_producer_restarted_its_work_and_its_tasks_are_lost():
    p = peers()
    p.admit(b"a", hello(pid=7), now=1.0)
    p.dispatcher.start_run(seqs(1, 10))
    tasks = p.dispatcher.assign(held=0, now=0.0)
    restarted = p.admit(b"b", hello(nonce=2, pid=7), now=2.0)
    assert restarted.joined is not None and restarted.joined.peer == b"b"
    (loss,) = restarted.losses
    assert loss.why == "restarted its work (new HELLO)" and loss.pid == 7
    assert set(loss.tasks) == {t.task for t in tasks}
    assert list(p.dispatcher.producers) == [b"b"] and p.seen == 2 and p.dispatcher.reissued == len(tasks)


def test_a_new_producer_on_a_routing_id_replaces_the_old_registration():
    p = peers()
    p.admit(b"a", hello("p1"), now=1.0)
    replaced = p.admit(b"a", hello("p2"), now=2.0)
    assert [loss.name for loss in replaced.losses] == ["h:7"] and replaced.live == 1
    assert p.dispatcher.producers[b"a"].producer_id == "p2"


def test_a_reconnection_onto_a_routing_id_held_by_another_producer_loses_that_one():
    p = peers()
    p.admit(b"a", hello("p1"), now=1.0)
    p.admit(b"b", hello("p2"), now=1.0)
    moved = p.admit(b"b", hello("p1"), now=2.0)  # p1 reconnected on the routing id p2 had
    assert [loss.why for loss in moved.losses] == ["replaced by a reconnection"] and moved.joined is None
    assert list(p.dispatcher.producers) == [b"b"] and p.dispatcher.producers[b"b"].producer_id == "p1"


def test_only_a_producer_showing_this_slabs_token_is_shared():
    p = peers(shm_token="t0k")
    assert p.admit(b"a", hello("p1", shm="t0k"), now=1.0).joined.shared
    assert not p.admit(b"b", hello("p2", shm="other"), now=1.0).joined.shared
    assert not p.admit(b"c", hello("p3"), now=1.0).joined.shared
    assert not peers().admit(b"a", hello(shm="t0k"), now=1.0).joined.shared  # no slab here


def test_losing_the_last_producer_starts_the_no_producer_clock():
    p = peers()
    p.admit(b"a", hello("p1"), now=1.0)
    p.admit(b"b", hello("p2"), now=1.0)
    assert p.lose(b"a", "said BYE", now=5.0).live == 1 and p.none_since == 0.0
    assert p.lose(b"a", "again", now=6.0) is None
    assert p.lose(b"b", "said BYE", now=7.0).live == 0 and p.none_since == 7.0


def test_expire_loses_silent_producers_and_those_holding_a_task_too_long_and_pings_the_rest():
    p = peers()
    p.admit(b"quiet", hello("p1"), now=0.0)
    p.admit(b"slow", hello("p2"), now=0.0)
    p.admit(b"fine", hello("p3", slots=1), now=0.0)
    p.dispatcher.start_run(seqs(1, 10))
    p.dispatcher.producers[b"quiet"].slots = 0
    for task in p.dispatcher.assign(held=0, now=0.0):
        if task.peer == b"fine":
            p.dispatcher.complete(task.task, b"fine")
    p.dispatcher.producers[b"slow"].last_heard = 9.0
    p.dispatcher.producers[b"fine"].last_heard = 9.0
    losses, ping = p.expire(10.0, heartbeat=1.0, liveness=3, task_timeout=5.0)
    assert sorted((loss.name, loss.why.split(" for")[0]) for loss in losses) == [
        ("h:7", "held a task"), ("h:7", "silent")]
    assert {loss.why for loss in losses} == {"held a task for more than task_timeout=5 s", "silent for 10.0 s"}
    assert ping == [b"fine"] and list(p.dispatcher.producers) == [b"fine"]


def test_bad_peers_are_logged_once_each_and_at_most_a_burst_a_minute():
    bad = BadPeers(describe=lambda peer: f"peer {peer.hex()}")
    lines = []
    for _ in range(3):
        lines += bad.invalid(b"x", "garbage", now=0.0)
    for i in range(INVALID_LOG_BURST + 5):
        lines += bad.invalid(bytes([i + 1]), "garbage", now=1.0)
    assert len(lines) == INVALID_LOG_BURST and lines[0].startswith("invalid message from peer 78 dropped")
    # the next minute says how many were left out, then logs again
    later = bad.invalid(b"new", "garbage", now=60.0)
    assert later[0] == "6 more invalid messages from other peers were dropped without a log line"
    assert later[1].startswith("invalid message from peer 6e6577")
    assert bad.invalid(b"newer", "garbage", now=61.0) and len(bad.invalid(b"newer2", "garbage", now=61.0)) == 1


def test_an_unregistered_peer_is_told_to_say_hello_at_most_once_per_interval():
    bad = BadPeers(describe=repr)
    assert bad.reject_due(b"x", now=100.0, interval=1.0)
    assert not bad.reject_due(b"x", now=100.5, interval=1.0)
    assert bad.reject_due(b"x", now=101.0, interval=1.0)
    assert bad.reject_due(b"y", now=101.0, interval=1.0)


# --- attempts, progress, what producers must serve -----------------------------------------------------------
def test_a_timeout_charges_only_the_overdue_task_and_silence_charges_every_task_held():
    p = peers()
    p.dispatcher.max_attempts = 1
    p.admit(b"a", hello("a", slots=2), now=0.0)
    p.dispatcher.start_run(seqs(1, 10))
    p.dispatcher.producers[b"a"].slots = 1
    first = p.dispatcher.assign(held=0, now=0.0)[0]
    p.dispatcher.producers[b"a"].slots = 2
    assert len(p.dispatcher.assign(held=0, now=4.0)) == 1  # its second task, not overdue at 6.0
    p.dispatcher.producers[b"a"].last_heard = 6.0
    losses, _ = p.expire(6.0, heartbeat=1.0, liveness=3, task_timeout=5.0)
    assert [(x.seq, x.attempts[0].producer) for x in losses[0].poisoned] == [(first.seq, "h:7")]
    assert "task_timeout=5" in losses[0].poisoned[0].attempts[0].cause
    p.admit(b"b", hello("b", slots=2), now=6.0)
    held = sorted(t.seq for t in p.dispatcher.assign(held=0, now=6.0))
    losses, _ = p.expire(20.0, heartbeat=1.0, liveness=3, task_timeout=100.0)  # silent: dead, charge each
    assert sorted(x.seq for x in losses[0].poisoned) == held and "silent" in losses[0].poisoned[0].attempts[0].cause


def test_a_bye_or_a_restart_costs_no_attempt():
    p = peers()
    p.dispatcher.max_attempts = 1
    p.admit(b"a", hello("a"), now=0.0)
    p.dispatcher.start_run(seqs(1, 4))
    p.dispatcher.assign(held=0, now=0.0)
    assert p.lose(b"a", "said BYE", now=1.0).poisoned == ()
    p.admit(b"a", hello("a", nonce=2), now=2.0)
    p.dispatcher.assign(held=0, now=0.0)
    restarted = p.admit(b"a", hello("a", nonce=3), now=3.0)  # a new nonce: it dropped its work
    assert restarted.losses and restarted.losses[0].poisoned == () and p.dispatcher.take_poisoned() == []


def test_churn_counts_losses_since_the_last_progress():
    p = peers()
    for n in range(3):
        p.admit(b"a", hello("a", nonce=n + 1), now=float(n))
        p.lose(b"a", "silent for 5.0 s", now=float(n) + 0.5)
    assert p.churn == 3 and p.progress_at == 0.0 and "silent" in p.last_loss
    p.progressed(9.0)
    assert (p.churn, p.progress_at) == (0, 9.0)


def test_a_consumer_given_a_spec_admits_only_producers_serving_it_and_logs_who_set_the_dataset():
    p = Peers(Dispatcher(10, max_attempts=3), dataset_len=None, fingerprint=None, shm_token=None, now=0.0, dataset_spec="s")
    other = dict(hello("x"), dataset={"spec": "other:ds", "len": 100, "fingerprint": "f"})
    refused = p.admit(b"x", other, now=1.0)
    assert "'other:ds'" in refused.reject and "dataset='s'" in refused.reject and not p.dataset_known
    first = p.admit(b"a", hello("a", length=100, fingerprint="f"), now=2.0)
    assert first.reject is None and "100 samples" in first.adopted and "'f'" in first.adopted
    assert p.admit(b"b", hello("b", length=100, fingerprint="f"), now=3.0).adopted == ""  # only the first sets it
    assert p.admit(b"c", hello("c", length=100, fingerprint="g"), now=3.0).reject is not None


def test_nothing_is_refused_until_a_producer_refuses_the_dataset_named_and_then_it_is_named():
    p = Peers(Dispatcher(10, max_attempts=3), dataset_len=None, fingerprint=None, shm_token=None, now=0.0,
              dataset_spec="m:ds")
    assert p.refused == ""  # what the no-producer error adds a sentence for when it is not empty
    refusal = p.admit(b"x", dict(hello("x", pid=9), refused="not allowed here"), now=1.0)
    assert refusal.refused and refusal.reject is not None
    assert p.refused == "producer h:9: not allowed here"


def test_a_length_given_to_the_consumer_is_named_as_its_own_in_a_refusal():
    refused = peers(dataset_len=10, fingerprint="x").admit(b"a", hello(length=11, fingerprint="x"), now=1.0).reject
    assert refused == "dataset length 11 (spec 's') differs from this consumer's 10"


def test_per_producer_figures_name_each_producer_and_what_stats_reads():
    p = peers()
    p.admit(b"a", hello("p1", pid=7, slots=3), now=1.0)
    p.dispatcher.start_run(seqs(1, 10))
    p.dispatcher.assign(held=0, now=1.0)
    p.dispatcher.producers[b"a"].batches, p.dispatcher.producers[b"a"].bytes = 4, 4096
    p.admit(b"b", dict(hello("p2", pid=8, slots=1), serial=True), now=2.0)
    p.dispatcher.producers[b"a"].last_heard = 3.0
    assert p.figures(now=3.5) == {
        "h:7": {"batches": 4, "bytes": 4096, "in_flight": 3, "slots": 3, "ahead": 0, "window": 3, "serial": False,
                "remote": False,
                "joined_s": 2.5,
                "batches_per_s": 1.6, "silent_s": 0.5},
        "h:8": {"batches": 0, "bytes": 0, "in_flight": 0, "slots": 1, "ahead": 0, "window": 1, "serial": True,
                "remote": False,
                "joined_s": 1.5,
                "batches_per_s": 0.0, "silent_s": 1.5}}


def test_the_first_producer_of_an_iterable_dataset_says_so_and_whether_it_has_a_length():
    p = peers()
    assert not p.iterable
    p.admit(b"a", dict(hello("a"), dataset={"spec": "s", "len": 40, "fingerprint": "f", "iterable": True}), now=1.0)
    assert (p.iterable, p.iterable_len) == (True, 40)
    unsized = peers()
    unsized.admit(b"a", dict(hello("a"), dataset={"spec": "s", "len": 0, "fingerprint": "f", "iterable": True,
                                                  "sized": False}), now=1.0)
    assert (unsized.iterable, unsized.iterable_len) == (True, None)
    plain = peers()
    plain.admit(b"a", hello("a"), now=1.0)
    assert (plain.iterable, plain.iterable_len) == (False, None)

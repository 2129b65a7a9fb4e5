"""A producer whose loading threads are all held by loads its consumer gave up on (a ``__getitem__`` that hangs)
takes no work until one returns (producer/core/stuck.py): it would only be given tasks that wait behind them, time
out, and charge batches that hold no bad sample an attempt each, until they end as ``PoisonTaskError``.

The rule as a unit, with the time passed in; then real producers and a hanging sample."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from ferry import PoisonTaskError, RemoteLoader
from ferry.producer.core.actions import SendHello
from ferry.producer.core.connection import Connection
from ferry.producer.core.stuck import StuckLoads

from .helpers import local_producer_pids, wait_for


SHARED = SimpleNamespace(threads=2)  # a sample pool of 2 loading threads (what a job's ``samples`` is)
ONE = SimpleNamespace(threads=1)  # a user's dataset class: its own one-thread pool


def _job(seq, indices, samples=SHARED):
    return SimpleNamespace(epoch=0, seq=seq, indices=indices, samples=samples)


def _epoch(loader, batches):
    """One epoch of ``batches`` batches: the labels delivered, and ``(seq, indices)`` of each PoisonTaskError."""
    labels, poisoned = [], []
    it = iter(loader)
    for _ in range(2 * batches):  # bounded
        try:
            _, y = next(it)
        except PoisonTaskError as error:
            poisoned.append((error.seq, error.indices))
            continue
        except StopIteration:
            break
        labels.extend(y.tolist())
    return labels, poisoned


def test_orphans_below_the_threads_hold_nothing_and_at_the_threads_hold_quietly_then_warn_with_back_off():
    stuck = StuckLoads(slots=4, warning_s=10)
    one = [(_job(1, [4, 5, 6, 7]), 100.0)]
    assert stuck.update(one, 101.0) == [] and not stuck.held  # a thread is still free
    two = one + [(_job(3, [12, 13, 14, 15]), 100.5)]
    assert stuck.update(two, 101.0) == [] and stuck.held  # held at once, said only if it lasts
    assert stuck.update(two, 111.0) == []  # 10 s: not past w yet
    [warning] = stuck.update(two, 111.5)
    assert warning.level == logging.WARNING, warning
    text = warning.message
    assert "batch 1 of epoch 0 (samples 4..7) and 1 more, given up on by the consumer, still loading after 12 s" \
        in text and "all 2 of its loading threads" in text and "restart this producer" in text, text
    assert stuck.update(two, 125.0) == []  # the next at 3w = 30 s of holding
    assert len(stuck.update(two, 131.5)) == 1
    [back] = stuck.update(one, 140.0)  # one returned: work again, and said so as a warning was given
    assert back.level == logging.INFO and "taking work again" in back.message and not stuck.held


def test_orphans_filling_the_slots_hold_too_as_no_new_task_could_start():
    stuck = StuckLoads(slots=1, warning_s=1)
    wide = SimpleNamespace(threads=4)
    assert stuck.update([(_job(2, [8, 9], wide), 10.0)], 10.0) == [] and stuck.held
    [warning] = stuck.update([(_job(2, [8, 9], wide), 10.0)], 11.5)
    assert "batch 2 of epoch 0 (samples 8, 9)" in warning.message and "its one slot (--slots)" in warning.message


def test_orphans_are_counted_against_the_pool_they_load_on():
    """A pool producer: a user's class on its own one-thread pool, the built-ins on a shared pool of 2. One hung
    load fills the first (hold: its consumers' tasks would wait behind it), not the second."""
    stuck = StuckLoads(slots=8, warning_s=10)
    assert stuck.full([(_job(1, [4], SHARED), 0.0)]) is None
    assert stuck.full([(_job(1, [4], ONE), 0.0)]) == "its one loading thread"
    assert stuck.full([(_job(1, [4], SHARED), 0.0), (_job(2, [5], ONE), 0.0)]) == "its one loading thread"
    assert stuck.full([(_job(1, [4], SHARED), 0.0), (_job(3, [6], SHARED), 0.0)]) == "all 2 of its loading threads"


def test_a_hold_that_ends_before_its_first_warning_says_nothing():
    """The usual case: a consumer said BYE (or went silent) as a batch was loading on the one thread."""
    stuck = StuckLoads(slots=2, warning_s=10)
    assert stuck.update([(_job(0, [0], ONE), 50.0)], 50.2) == [] and stuck.held
    assert stuck.update([], 50.9) == [] and not stuck.held


def test_a_hold_of_exit_s_ends_the_producer_once_said_at_error_and_zero_never_does():
    stuck = StuckLoads(slots=2, warning_s=10, exit_s=25)
    hung = [(_job(1, [4], ONE), 100.0)]
    assert stuck.update(hung, 100.0) == [] and stuck.held and not stuck.expired
    assert len(stuck.update(hung, 111.0)) == 1 and not stuck.expired  # the warning at w
    assert stuck.update(hung, 124.9) == [] and not stuck.expired
    assert stuck.update(hung, 126.0, serving=True) == [] and not stuck.expired  # a pool's other job is served
    [farewell] = stuck.update(hung, 127.0)
    assert stuck.expired and farewell.level == logging.ERROR, farewell
    assert "batch 1 of epoch 0 (sample 4)" in farewell.message and "for 27 s (--exit-when-stuck 25)" in farewell.message \
        and "status 5" in farewell.message, farewell.message
    assert farewell.fields["event"] == "stuck_exit" and farewell.fields["exit_code"] == 5
    assert stuck.update(hung, 131.0) == []  # said once, and no warning after it (3w = 30 s)
    patient = StuckLoads(slots=2, warning_s=10, exit_s=0)
    patient.update(hung, 0.0)
    patient.update(hung, 10.0**6)
    assert patient.held and not patient.expired


def test_a_held_connection_takes_no_welcome_to_an_earlier_hello_and_holds_the_hello_of_a_bound_dataset():
    from ferry.producer.core.connection import Phase

    conn = Connection("tcp://c:1", now=1000.0, heartbeat=1.0, liveness=5, unreachable_warning_s=10, dataset_len=8)
    [hello] = [a for a in conn.tick(1000.0) if isinstance(a, SendHello)]
    conn.hold(1000.5)  # the loads of another consumer's dropped tasks fill the threads now
    welcome = {"type": "WELCOME", "nonce": hello.nonce, "session": 7, "heartbeat": 1.0}
    assert conn.receive(welcome, 1, 1000.6) == [] and conn.phase is Phase.GREETING  # not admitted while held
    assert conn.dataset_bound(20, None, 1000.7) == []  # a pool's dataset opened: its HELLO waits for the hold
    assert [type(a) for a in conn.tick(1001.0)] == [SendHello]  # the hold is over: at once
    conn.receive(welcome, 1, 1001.1)
    assert conn.phase is Phase.SERVING


def test_a_held_connection_says_no_hello_and_its_wait_for_a_consumer_starts_when_the_hold_ends():
    conn = Connection("tcp://c:1", now=1000.0, heartbeat=1.0, liveness=5, unreachable_warning_s=10, dataset_len=8)
    assert any(isinstance(a, SendHello) for a in conn.tick(1000.0))
    for second in range(1, 60):  # held for a minute: the loop calls hold instead of tick
        conn.hold(1000.0 + second)
    actions = conn.tick(1060.0)
    assert [type(a) for a in actions] == [SendHello], actions  # at once, and no "no consumer answered" warning


def test_producers_stuck_on_a_hanging_sample_take_no_more_work_and_no_innocent_batch_is_poisoned(endpoint, spawn):
    """Three producers of a user's class (one loading thread each), one task at a time; sample 5 hangs (30 s,
    past any wait here). Its batch reaches two producers, each gives it up at task_timeout, and it ends as
    PoisonTaskError on its second attempt. Those two hold their HELLO (before: they were let back in at once,
    took new tasks that waited behind the hung thread, timed out, and poisoned batches with no bad sample);
    the third serves every other batch of the epoch, each once."""
    producers = [spawn(endpoint, "tests.poison_datasets:SlowSampleDataset", {"length": 40, "slow": [5], "sleep": 30},
                       threads=None, slots=1, env={"FERRY_UNREACHABLE_WARNING_S": "1"}) for _ in range(3)]
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, task_timeout=2, max_attempts=2, timeout=60,
                      no_producer_timeout=30) as loader:
        wait_for(lambda: loader.stats()["producers"] == 3, 30, "the three producers")
        labels, poisoned = _epoch(loader, batches=10)
        stats = loader.stats()
    assert poisoned == [(1, [4, 5, 6, 7])]
    assert labels == [i for i in range(40) if not 4 <= i < 8]
    assert stats["producers_seen"] == 3, stats  # the two stuck ones never came back

    def stuck():  # each says why it takes no work once it has held back for FERRY_UNREACHABLE_WARNING_S
        return [p for p in producers if "given up on by the consumer, still loading" in p.output()]

    wait_for(lambda: len(stuck()) == 2, 15, "both stuck producers to say why they hold back")
    assert all("batch 1 of epoch 0 (samples 4..7)" in p.output() for p in stuck())
    assert len(stuck()) == 2, [p.output()[-2000:] for p in producers]


def test_a_producer_held_for_exit_when_stuck_says_why_and_exits_5_and_one_with_0_stays(endpoint, spawn):
    """Two producers of a user's class, ``--exit-when-stuck`` 1 s for one and 0 (never) for the other; sample 5
    hangs. Both get stuck on it (batch 1 poisoned on its second attempt, as above). The first says why at ERROR
    and exits 5 (producer/exits.py), the other stays, held, as before."""
    args = ("tests.poison_datasets:SlowSampleDataset", {"length": 12, "slow": [5], "sleep": 60})
    leaving = spawn(endpoint, *args, threads=None, slots=1, extra=["--exit-when-stuck", "1"])
    staying = spawn(endpoint, *args, threads=None, slots=1, extra=["--exit-when-stuck", "0"])
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, task_timeout=2, max_attempts=2, timeout=60,
                      no_producer_timeout=30) as loader:
        wait_for(lambda: loader.stats()["producers"] == 2, 30, "the two producers")
        it = iter(loader)
        _, y = next(it)
        assert y.tolist() == [0, 1, 2, 3]
        try:
            next(it)
            raise AssertionError("batch 1 was not poisoned")
        except PoisonTaskError as error:
            assert error.indices == [4, 5, 6, 7]
        assert leaving.proc.wait(30) == 5, leaving.output()[-3000:]
        text = leaving.output()
        assert "--exit-when-stuck 1): exiting with status 5" in text and "batch 1 of epoch 0" in text, text[-3000:]
    assert staying.proc.poll() is None, staying.output()[-3000:]


def test_local_producers_stuck_on_a_hanging_sample_are_replaced_and_the_epoch_ends(caplog):
    """Local mode: a local producer exits 5 once stuck loads have held it for the loader's task_timeout, and the
    loader replaces it as it replaces any producer that died. Sample 5 hangs (300 s). Before, both producers
    stayed alive and useless, and the rest of the epoch waited for them: now the replacements serve it, and only
    the batch holding sample 5 is poisoned."""
    from tests.poison_datasets import SlowSampleDataset

    with RemoteLoader(dataset=SlowSampleDataset(length=24, slow=[5], sleep=300), local_producers=2, producer_slots=1,
                      batch_size=4, heartbeat=0.2, task_timeout=2, max_attempts=2, timeout=60,
                      log_every=None) as loader:
        first = set(wait_for(lambda: len(local_producer_pids(loader)) == 2 and local_producer_pids(loader), 30,
                             "two producers"))
        labels, poisoned = _epoch(loader, batches=6)
        assert poisoned == [(1, [4, 5, 6, 7])]
        assert labels == [i for i in range(24) if not 4 <= i < 8]

        def replaced():
            return [r for r in caplog.records if "exit code 5 (loads its consumers gave up on" in r.getMessage()]

        # the second may still be within its task_timeout of holding as the replacement of the first ends the epoch
        wait_for(lambda: len(replaced()) == 2, 30, "both stuck producers to exit 5")
        assert all(r.levelno == logging.WARNING and "respawning it" in r.getMessage() for r in replaced())
        wait_for(lambda: loader.stats()["producers"] == 2, 30, "two producers serving again")
        assert not first & set(local_producer_pids(loader)), "both stuck producers were replaced"

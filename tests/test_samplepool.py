"""The producer's sample pool (producer/loading/samplepool.py): a batch worker may load a one-sample batch on its own thread,
but never more than ``--threads`` samples load at once, whoever runs them; and the turns that keep a one-thread
pool's loads in the order of their batches."""

from __future__ import annotations

import threading

import pytest

from ferry.producer.loading.samplepool import SamplePool, Turns, TurnsClosed


def test_a_free_permit_runs_the_load_on_the_calling_thread_and_an_error_comes_back_through_the_future():
    pool = SamplePool(1)
    try:
        done = pool.run_or_submit(lambda: threading.get_ident())
        assert done.done() and done.result() == threading.get_ident()
        failed = pool.run_or_submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(timeout=5)
    finally:
        pool.shutdown()


def test_with_every_permit_taken_the_load_waits_for_the_pool_and_never_runs_beside_it():
    pool = SamplePool(1)
    running, most, lock = [0], [0], threading.Lock()
    release, started = threading.Event(), threading.Event()

    def load(block: bool) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        started.set()
        if block:
            assert release.wait(10)
        with lock:
            running[0] -= 1
        return threading.get_ident()

    try:
        first = pool.submit(load, True)
        assert started.wait(10)  # the pool's thread holds the only permit
        second = pool.run_or_submit(load, False)
        assert not second.done()  # not run here, beside the first: queued for the pool
        release.set()
        assert second.result(timeout=10) == first.result(timeout=10) != threading.get_ident()
        assert most[0] == 1
    finally:
        release.set()
        pool.shutdown()


def test_many_batch_workers_and_the_pool_together_load_at_most_threads_samples_at_once():
    threads = 2
    pool = SamplePool(threads)
    running, most, lock = [0], [0], threading.Lock()

    def load() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threading.Event().wait(0.001)  # a sample that takes a moment (a bounded wait, not a sleep to sync on)
        with lock:
            running[0] -= 1

    def worker() -> None:
        for _ in range(20):
            futures = [pool.submit(load) for _ in range(3)] + [pool.run_or_submit(load)]
            for f in futures:
                f.result(timeout=10)

    workers = [threading.Thread(target=worker) for _ in range(4)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        assert not any(w.is_alive() for w in workers)
        assert 1 <= most[0] <= threads
    finally:
        pool.shutdown()


# --- turns: a one-thread pool's batches submit in the order they were started --------------------------------
def test_turns_come_in_ticket_order_whatever_order_the_threads_arrive_in():
    turns = Turns()
    tickets = [turns.ticket() for _ in range(5)]
    order, threads = [], []
    for ticket in reversed(tickets):  # the last started asks first
        def take(ticket=ticket):
            with turns.turn(ticket):
                order.append(ticket)
        threads.append(threading.Thread(target=take))
        threads[-1].start()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    assert order == tickets


def test_a_ticket_passed_without_its_turn_lets_the_next_go_and_close_ends_every_wait():
    turns = Turns()
    first, second, third = turns.ticket(), turns.ticket(), turns.ticket()
    turns.passed(first)  # its job failed before its turn: no one waits for it
    with turns.turn(second):
        pass
    turns.passed(second)  # passing again changes nothing
    later = turns.ticket()
    failed = []

    def wait_for_later():
        try:
            with turns.turn(later):  # third is never passed: only close() ends this wait
                pass
        except TurnsClosed as exc:
            failed.append(exc)

    waiter = threading.Thread(target=wait_for_later)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # still waiting for third
    turns.close()
    waiter.join(10)
    assert not waiter.is_alive() and len(failed) == 1
    assert third == later - 1


def test_a_load_run_on_the_calling_thread_never_overtakes_one_submitted_before_it():
    """The pool's thread is busy with something that holds no permit, so a submitted load waits in the queue while
    a permit is free: run_or_submit then queues behind it instead of running first on its own thread."""
    pool = SamplePool(1)
    release, order = threading.Event(), []
    try:
        blocker = pool._pool.submit(release.wait, 10)  # the pool's one thread, taken without a permit
        queued = pool.submit(order.append, "submitted first")
        later = pool.run_or_submit(order.append, "asked to run at once")
        assert not later.done()  # it did not run here, ahead of the queued load
        release.set()
        queued.result(timeout=10), later.result(timeout=10), blocker.result(timeout=10)
        assert order == ["submitted first", "asked to run at once"]
    finally:
        release.set()
        pool.shutdown()

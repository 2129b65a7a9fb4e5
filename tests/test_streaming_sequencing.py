"""The consumer's sequencing of a sharded run, without sockets: the Dispatcher with a ShardSequencer under
random completion order, producer losses and joins. Checks the credit bound at every step, exactly-once in-order
delivery, and that the window never deadlocks (every run ends within a bounded number of steps)."""

from __future__ import annotations

import random

import pytest

from ferry.common.shardplan import ShardPlan, decode_seq
from ferry.consumer.core import Delivery, is_eof
from ferry.consumer.core.dispatcher import Dispatcher, ProducerInfo
from ferry.consumer.core.shards import ShardSequencer


def _producer(i: int, slots: int) -> ProducerInfo:
    return ProducerInfo(peer=b"p%d" % i, producer_id=str(i), nonce=1, name=str(i), slots=slots, last_heard=0,
                        joined=0)


def _run(positions, batch_size, drop_last, start=(0, 0)) -> ShardSequencer:
    return ShardSequencer(1, ShardPlan(0, tuple(range(positions)), batch_size, drop_last), 0, start)


def _simulate(lengths, batch_size, capacity, producers, slots, seed, start=(0, 0), drop_last=False):
    rng = random.Random(seed)
    run = _run(len(lengths), batch_size, drop_last, start)
    dispatcher = Dispatcher(capacity, max_attempts=3)
    joined = 0
    for _ in range(producers):
        dispatcher.add(_producer(joined, slots))
        joined += 1
    dispatcher.start_run(run)
    out = []
    for _ in range(20000):
        dispatcher.assign(run.held, 0.0)
        assert dispatcher.in_flight + run.held <= capacity, "credit bound broken"
        action = rng.random()
        if action < 0.03 and len(dispatcher.producers) > 1:  # a producer dies: its tasks are re-issued
            dispatcher.lose(rng.choice(list(dispatcher.producers)))
        elif action < 0.05:
            dispatcher.add(_producer(joined, slots))
            joined += 1
        elif dispatcher.tasks and action < 0.75:  # some task completes
            task = rng.choice(list(dispatcher.tasks.values()))
            assert dispatcher.complete(task.task, task.peer) is task
            p, k = decode_seq(task.seq)
            count = max(0, min(batch_size, lengths[p] - k * batch_size))
            if count < batch_size and drop_last:
                count = 0
            if 0 < count < batch_size or count == 0:  # the answer says where the shard ends
                run.ended(task.seq, empty=count == 0)
            if count:
                run.put(Delivery(run=1, seq=task.seq, tree=(p, k, count)))
        else:  # the training loop takes what is ready
            item = run.take()
            if is_eof(item):
                return out
            if item is not None:
                out.append(item.tree)
                run.release()
    raise AssertionError(f"no end of run after 20000 steps: {run}, {len(out)} delivered")


def _expected(lengths, batch_size, start=(0, 0), drop_last=False):
    out = []
    for p, n in enumerate(lengths):
        for k in range(-(-n // batch_size)):
            count = min(batch_size, n - k * batch_size)
            if (p, k) >= start and not (drop_last and count < batch_size):
                out.append((p, k, count))
    return out


@pytest.mark.parametrize("seed", range(60))
def test_random_schedules_deliver_every_batch_once_in_order(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([0, 1, 3, 4, 8, 11, 17]) for _ in range(rng.randrange(1, 9))]
    batch_size, capacity = rng.randrange(1, 5), rng.randrange(1, 9)
    producers, slots = rng.randrange(1, 4), rng.randrange(1, 4)
    drop_last = rng.random() < 0.3
    got = _simulate(lengths, batch_size, capacity, producers, slots, seed, drop_last=drop_last)
    assert got == _expected(lengths, batch_size, drop_last=drop_last)


def test_a_run_resumes_inside_a_shard():
    lengths = [9, 5, 12]
    got = _simulate(lengths, 2, 4, 2, 2, seed=3, start=(0, 3))
    assert got == _expected(lengths, 2, start=(0, 3))


def test_consecutive_batches_of_a_shard_go_to_the_same_producer():
    dispatcher = Dispatcher(8, max_attempts=3)
    for i in range(2):
        dispatcher.add(_producer(i, 3))
    dispatcher.start_run(_run(4, 2, False))
    tasks = dispatcher.assign(0, 0.0)
    by_producer = {}
    for task in tasks:
        by_producer.setdefault(task.peer, []).append(decode_seq(task.seq))
    for seqs in by_producer.values():
        assert len({p for p, _ in seqs}) == 1, f"a producer got several shards at once: {seqs}"
        assert [k for _, k in seqs] == list(range(seqs[0][1], seqs[0][1] + len(seqs)))

"""The consumer's sequencing of an iterable dataset's run, without sockets: the Dispatcher with a StreamSequencer
under random completion order, producer losses and joins (bound producers, their replacements, free producers).
Checks the credit bound at every step, that a bound producer only ever gets its own stream and a free one only a
stream no live bound producer serves, exactly-once delivery in DataLoader's round-robin order (or every batch once
out of order), and that every run ends within a bounded number of steps."""

from __future__ import annotations

import math
import random

import pytest

from ferry.common.errors import ConfigError
from ferry.common.shardplan import decode_seq, encode_seq
from ferry.common.streamplan import StreamPlan
from ferry.consumer.core import Delivery, is_eof, sequencer_for
from ferry.consumer.core.dispatcher import Dispatcher, ProducerInfo
from ferry.consumer.core.streams import StreamSequencer


def _producer(i: int, slots: int, worker: tuple[int, int] | None) -> ProducerInfo:
    return ProducerInfo(peer=b"p%d" % i, producer_id=str(i), nonce=1, name=str(i), slots=slots, last_heard=0,
                        joined=0, worker=worker)


def _run(streams, batch_size, drop_last=False, starts=(), in_order=True) -> StreamSequencer:
    return StreamSequencer(1, StreamPlan(0, streams, batch_size, drop_last), 0, starts, in_order=in_order)


def _count(length: int, k: int, batch_size: int, drop_last: bool) -> int:
    count = max(0, min(batch_size, length - k * batch_size))
    return 0 if count < batch_size and drop_last else count


def expected_order(lengths, batch_size, drop_last=False, starts=()):
    """DataLoader's order for ``len(lengths)`` workers: round robin over each worker's batches, a worker that ran
    out skipped; the batches of each stream before ``starts`` (a resume) left out."""
    starts = starts or (0,) * len(lengths)
    batches = [n // batch_size if drop_last else math.ceil(n / batch_size) for n in lengths]
    return [(w, k, _count(lengths[w], k, batch_size, drop_last))
            for k in range(max(batches, default=0)) for w in range(len(lengths)) if starts[w] <= k < batches[w]]


def _simulate(lengths, batch_size, capacity, slots, seed, *, drop_last=False, starts=(), in_order=True,
              free=1, bound=True):
    """Deliveries of a run over streams of ``lengths`` samples, under a random schedule: ``bound`` producers of
    each stream (dying and replaced at random) and ``free`` ones (dying, and new ones joining)."""
    rng = random.Random(seed)
    n = len(lengths)
    run = _run(n, batch_size, drop_last, starts, in_order)
    dispatcher = Dispatcher(capacity, max_attempts=10 ** 6)
    joined = 0

    def join(worker):
        nonlocal joined
        dispatcher.add(_producer(joined, slots, worker))
        joined += 1

    for w in range(n if bound else 0):
        join((w, n))
    for _ in range(free):
        join((0, n + 1) if rng.random() < 0.5 else None)  # another count than the run's: free too
    dispatcher.start_run(run)
    dead: list[tuple[int, int]] = []  # bound places waiting for their replacement
    out = []
    for _ in range(40000):
        for task in dispatcher.assign(run.held, 0.0):
            stream = decode_seq(task.seq)[0]
            worker = dispatcher.producers[task.peer].worker
            if worker is not None and worker[1] == n:
                assert worker[0] == stream, f"bound producer {worker} given stream {stream}"
            else:
                owners = [p.worker[0] for p in dispatcher.producers.values() if p.worker and p.worker[1] == n]
                assert stream not in owners, f"a free producer given stream {stream}, served by its own"
        assert dispatcher.in_flight + run.held <= capacity, "credit bound broken"
        action = rng.random()
        if action < 0.03 and dispatcher.producers:  # a producer dies: its tasks are re-issued
            info = dispatcher.lose(rng.choice(list(dispatcher.producers)))
            if info.worker is not None and info.worker[1] == n:
                dead.append(info.worker)
        elif action < 0.06 and dead:  # a bound producer's replacement joins, in its place
            join(dead.pop(rng.randrange(len(dead))))
        elif action < 0.07 and free:
            join(None)
        elif dispatcher.tasks and action < 0.75:  # some task completes
            task = rng.choice(list(dispatcher.tasks.values()))
            assert dispatcher.complete(task.task, task.peer) is task
            w, k = decode_seq(task.seq)
            count = _count(lengths[w], k, batch_size, drop_last)
            if count < batch_size:  # the answer says where the stream ends
                run.ended(task.seq, empty=count == 0)
            if count:
                run.put(Delivery(run=1, seq=task.seq, tree=(w, k, count)))
        else:  # the training loop takes what is ready
            item = run.take()
            if is_eof(item):
                return out
            if item is not None:
                out.append(item.tree)
                run.release()
        if not dispatcher.producers and not dead:
            join(None)
    raise AssertionError(f"no end of run after 40000 steps: {len(out)} delivered")


def _random_case(rng):
    lengths = [rng.choice([0, 1, 3, 4, 8, 11, 17]) for _ in range(rng.randrange(1, 6))]
    return lengths, rng.randrange(1, 5), rng.randrange(1, 9), rng.randrange(1, 4), rng.random() < 0.3


@pytest.mark.parametrize("seed", range(60))
def test_random_schedules_deliver_every_batch_once_in_dataloaders_order(seed):
    rng = random.Random(seed)
    lengths, batch_size, capacity, slots, drop_last = _random_case(rng)
    got = _simulate(lengths, batch_size, capacity, slots, seed, drop_last=drop_last, free=rng.randrange(0, 3))
    assert got == expected_order(lengths, batch_size, drop_last)


@pytest.mark.parametrize("seed", range(20))
def test_free_producers_alone_deliver_every_batch_once_in_order(seed):
    rng = random.Random(1000 + seed)
    lengths, batch_size, capacity, slots, drop_last = _random_case(rng)
    got = _simulate(lengths, batch_size, capacity, slots, seed, drop_last=drop_last, free=rng.randrange(1, 4),
                    bound=False)
    assert got == expected_order(lengths, batch_size, drop_last)


@pytest.mark.parametrize("seed", range(20))
def test_out_of_order_gives_every_batch_once_and_ends(seed):
    rng = random.Random(2000 + seed)
    lengths, batch_size, capacity, slots, drop_last = _random_case(rng)
    got = _simulate(lengths, batch_size, capacity, slots, seed, drop_last=drop_last, in_order=False)
    assert sorted(got) == sorted(expected_order(lengths, batch_size, drop_last))


@pytest.mark.parametrize("seed", range(20))
def test_a_resumed_run_goes_on_after_each_streams_delivered_batches(seed):
    rng = random.Random(3000 + seed)
    lengths, batch_size, capacity, slots, drop_last = _random_case(rng)
    full = expected_order(lengths, batch_size, drop_last)
    stop = rng.randrange(len(full) + 1)
    starts = [0] * len(lengths)
    for w, k, _ in full[:stop]:
        starts[w] = k + 1
    got = _simulate(lengths, batch_size, capacity, slots, seed, drop_last=drop_last, starts=tuple(starts))
    assert got == full[stop:]
    assert got == expected_order(lengths, batch_size, drop_last, tuple(starts))


def test_the_resume_position_folds_each_delivered_batch_into_its_stream():
    positions = (0, 0, 0)
    for seq in (encode_seq(0, 0), encode_seq(1, 0), encode_seq(2, 0), encode_seq(0, 1)):
        positions = StreamSequencer.streams_after(positions, seq)
    assert positions == (2, 1, 1)
    assert StreamSequencer.streams_after((), encode_seq(1, 4)) == ()  # not an iterable run
    assert _run(3, 2).resume_streams == (0, 0, 0) and _run(3, 2, starts=(2, 1, 1)).resume_streams == (2, 1, 1)


def test_a_resume_of_another_stream_count_is_refused():
    with pytest.raises(ConfigError, match="2 streams.*3"):
        sequencer_for(1, StreamPlan(0, 3, 2, False), 5, (0, 0), in_order=True, streams=(3, 2))


def test_a_bound_stream_waits_for_its_own_producer_after_a_loss():
    dispatcher = Dispatcher(8, max_attempts=3)
    run = _run(2, 4)
    dispatcher.add(_producer(0, 2, (0, 2)))
    dispatcher.add(_producer(1, 2, (1, 2)))
    dispatcher.start_run(run)
    tasks = dispatcher.assign(0, 0.0)
    assert sorted(decode_seq(t.seq) for t in tasks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    dispatcher.lose(b"p0")  # stream 0's producer died: its two batches wait for it, not for producer 1
    assert dispatcher.assign(0, 0.0) == [] and dispatcher.queued >= 2
    dispatcher.add(_producer(2, 2, (0, 2)))  # its replacement, in its place
    again = dispatcher.assign(0, 0.0)
    assert [(t.peer, decode_seq(t.seq)) for t in again] == [(b"p2", (0, 0)), (b"p2", (0, 1))]


def test_a_free_producer_takes_over_a_stream_without_its_producer_then_gives_it_back():
    dispatcher = Dispatcher(8, max_attempts=3)
    run = _run(2, 4)
    dispatcher.add(_producer(0, 1, (0, 2)))
    dispatcher.add(_producer(1, 1, None))
    dispatcher.start_run(run)
    first = {t.peer: decode_seq(t.seq) for t in dispatcher.assign(0, 0.0)}
    assert first == {b"p0": (0, 0), b"p1": (1, 0)}  # the free one takes the stream no producer of its own serves
    dispatcher.add(_producer(2, 1, (1, 2)))  # stream 1's own producer joins: the free one gets no more of it
    assert {t.peer: decode_seq(t.seq) for t in dispatcher.assign(0, 0.0)} == {b"p2": (1, 1)}


def test_an_item_past_a_streams_end_is_dropped_when_the_end_comes_after_it():
    run = _run(2, 4)
    assert run.put(Delivery(run=1, seq=encode_seq(0, 3), tree="late"))  # a re-issue answered first
    assert run.held == 1
    run.ended(encode_seq(0, 2), empty=False)  # then batch 2 failed: the stream ends there
    assert run.held == 0, "an item that will never be delivered must not hold a credit"
    assert not run.put(Delivery(run=1, seq=encode_seq(0, 4), tree="later"))
    assert run.stale(encode_seq(0, 3)) and not run.stale(encode_seq(0, 2))


def test_only_the_batch_the_loop_waits_for_may_take_the_last_credit():
    run = _run(2, 4)
    run.peer_joined(b"a", (0, 2))
    run.peer_joined(b"b", (1, 2))
    assert run.next_seq(b"b", {b"a", b"b"}, speculate=False) is None  # (1, 0) comes after (0, 0)
    assert run.next_seq(b"a", {b"a", b"b"}, speculate=False) == encode_seq(0, 0)
    assert run.next_seq(b"b", {b"a", b"b"}, speculate=True) == encode_seq(1, 0)


def test_answers_are_counted_and_tasks_name_their_stream():
    run = _run(3, 4, drop_last=True)
    seq = encode_seq(2, 5)
    assert run.indices(seq) == [2] and run.index_range(1000) == 3
    assert run.task_fields(seq) == {"shard": [5, 4, 1, 0], "streams": 3}
    answer = run.read_answer({"epoch": 0, "seq": seq, "tree": {}, "errors": [], "count": 3, "last": True}, seq, 0)
    assert answer.indices == [2, 2, 2] and answer.last and not answer.empty


def test_free_producers_keep_the_streams_they_read():
    """Three streams, two free producers: each stream is read by one producer all along (its cursor stays open
    there); the producer with two streams serves both."""
    rng = random.Random(7)
    dispatcher = Dispatcher(16, max_attempts=3)
    run = _run(3, 2)
    for i in range(2):
        dispatcher.add(_producer(i, 2, None))
    dispatcher.start_run(run)
    readers: dict[int, set[bytes]] = {}
    for _ in range(400):
        for task in dispatcher.assign(run.held, 0.0):
            readers.setdefault(decode_seq(task.seq)[0], set()).add(task.peer)
        if dispatcher.tasks and rng.random() < 0.7:
            task = rng.choice(list(dispatcher.tasks.values()))
            dispatcher.complete(task.task, task.peer)
            run.put(Delivery(run=1, seq=task.seq, tree=None))
        while run.take() is not None:
            run.release()
    assert sorted(readers) == [0, 1, 2]
    assert all(len(peers) == 1 for peers in readers.values()), readers
    assert {p for peers in readers.values() for p in peers} == {b"p0", b"p1"}


def test_producers_of_one_place_take_turns_only_when_one_is_lost():
    """Producers started by hand all say worker [0, 1]: with one stream they are all its own, but one reads it
    (a second would open it again and skip what the first read); another takes over when that one is lost."""
    dispatcher = Dispatcher(8, max_attempts=3)
    run = _run(1, 2)
    for i in range(3):
        dispatcher.add(_producer(i, 2, (0, 1)))
    dispatcher.start_run(run)
    first = dispatcher.assign(0, 0.0)
    assert {t.peer for t in first} == {first[0].peer} and len(first) == 2
    dispatcher.lose(first[0].peer)
    again = dispatcher.assign(0, 0.0)
    assert len({t.peer for t in again}) == 1 and again[0].peer != first[0].peer
    assert [decode_seq(t.seq) for t in again] == [(0, 0), (0, 1)]  # the lost batches first, in order


def test_an_unbatched_plan_asks_for_one_sample_a_task_and_counts_len_in_samples():
    """batch_size=None over an IterableDataset: each task is one sample of its stream, marked unbatched so the
    producer sends it as it is (not collated); len() is len(dataset), as DataLoader's."""
    plan = StreamPlan(epoch=0, streams=3, batch_size=1, drop_last=False, length=24, unbatched=True)
    seq = encode_seq(2, 5)
    assert plan.task_fields(seq) == {"shard": [5, 1, 0, 0], "streams": 3, "unbatched": "index"}
    assert len(plan) == 24
    batched = StreamPlan(epoch=0, streams=3, batch_size=4, drop_last=False, length=24)
    assert "unbatched" not in batched.task_fields(seq)


def test_a_free_producer_gets_no_reissue_of_a_stream_whose_own_producer_is_live():
    run = _run(2, 4)
    run.peer_joined(b"own", (1, 2))  # stream 1's own producer
    seq = encode_seq(1, 0)  # say a free producer read it before "own" joined, then died: a re-issue
    assert not run.may_take(b"free", seq, {b"own", b"free"}), "a free producer took a bound stream's re-issue"
    assert run.may_take(b"own", seq, {b"own", b"free"})
    run.peer_lost(b"own")
    assert run.may_take(b"free", seq, {b"free"}), "with its own producer gone, a free one takes the stream"


def test_out_of_order_an_item_past_a_streams_end_is_never_handed_on():
    run = _run(1, 4, in_order=False)
    assert run.put(Delivery(run=1, seq=encode_seq(0, 3), tree="late"))  # a re-issue answered first
    assert run.put(Delivery(run=1, seq=encode_seq(0, 0), tree="first"))
    run.ended(encode_seq(0, 2), empty=False)  # then batch 2 failed: the stream ends there, (0, 3) never comes
    assert run.held == 1
    got = run.take()
    assert got is not None and not is_eof(got) and got.tree == "first"
    assert run.take() is None  # batches 1 and 2 have not arrived: nothing else, and not the dropped (0, 3)

"""Iterable datasets (a torch IterableDataset without shards()), end to end with real producer processes (issue 18,
"Iterable datasets"): each producer iterates its own copy as DataLoader's worker of the same id, and the batches
come in DataLoader's interleaved order. Every test compares with what ``DataLoader(num_workers=N)`` itself yields
(tests/iterable_datasets.py)."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
from torch.utils.data import ChainDataset, DataLoader, IterableDataset, get_worker_info

from ferry import RemoteLoader
from ferry.common import protocol
from ferry.common.codec import decode_tree
from ferry.common.errors import ConfigError
from tests.iterable_datasets import (
    AugmentedShards, RangeStream, WorkerShards, as_lists, dataloader_batches, split_range,
)

from .helpers import local_producer_pids, wait_for

QUIET = {"log_every": None, "heartbeat": 0.2, "timeout": 30}


def _run(loader: RemoteLoader) -> list:
    return [as_lists(batch) for batch in loader]


@pytest.mark.parametrize("producers, drop_last", [(1, False), (3, False), (3, True)])
def test_batches_and_their_order_are_dataloaders_for_as_many_local_producers(producers, drop_last):
    dataset = WorkerShards(size=40, extra=3)  # streams of unequal lengths: some end rounds before the others
    expected = dataloader_batches(dataset, workers=producers, batch_size=4, drop_last=drop_last)
    with RemoteLoader(dataset=dataset, local_producers=producers, batch_size=4, drop_last=drop_last,
                      **QUIET) as loader:
        epochs = [_run(loader), _run(loader)]
    assert epochs == [expected, expected]


def test_spawned_local_producers_give_the_same_batches():
    dataset = WorkerShards(size=20, extra=2)
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=3, mp_context="spawn", **QUIET) as loader:
        assert _run(loader) == dataloader_batches(dataset, workers=2, batch_size=3)


def test_a_local_producer_killed_mid_stream_is_replaced_and_its_stream_resumed_exactly_once():
    """torch's docs' worker_init_fn example: each producer's copy is cut to its share by producer_init. The
    victim's replacement (same worker id) runs it again, and goes on after the batches the loop already has."""
    expected = dataloader_batches(RangeStream(0, 240), workers=2, batch_size=4, worker_init_fn=split_range)
    got = []
    with RemoteLoader(dataset=RangeStream(0, 240, delay=0.004), local_producers=2, batch_size=4,
                      producer_init=split_range, **QUIET) as loader:
        before = local_producer_pids(loader)
        for i, batch in enumerate(loader):
            got.append(as_lists(batch))
            if i == 12:  # stream 0's producer, in the middle of its stream
                os.kill(before[0], signal.SIGKILL)
        after = local_producer_pids(loader)
    assert got == expected
    assert after[0] != before[0] and after[1] == before[1], "replaced in its place; the other one untouched"


def test_a_remote_producer_killed_mid_epoch_leaves_its_streams_to_the_others(endpoint, spawn):
    """Producers started by hand are free: any of them reads any stream (get_worker_info() says the stream), and a
    stream whose producer died is taken over after the batches the loop already has."""
    args = {"size": 90, "extra": 4, "delay": 0.004}
    producers = [spawn(endpoint, "tests.iterable_datasets:WorkerShards", args) for _ in range(3)]
    expected = dataloader_batches(WorkerShards(**args), workers=3, batch_size=3)
    got = []
    with RemoteLoader(endpoint=endpoint, dataset="tests.iterable_datasets:WorkerShards", iterable_streams=3,
                      batch_size=3, liveness=5, **QUIET) as loader:
        wait_for(lambda: loader.stats()["producers"] == 3, 20, "3 producers")
        assert len(loader) == 30  # ceil(90 / 3): len(dataset), from the producers' HELLO
        for i, batch in enumerate(loader):
            got.append(as_lists(batch))
            if i == 8:
                busy = wait_for(lambda: [p for p in producers if any(
                    f.get("in_flight") for n, f in loader.stats()["per_producer"].items()
                    if n.endswith(f":{p.pid}"))], 10, "a producer holding a task")
                busy[0].kill()
        stats = loader.stats()
    assert got == expected
    assert stats["reissued"] >= 1 and stats["producers"] == 2


def test_remote_producers_started_as_workers_read_their_own_streams_only(endpoint, spawn):
    """FERRY_WORKER=w/N: producer_init (--init) cuts each producer's copy to worker w's share, so only that producer
    may read stream w; a third producer, free, is given no stream while both are live."""
    args = {"start": 0, "end": 50}
    init = ["--init", "tests.iterable_datasets:split_range"]
    for w in (1, 0):
        spawn(endpoint, "tests.iterable_datasets:RangeStream", args, extra=init, env={"FERRY_WORKER": f"{w}/2"})
    free = spawn(endpoint, "tests.iterable_datasets:RangeStream", args)
    expected = dataloader_batches(RangeStream(**args), workers=2, batch_size=4, worker_init_fn=split_range)
    with RemoteLoader(endpoint=endpoint, dataset="tests.iterable_datasets:RangeStream", iterable_streams=2,
                      batch_size=4, **QUIET) as loader:
        wait_for(lambda: loader.stats()["producers"] == 3, 20, "3 producers")
        got = _run(loader)
        served = loader.stats()["per_producer"]
    assert got == expected
    assert next(f["batches"] for name, f in served.items() if name.endswith(f":{free.pid}")) == 0


def test_resume_mid_epoch_goes_on_after_each_streams_delivered_batches():
    dataset = WorkerShards(size=30, extra=5)
    expected = dataloader_batches(dataset, workers=2, batch_size=3)
    for stop in (1, 6, len(expected) - 2):
        with RemoteLoader(dataset=dataset, local_producers=2, batch_size=3, **QUIET) as loader:
            head = []
            for batch in loader:
                head.append(as_lists(batch))
                if len(head) == stop:
                    break
            state = json.loads(json.dumps(loader.state_dict()))
        assert sum(state["stream_batches"]) == stop and len(state["stream_batches"]) == 2
        with RemoteLoader(dataset=dataset, local_producers=2, batch_size=3, **QUIET) as loader:
            loader.load_state_dict(state)
            tail = _run(loader)
            again = _run(loader)  # the next epoch starts from its beginning
        assert head + tail == expected, f"resume after {stop} batches"
        assert again == expected
    with RemoteLoader(dataset=dataset, local_producers=3, batch_size=3, **QUIET) as loader:
        loader.load_state_dict(state)
        with pytest.raises(ConfigError, match="2 streams"):
            iter(loader)


def test_a_resumed_stream_that_draws_from_sample_info_gives_the_uninterrupted_run_s_batches():
    """The samples skipped on resume are read under the sample_info() they had (a trial's augmented stream failed
    there: sample_info() was None while a stream was skipped)."""
    dataset = AugmentedShards(size=24, extra=2)
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=3, **QUIET) as loader:
        loader.set_epoch(1)
        expected = _run(loader)
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=3, **QUIET) as loader:
        loader.set_epoch(1)
        head = []
        for batch in loader:
            head.append(as_lists(batch))
            if len(head) == 5:
                break
        state = json.loads(json.dumps(loader.state_dict()))
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=3, **QUIET) as loader:
        loader.load_state_dict(state)
        tail = _run(loader)
    assert head + tail == expected
    assert {row[2] for batch in expected for row in batch[0]} == {1}  # the epoch its __iter__ was told


def test_a_chain_dataset_is_iterated_as_dataloader_does():
    chained = ChainDataset([WorkerShards(size=10, extra=1), WorkerShards(size=7, extra=2)])
    expected = dataloader_batches(chained, workers=2, batch_size=3)
    with RemoteLoader(dataset=chained, local_producers=2, batch_size=3, **QUIET) as loader:
        assert len(loader) == 6  # ceil((10 + 7) / 3)
        assert _run(loader) == expected


def test_len_follows_dataloaders_rules():
    dataset = WorkerShards(size=30)
    for batch_size, drop_last in ((1, False), (4, False), (4, True), (7, True)):
        with RemoteLoader(dataset=dataset, local_producers=1, batch_size=batch_size, drop_last=drop_last,
                          **QUIET) as loader:
            assert len(loader) == len(DataLoader(dataset, batch_size=batch_size, drop_last=drop_last))
    unsized = WorkerShards(size=30, sized=False)
    with RemoteLoader(dataset=unsized, local_producers=2, batch_size=4, **QUIET) as loader:
        with pytest.raises(TypeError, match="len"):
            len(loader)
        assert _run(loader) == dataloader_batches(unsized, workers=2, batch_size=4)


def test_more_batches_than_the_length_len_read_warns_as_dataloader():
    """DataLoader's check: more batches than the len(dataset) that len(loader) read (a copy that yields the whole
    dataset in every stream soon trips it; a stream's short tail never does)."""
    dataset = WorkerShards(size=6, extra=8)  # len() says 6 samples; worker 1 yields 8 more than its share
    expected = dataloader_batches(dataset, workers=2, batch_size=1)
    assert len(expected) == 14
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=1, **QUIET) as loader:
        assert _run(loader) == expected  # no len() asked: no warning
        assert len(loader) == 6
        with pytest.warns(UserWarning, match="reported to be 6 .* batches have been fetched") as caught:
            assert _run(loader) == expected
    assert [str(w.message).split(", but ")[1].split(" ")[0] for w in caught] == [str(n) for n in range(7, 15)]


def test_an_iterable_dataset_takes_no_shuffle_sampler_batch_sampler_or_autoscaling():
    for options in ({"shuffle": True}, {"sampler": range(10)}, {"batch_sampler": [[0, 1]]}):
        name = next(iter(options))
        with pytest.raises(ConfigError, match=f"expected no {name}"):
            RemoteLoader(dataset=WorkerShards(), local_producers=2, **QUIET, **options).close()
    with pytest.raises(ConfigError, match="iterable_streams applies to an IterableDataset"):
        RemoteLoader(dataset=list(range(10)), local_producers=1, iterable_streams=2, **QUIET).close()
    with pytest.raises(ConfigError, match="fixed number of streams"):  # a stream is read by its own producer
        RemoteLoader(dataset=WorkerShards(), local_producers="auto", **QUIET).close()


def test_an_iterable_local_loader_leaves_nothing_after_close():
    from .helpers import LeakCheck

    check = LeakCheck()
    with RemoteLoader(dataset=WorkerShards(size=40), local_producers=2, batch_size=3, **QUIET) as loader:
        for i, _ in enumerate(loader):
            if i == 3:
                break  # abandoned mid-stream: producers still hold open cursors
    check.assert_clean()


# --- the producer's side, without sockets --------------------------------------------------------------------
class _Opens(IterableDataset):
    """Yields (worker id, worker count, i) for i in 0..9, counting its passes."""

    def __init__(self) -> None:
        self.opened = 0

    def __iter__(self):
        self.opened += 1
        info = get_worker_info()
        for i in range(10):
            yield np.array([info.id, info.num_workers, i])


def _answers(dataset, tasks, fails=False):
    """Each (stream, streams, k, batch_size) task through a Batcher: (count, rows) of its answer; with ``fails``, a
    FAIL is ("FAIL", its first error's message)."""
    import queue

    from ferry.common.waker import Waker
    from ferry.producer.loading.batcher import Batcher, Job

    done: queue.SimpleQueue = queue.SimpleQueue()
    waker = Waker()
    batcher = Batcher(dataset, threads=1, batch_workers=2, done=done, waker=waker)
    out = []
    try:
        for n, (stream, streams, k, batch_size) in enumerate(tasks):
            batcher.submit(Job(0, 1, n + 1, 0, k, [stream], "raise", shard=[k, batch_size, 0, 0], streams=streams))
            outcome = done.get(timeout=10)
            header = protocol.parse_header(outcome.frames[0])
            if fails and header["type"] == protocol.FAIL:
                out.append(("FAIL", header["errors"][0]["message"]))
                continue
            assert header["type"] == protocol.BATCH, header
            rows = decode_tree(header["tree"], outcome.frames[1:]).tolist() if header["count"] else []
            out.append((header["count"], rows))
    finally:
        batcher.close()
        waker.close()
    return out


def test_a_stream_is_read_as_its_worker_and_resumed_by_skipping():
    dataset = _Opens()
    first, second, again = _answers(dataset, [(1, 3, 0, 4), (1, 3, 1, 4), (2, 5, 1, 4)])
    assert first == (4, [[1, 3, i] for i in range(4)]), "get_worker_info() reports the stream, not the process"
    assert second == (4, [[1, 3, i] for i in range(4, 8)]) and dataset.opened == 2  # the open cursor went on
    assert again == (4, [[2, 5, i] for i in range(4, 8)])  # another stream at batch 1: opened, 4 samples skipped
    assert get_worker_info() is None, "the WorkerInfo of the stream it read is not left behind"


class _SeededStream(IterableDataset):
    """Samples drawn from sample_info().seed, after a first read of sample_info() in __iter__ itself."""

    def __iter__(self):
        import ferry

        epoch = ferry.sample_info().epoch
        for i in range(10):
            yield np.array([i, epoch, ferry.sample_info().seed % 1000])


def test_samples_skipped_to_resume_a_stream_are_read_under_the_sample_info_they_had():
    in_order = _answers(_SeededStream(), [(0, 1, 0, 4), (0, 1, 1, 4)])
    resumed = _answers(_SeededStream(), [(0, 1, 1, 4)])  # a fresh reader: opens the stream, skips 4 samples
    assert resumed == in_order[1:], (resumed, in_order)


class _Breaks(_Opens):
    """:class:`_Opens` whose stream raises at its sample 5."""

    def __iter__(self):
        for sample in super().__iter__():
            if sample[2] == 5:
                raise ValueError("sample 5 is broken")
            yield sample


def test_tasks_past_where_a_stream_raised_are_answered_empty_without_reading_it_again():
    up_to_the_failure, past_it, and_again = _Breaks(), _Breaks(), _Breaks()
    tasks = [(0, 1, 0, 4), (0, 1, 1, 4), (0, 1, 2, 4), (0, 1, 1, 4)]
    _answers(up_to_the_failure, tasks[:2], fails=True)
    answers = _answers(past_it, tasks[:3], fails=True)
    failed = ("FAIL", "stream 0 of 1, its batch 1: sample 5 is broken")
    assert answers == [(4, [[0, 1, i] for i in range(4)]), failed, (0, [])]
    assert past_it.opened == up_to_the_failure.opened, "the task past it (issued before the consumer knew) read nothing"
    assert _answers(and_again, tasks, fails=True)[3] == failed  # its own batch, re-issued
    assert and_again.opened == past_it.opened + 1


def test_a_task_past_a_streams_known_end_is_answered_without_reading_it_again():
    dataset = _Opens()
    answers = _answers(dataset, [(0, 1, 2, 4), (0, 1, 3, 4), (0, 1, 4, 4)])
    assert [count for count, _ in answers] == [2, 0, 0]  # batch 2 is the short tail: the stream ends after 10
    assert dataset.opened == 1, "the tasks past the end (issued before the consumer knew it) read nothing"

"""Sharded (streaming) datasets, end to end with real producer processes (issue 10, "Streaming sources").

Every test compares with :func:`tests.shard_datasets.reference`, computed from the dataset itself: the batches
are a pure function of (dataset, seed, epoch, rank, world size, batch size, drop_last), whoever serves them.
"""

from __future__ import annotations

import logging
import os
import random

import pytest
import torch

from ferry import RemoteLoader
from ferry.common.errors import ConfigError
from tests.shard_datasets import LENGTHS, Shards, SizedShards, as_pairs, reference

from .helpers import producer_pids, wait_for


def _run(loader: RemoteLoader) -> list[list[tuple[int, int]]]:
    return [as_pairs(batch) for batch in loader]


def _check_shape(got: list[list[tuple[int, int]]], lengths: tuple[int, ...], batch_size: int) -> None:
    """Every sample exactly once; each batch consecutive samples of one shard; only a shard's last is short."""
    seen = sorted(pair for batch in got for pair in batch)
    assert seen == sorted((s, p) for s, n in enumerate(lengths) for p in range(n)), "not every sample exactly once"
    for batch in got:
        shard, first = batch[0]
        assert batch == [(shard, first + i) for i in range(len(batch))], f"not consecutive in one shard: {batch}"
        assert len(batch) == batch_size or first + len(batch) == lengths[shard], f"short batch mid-shard: {batch}"


@pytest.mark.parametrize("producers", [1, 3])
def test_local_producers_give_the_reference_sequence(producers):
    dataset = Shards()
    with RemoteLoader(dataset=dataset, local_producers=producers, batch_size=4, shuffle=True, seed=11,
                      log_every=None) as loader:
        epochs = [_run(loader), _run(loader)]
    for epoch, got in enumerate(epochs):
        assert got == reference(dataset, batch_size=4, seed=11, epoch=epoch)
        _check_shape(got, LENGTHS, 4)
    assert epochs[0] != epochs[1], "the shard order must change with the epoch"


def test_drop_last_drops_each_shards_short_tail():
    dataset = Shards()
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, shuffle=True, seed=2, drop_last=True,
                      log_every=None) as loader:
        got = _run(loader)
    assert got == reference(dataset, batch_size=4, seed=2, drop_last=True)
    assert all(len(b) == 4 for b in got)


def test_ranks_split_the_shards_as_distributed_sampler_splits_indices():
    dataset = Shards()
    union = []
    for rank in range(3):
        with RemoteLoader(dataset=dataset, local_producers=2, batch_size=5, shuffle=True, seed=4, rank=rank,
                          world_size=3, log_every=None) as loader:
            got = _run(loader)
        assert got == reference(dataset, batch_size=5, seed=4, rank=rank, world_size=3)
        union += got
    _check_shape(union, LENGTHS, 5)  # 12 shards over 3 ranks: no padding, every sample once


def test_len_is_known_only_with_shard_lengths():
    with RemoteLoader(dataset=SizedShards(), local_producers=1, batch_size=4, log_every=None) as loader:
        expected = len(reference(SizedShards(), batch_size=4, shuffle=False))
        assert len(loader) == expected
        it = iter(loader)
        assert len(it) == expected
        assert len(list(it)) == expected
    with RemoteLoader(dataset=Shards(), local_producers=1, batch_size=4, log_every=None) as loader:
        with pytest.raises(TypeError, match="shard_len"):
            len(loader)


def test_a_shard_that_cannot_be_counted_leaves_len_unknown_naming_it_and_the_epoch_runs(caplog):
    """A trial's trainer died in iter() on its shard_len's error; producers only warned (common/shardplan.py)."""
    from tests.shard_datasets import UncountableShards

    caplog.set_level(logging.WARNING, logger="ferry")
    with RemoteLoader(dataset=UncountableShards(), local_producers=1, batch_size=4, shuffle=False,
                      log_every=None) as loader:
        with pytest.raises(TypeError, match="shard_len"):
            len(loader)
        assert _run(loader) == reference(SizedShards(), batch_size=4, shuffle=False)
    warned = [r.getMessage() for r in caplog.records if "cannot count shard" in r.getMessage()]
    assert warned and "'s1'" in warned[0] and "not a zip file" in warned[0], warned


def test_torch_iterable_dataset_with_the_two_methods_works():
    class TorchShards(torch.utils.data.IterableDataset, Shards):
        def __iter__(self):  # what DataLoader would use; Ferry plans over shards instead
            raise AssertionError("not used")

    dataset = TorchShards(lengths=(3, 9, 4))
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=2, shuffle=True, seed=1,
                      log_every=None) as loader:
        assert _run(loader) == reference(dataset, batch_size=2, seed=1)


def test_a_streaming_dataset_with_half_the_contract_is_refused_at_once():
    class HalfShards(torch.utils.data.IterableDataset):  # shards() without iter_shard(): a mistake, not an iterable
        def __iter__(self):
            return iter(range(10))

        def shards(self):
            return ["a"]

    with pytest.raises(ConfigError, match=r"without iter_shard.*shards\(\).*iter_shard"):
        RemoteLoader(dataset=HalfShards(), local_producers=1, batch_size=2)


def test_resume_mid_epoch_mid_shard_is_exact():
    dataset = Shards()
    expected = reference(dataset, batch_size=4, seed=8, epoch=1)
    for stop in (1, 3, 7, len(expected) - 1):
        with RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, shuffle=True, seed=8,
                          log_every=None) as loader:
            loader.set_epoch(1)
            head = []
            for batch in loader:
                head.append(as_pairs(batch))
                if len(head) == stop:
                    break
            state = loader.state_dict()
        with RemoteLoader(dataset=dataset, local_producers=3, batch_size=4, shuffle=True, seed=8,
                          log_every=None) as loader:
            loader.load_state_dict(state)
            tail = _run(loader)
            after = _run(loader)  # the next epoch starts from its beginning
        assert head + tail == expected, f"resume after {stop} batches"
        assert after == reference(dataset, batch_size=4, seed=8, epoch=2)


@pytest.mark.slow  # 11 s (.ci/run runs -m slow); a local producer killed mid-shard is in the suite
def test_remote_producers_one_killed_mid_epoch(endpoint, spawn):
    seed = int(os.environ.get("FERRY_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    lengths = [3 * n for n in LENGTHS]  # long enough that the epoch outlives the victim's detection (1 s)
    dataset = Shards(lengths, delay=0.01)
    args = {"lengths": lengths, "delay": 0.01}
    producers = [spawn(endpoint, "tests.shard_datasets:Shards", args, threads=2, slots=2) for _ in range(3)]
    expected = reference(dataset, batch_size=3, seed=seed % 1000)
    kill_at = rng.randrange(5, len(expected) // 2)
    got = []
    with RemoteLoader(endpoint=endpoint, batch_size=3, shuffle=True, seed=seed % 1000, heartbeat=0.2, liveness=5,
                      timeout=30, buffer_batches=6, log_every=None) as loader:
        wait_for(lambda: loader.stats()["producers"] == 3, 20, "3 producers")
        for i, batch in enumerate(loader):
            got.append(as_pairs(batch))
            if i == kill_at:  # one that holds work right now: it dies in the middle of a shard
                busy = wait_for(lambda: [p for p in producers if any(
                    f.get("in_flight") for n, f in loader.stats()["per_producer"].items()
                    if n.endswith(f":{p.pid}"))], 10, "a producer holding a task")
                busy[0].kill()
        stats = loader.stats()
    assert got == expected, f"seed {seed}"
    _check_shape(got, tuple(lengths), 3)
    assert stats["reissued"] >= 1, f"the victim's tasks must be re-issued: {stats} (seed {seed})"
    assert stats["producers"] == 2


def test_producer_transform_applies_to_streamed_samples():
    from tests.transforms import negate_and_tag

    dataset = Shards(lengths=(4, 7))
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=3, shuffle=False,
                      producer_transform=negate_and_tag, log_every=None) as loader:
        got = [(x.tolist(), y.tolist()) for x, y in loader]
    expected = [([[-s, -p] for s, p in batch], [s * 1000 + p + 100 for s, p in batch])
                for batch in reference(dataset, batch_size=3, shuffle=False)]
    assert got == expected


def test_spawned_local_producers_serve_the_same_sequence():
    dataset = SizedShards(lengths=(6, 1, 9))
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, shuffle=True, seed=9, mp_context="spawn",
                      log_every=None) as loader:
        assert len(loader) == 6  # 2 + 1 + 3
        assert _run(loader) == reference(dataset, batch_size=4, seed=9)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_shard_that_raises_ends_there_and_the_epoch_goes_on(on_error):
    from ferry import RemoteSampleError
    from tests.shard_datasets import FailingShards

    dataset = FailingShards(fail_at=(1, 5))  # shard s1 (13 samples): batch 0 is fine, batch 1 raises
    full = reference(Shards(), batch_size=4, seed=3)
    failing = next(i for i, b in enumerate(full) if (1, 5) in b)
    expected = [b for b in full if b[0][0] != 1 or b[0][1] < 4]  # s1 keeps its first batch only
    got, errors = [], []
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, shuffle=True, seed=3, on_error=on_error,
                      log_every=None) as loader:
        it = iter(loader)
        while True:
            try:
                got.append(as_pairs(next(it)))
            except StopIteration:
                break
            except RemoteSampleError as exc:
                errors.append((len(got), exc))
    assert got == expected
    if on_error == "raise":
        assert [position for position, _ in errors] == [failing] and "bad record" in str(errors[0][1])
        assert "shard 's1', its batch 1: " in str(errors[0][1])  # the index is the shard's: its name says which
    else:
        assert errors == []


def test_a_sharded_local_loader_leaves_nothing_after_close():
    from .helpers import LeakCheck

    check = LeakCheck()
    with RemoteLoader(dataset=Shards(), local_producers=2, batch_size=4, log_every=None) as loader:
        for i, _ in enumerate(loader):
            if i == 3:
                break  # abandoned mid-shard: producers still hold open cursors
    check.assert_clean()


def test_producer_closes_the_cursors_it_holds():
    import queue

    from ferry.common.waker import Waker
    from ferry.producer.loading.batcher import Batcher, Job

    closed = []

    class Tracked(Shards):
        def iter_shard(self, name):
            try:
                yield from super().iter_shard(name)
            finally:
                closed.append(name)

    done: queue.SimpleQueue = queue.SimpleQueue()
    waker = Waker()
    batcher = Batcher(Tracked(), threads=1, batch_workers=2, done=done, waker=waker)
    try:
        for k in (0, 1):  # shard s4 (21 samples): two full batches, its iterator stays open after them
            batcher.submit(Job(0, 1, k + 1, 0, k, [4], "raise", shard=[k, 4, 0, 0]))
        outcomes = [done.get(timeout=10) for _ in range(2)]
        assert [o.failed for o in outcomes] == [False, False] and closed == []
    finally:
        batcher.close()
        waker.close()
    assert closed == ["s4"]


def test_within_shard_shuffle_buffer_is_reproducible_whoever_serves():
    from tests.shard_datasets import BufferedShards

    dataset = BufferedShards()
    runs = {}
    for producers in (1, 3):
        with RemoteLoader(dataset=dataset, local_producers=producers, batch_size=4, shuffle=True, seed=5,
                          log_every=None) as loader:
            runs[producers] = [_run(loader), _run(loader)]
    assert runs[1] == runs[3], "the within-shard order must not depend on the producers"
    plain = [reference(dataset, batch_size=4, seed=5, epoch=e) for e in (0, 1)]
    for epoch, got in enumerate(runs[1]):
        # the same shards in the same order, each cut the same way, but the samples shuffled within each shard
        assert [(b[0][0], len(b)) for b in got] == [(b[0][0], len(b)) for b in plain[epoch]]
        by_shard: dict = {}
        for batch in got:
            assert len({s for s, _ in batch}) == 1, f"a batch crosses shards: {batch}"
            by_shard.setdefault(batch[0][0], []).extend(p for _, p in batch)
        assert all(sorted(v) == list(range(LENGTHS[s])) for s, v in by_shard.items())
        assert got != plain[epoch]
    assert runs[1][0] != runs[1][1]
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, shuffle=True, seed=5,
                      log_every=None) as loader:
        head = []
        for batch in loader:
            head.append(as_pairs(batch))
            if len(head) == 6:
                break
        state = loader.state_dict()
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, shuffle=True, seed=5,
                      log_every=None) as loader:
        loader.load_state_dict(state)
        assert head + _run(loader) == runs[1][0], "resume inside a shuffled shard"
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, shuffle=False, log_every=None) as loader:
        assert _run(loader) == reference(dataset, batch_size=4, shuffle=False), "no shuffle: no buffer"


def _busy_local_producer(loader: RemoteLoader) -> int | None:
    """The pid of a local producer that holds a task, or None (producers are named host:pid)."""
    local = set(loader._local.pids)
    for name, figures in loader.stats()["per_producer"].items():
        pid = int(name.rsplit(":", 1)[1])
        if figures["in_flight"] > 0 and pid in local:
            return pid
    return None


def test_local_producer_sigkilled_mid_shard_changes_nothing():
    import signal

    lengths = [3 * n for n in LENGTHS]
    dataset = Shards(lengths, delay=0.005)
    expected = reference(dataset, batch_size=4, seed=21)
    got = []
    with RemoteLoader(dataset=dataset, local_producers=3, batch_size=4, shuffle=True, seed=21, heartbeat=0.2,
                      liveness=5, timeout=30, log_every=None) as loader:
        wait_for(lambda: loader.stats()["producers"] == 3, 20, "3 producers")
        victim = None
        for i, batch in enumerate(loader):
            got.append(as_pairs(batch))
            # from batch 10 on, kill the first local producer seen holding a task; the loop keeps consuming
            # meanwhile, so producers stay busy (a held loop would let the window fill and all go idle)
            if i >= 10 and victim is None:
                victim = _busy_local_producer(loader)
                if victim is not None:
                    os.kill(victim, signal.SIGKILL)
        stats = loader.stats()
        # the victim is replaced (tests/test_respawn.py): three producers again, none of them the victim
        wait_for(lambda: loader.stats()["producers"] == 3, 20, "the victim's replacement")
        assert victim not in producer_pids(loader).values()
    assert victim is not None, "no local producer was ever seen holding a task"
    assert got == expected
    assert stats["reissued"] >= 1, f"the victim held tasks (3 producers share 8 credits): {stats}"


def test_remote_producers_with_the_dataset_object_on_the_trainer_know_len(endpoint, spawn):
    dataset = SizedShards()
    for _ in range(2):
        spawn(endpoint, "tests.shard_datasets:SizedShards", {}, threads=1, slots=2)
    with RemoteLoader(endpoint=endpoint, dataset=dataset, batch_size=4, shuffle=True, seed=13, heartbeat=0.2,
                      timeout=30, log_every=None) as loader:
        expected = reference(dataset, batch_size=4, seed=13)
        assert len(loader) == len(expected)
        wait_for(lambda: loader.stats()["producers"] == 2, 20, "2 producers")
        assert _run(loader) == expected

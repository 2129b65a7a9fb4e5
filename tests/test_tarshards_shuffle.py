"""``tar-shards`` as a user gets it (issue 18): a ``shuffle_buffer`` from ``dataset_args``, deterministic from
``(seed, epoch)``, so that the batches are exactly the reference's through a SIGKILLed producer and a resume;
``len(loader)`` of the spec from the lengths its producers announce; ``ferry pack --format tar --shuffle`` for
class-sorted sources, whose batches a within-shard buffer cannot mix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from ferry import RemoteLoader
from ferry.common.datasets.tarshards import TarShardsDataset, pack_tar
from ferry.common.shardplan import shuffled

from tests.datasets import ClassSorted

from .helpers import REPO, producer_env, producer_pids, wait_for

PER_CLASS = 15  # tests.datasets.ClassSorted's default


def reference(dataset: TarShardsDataset, *, batch_size: int, seed: int, epoch: int = 0, buffer: int) -> list[list[int]]:
    """The batches a loader must yield (sample ids): shards in DistributedSampler's order, each through the
    shuffle buffer seeded from (seed, epoch, shard index), cut into batches that never cross shards."""
    from torch.utils.data import DistributedSampler

    names = dataset.shards()
    sampler = DistributedSampler(range(len(names)), num_replicas=1, rank=0, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    out = []
    for index in sampler:
        ids = [int(x[0]) for x, _ in shuffled(dataset.iter_shard(names[index]), buffer, seed=seed, epoch=epoch,
                                              shard=index)]
        out += [ids[i:i + batch_size] for i in range(0, len(ids), batch_size)]
    return out


def ids(batch) -> list[int]:
    x, y = batch
    got = [int(v) for v in x[:, 0].tolist()]
    assert y.tolist() == [i // PER_CLASS for i in got], "labels do not match their samples"
    return got


@pytest.fixture
def shards(tmp_path):
    """96 class-sorted samples in 8 shards of 12: each shard holds one or two classes."""
    pack_tar(ClassSorted(96), str(tmp_path), shard_samples=12)
    return tmp_path


def loader_over(shards, buffer: int, **options) -> RemoteLoader:
    args = {"pattern": str(shards / "*.tar"), "shuffle_buffer": buffer}
    return RemoteLoader(dataset="tar-shards", dataset_args=args, batch_size=4, shuffle=True, seed=7, log_every=None,
                        **{"local_producers": 2, **options})


def test_shuffle_buffer_in_dataset_args_shuffles_within_shards_as_the_reference(shards):
    dataset = TarShardsDataset(str(shards), shuffle_buffer=12)
    expected = [reference(dataset, batch_size=4, seed=7, epoch=e, buffer=12) for e in (0, 1)]
    with loader_over(shards, 12) as loader:
        assert len(loader) == 24  # 8 shards of 12 samples, 3 batches each: known from the producers' HELLO
        epochs = [[ids(b) for b in loader], [ids(b) for b in loader]]
    assert epochs == expected
    assert epochs[0] != epochs[1]
    in_file_order = [b for b in epochs[0] if b == list(range(b[0], b[0] + len(b)))]
    assert len(in_file_order) < 3, f"the samples of a shard must be shuffled, not in file order: {epochs[0]}"


def test_len_of_a_tar_shards_spec_served_by_hand_started_producers(shards, endpoint, spawn):
    spawn(endpoint, "tar-shards", {"pattern": str(shards / "*.tar")}, threads=1, slots=2)
    with RemoteLoader(endpoint=endpoint, batch_size=5, heartbeat=0.2, timeout=30, log_every=None) as loader:
        assert len(loader) == 8 * 3  # 12 samples a shard: batches of 5, 5 and 2
        assert sorted(i for b in loader for i in ids(b)) == list(range(96))


def test_tar_shards_with_a_buffer_exactly_once_in_order_through_a_sigkill_and_a_resume(shards):
    dataset = TarShardsDataset(str(shards), shuffle_buffer=12)
    expected = reference(dataset, batch_size=4, seed=7, buffer=12)
    got, victim = [], None
    slow = {"producer_transform": "tests.transforms:slow_identity", "heartbeat": 0.2, "liveness": 5, "timeout": 30}
    with loader_over(shards, 12, local_producers=3, **slow) as loader:
        wait_for(lambda: loader.stats()["producers"] == 3, 20, "3 producers")
        for i, batch in enumerate(loader):
            got.append(ids(batch))
            if i >= 4 and victim is None:  # the first local producer seen holding a task dies mid-shard
                busy = [pid for name, pid in producer_pids(loader).items()
                        if loader.stats()["per_producer"].get(name, {}).get("in_flight")]
                if busy:
                    victim = busy[0]
                    os.kill(victim, signal.SIGKILL)
        stats = loader.stats()
    assert victim is not None, "no local producer was ever seen holding a task"
    assert got == expected, "exactly once, in the reference's order, through the SIGKILL"
    assert stats["reissued"] >= 1, stats
    for stop in (2, 13):
        with loader_over(shards, 12) as loader:
            head = []
            for batch in loader:
                head.append(ids(batch))
                if len(head) == stop:
                    break
            state = loader.state_dict()
        with loader_over(shards, 12, local_producers=3) as loader:
            loader.load_state_dict(state)
            assert head + [ids(b) for b in loader] == expected, f"resume after {stop} batches"


def test_pack_tar_shuffle_mixes_classes_across_shards(tmp_path):
    """A buffer mixes within a shard only: class-sorted shards give batches of 1-2 classes whatever its size.
    ``--shuffle SEED`` writes the samples in a seeded random order, so that every shard holds many classes."""
    run = subprocess.run([sys.executable, "-m", "ferry", "pack", "--format", "tar", "--dataset",
                          "tests.datasets:ClassSorted", "--dataset-arg", "length=96", "--shard-samples",
                          "12", str(tmp_path / "sorted")], capture_output=True, text=True, env=producer_env(),
                         cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "sorted by label" in run.stdout and "--shuffle" in run.stdout, "a class-sorted pack must say so"
    run = subprocess.run([sys.executable, "-m", "ferry", "pack", "--format", "tar", "--shuffle", "3", "--dataset",
                          "tests.datasets:ClassSorted", "--dataset-arg", "length=96", "--shard-samples",
                          "12", str(tmp_path / "mixed")], capture_output=True, text=True, env=producer_env(),
                         cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "sorted by label" not in run.stdout
    mixed = TarShardsDataset(str(tmp_path / "mixed"))
    samples = [(int(x[0]), y) for name in mixed.shards() for x, y in mixed.iter_shard(name)]
    assert sorted(i for i, _ in samples) == list(range(96)) and all(y == i // PER_CLASS for i, y in samples)
    with loader_over(tmp_path / "sorted", 12, local_producers=1) as loader:
        sorted_classes = [len({i // PER_CLASS for i in ids(b)}) for b in loader]
    with loader_over(tmp_path / "mixed", 12, local_producers=1) as loader:
        mixed_classes = [len({i // PER_CLASS for i in ids(b)}) for b in loader]
    assert max(sorted_classes) <= 2
    assert np.mean(mixed_classes) > 3, mixed_classes

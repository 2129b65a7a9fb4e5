"""Sharded (streaming) datasets the streaming tests serve, locally or by spec (``tests.shard_datasets:Name``),
and the reference a loader over them must reproduce."""

from __future__ import annotations

import time
from typing import Any, Iterator

import numpy as np

#: Shard lengths with every case: empty, shorter than a batch, a multiple of it, a short tail.
LENGTHS = (5, 13, 0, 8, 21, 3, 16, 9, 12, 1, 30, 7)


class Shards:
    """Shard ``s<i>`` yields ``(int64 [i, position], label)``: every sample names where it came from."""

    def __init__(self, lengths: Any = LENGTHS, delay: float = 0.0) -> None:
        self.lengths, self.delay = tuple(int(n) for n in lengths), float(delay)

    def shards(self) -> list[str]:
        return [f"s{i}" for i in range(len(self.lengths))]

    def iter_shard(self, name: str) -> Iterator[Any]:
        shard = int(name[1:])
        for position in range(self.lengths[shard]):
            if self.delay:
                time.sleep(self.delay)
            yield np.array([shard, position], dtype=np.int64), shard * 1000 + position


class SizedShards(Shards):
    """The same, with ``shard_len``: ``len(loader)`` is known."""

    def shard_len(self, name: str) -> int:
        return self.lengths[int(name[1:])]


class UncountableShards(SizedShards):
    """Its ``shard_len`` raises for shard s1 (a truncated file, say), which reads fine."""

    def shard_len(self, name: str) -> int:
        if name == "s1":
            raise ValueError("s1.npz: not a zip file")
        return super().shard_len(name)


def reference(dataset: Any, *, batch_size: int, seed: int = 0, epoch: int = 0, shuffle: bool = True,
              drop_last: bool = False, rank: int = 0, world_size: int = 1) -> list[list[tuple[int, int]]]:
    """The batches a loader must yield, as lists of (shard, position): shards in DistributedSampler's order
    over shard indices, each cut into batches that never cross it. Computed from the dataset itself."""
    from torch.utils.data import DistributedSampler

    names = dataset.shards()
    sampler = DistributedSampler(range(len(names)), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    out = []
    for index in sampler:
        samples = [tuple(int(v) for v in x) for x, _ in dataset.iter_shard(names[index])]
        for start in range(0, len(samples), batch_size):
            batch = samples[start:start + batch_size]
            if len(batch) < batch_size and drop_last:
                break
            out.append(batch)
    return out


def as_pairs(batch: Any) -> list[tuple[int, int]]:
    """A loader's batch as (shard, position) pairs, checking that labels match the arrays."""
    x, y = batch
    pairs = [tuple(int(v) for v in row) for row in x.tolist()]
    assert y.tolist() == [s * 1000 + p for s, p in pairs], "labels do not match their samples"
    return pairs


class FailingShards(Shards):
    """``iter_shard`` of shard ``fail_at[0]`` raises when it reaches position ``fail_at[1]``."""

    def __init__(self, lengths: Any = LENGTHS, fail_at: Any = (1, 5)) -> None:
        super().__init__(lengths)
        self.fail_at = tuple(fail_at)

    def iter_shard(self, name: str) -> Iterator[Any]:
        for sample in super().iter_shard(name):
            if (int(sample[0][0]), int(sample[0][1])) == self.fail_at:
                raise ValueError(f"bad record {self.fail_at}")
            yield sample


class BufferedShards(Shards):
    """Shards shuffled within themselves through a buffer of 5 samples (when the loader shuffles)."""

    shuffle_buffer = 5

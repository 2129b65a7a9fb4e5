"""Datasets for the compression tests, served by real producers (``tests.compression_datasets:Name``)."""

from __future__ import annotations

import numpy as np


class Tiles:
    """Sample i is (float32 tile of whole numbers 0..1023, i): like satellite counts stored as floats, it
    compresses about 2x with lz4 after the byte shuffle. Deterministic in i."""

    def __init__(self, length: int = 64, shape=(4, 128, 128)) -> None:
        self.length, self.shape = int(length), tuple(shape)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        rng = np.random.default_rng(index)
        smooth = np.cumsum(rng.integers(-3, 4, size=self.shape), axis=-1) % 1024
        return smooth.astype(np.float32), index


class Noise:
    """Sample i is (uint8 random bytes, i): incompressible."""

    def __init__(self, length: int = 64, shape=(64, 1024)) -> None:
        self.length, self.shape = int(length), tuple(shape)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return np.random.default_rng(index).integers(0, 256, size=self.shape, dtype=np.uint8), index


class TileShards:
    """A sharded (streaming) dataset: shard ``s<i>`` yields ``lengths[i]`` Tiles samples, labelled i*1000+pos."""

    def __init__(self, lengths=(6, 5), shape=(4, 64, 64)) -> None:
        self.lengths, self.tiles = tuple(lengths), Tiles(1, shape)

    def shards(self) -> list[str]:
        return [f"s{i}" for i in range(len(self.lengths))]

    def iter_shard(self, name: str):
        shard = int(name[1:])
        for position in range(self.lengths[shard]):
            yield self.tiles[shard * 100 + position][0], shard * 1000 + position

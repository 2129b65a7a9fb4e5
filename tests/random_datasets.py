"""Datasets that draw random numbers, served by spec (``tests.random_datasets:Name``) or by object."""

from __future__ import annotations

import random
import time
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import get_worker_info

import ferry

INIT_MARK = -1  # set by `mark_init` in a producer process


def mark_init(worker_id: int) -> None:
    global INIT_MARK
    INIT_MARK = 100 + worker_id


class Draws:
    """Sample i: i, and one draw from each of torch's, numpy's and Python's global generators."""

    def __init__(self, length: int = 64) -> None:
        self.length = int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return index, torch.rand(()).item(), float(np.random.rand()), random.random()


class Augmented:
    """Sample i: a fixed array plus noise drawn from ``ferry.sample_info().seed``: reproducible augmentation."""

    def __init__(self, length: int = 48, delay: float = 0.0) -> None:
        self.length, self.delay = int(length), float(delay)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if self.delay:
            time.sleep(self.delay)
        info = ferry.sample_info()
        assert info is not None and info.index == index, info
        noise = np.random.default_rng(info.seed).standard_normal(4).astype(np.float32)
        return np.full(4, index, dtype=np.float32) + noise, index


class WorkerView:
    """Sample i: what the producer's process reports as DataLoader worker info, and its init mark."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int):
        info = get_worker_info()
        return (index, -1 if info is None else info.id, -1 if info is None else info.num_workers,
                INIT_MARK)


class Sequences:
    """Sample i: a float32 sequence of length 1 + i % 5 and its length: what a padding collate_fn is for."""

    def __init__(self, length: int = 30) -> None:
        self.length = int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        n = 1 + index % 5
        return torch.arange(n, dtype=torch.float32) + index, n


def pad_collate(samples):
    """A typical user collate_fn: pad to the longest sequence, return (padded, lengths) as a tuple."""
    sequences, lengths = zip(*samples)
    padded = torch.nn.utils.rnn.pad_sequence(list(sequences), batch_first=True, padding_value=-1.0)
    return padded, torch.tensor(lengths, dtype=torch.int64)


def negate(sample):
    """A producer_transform: the array negated, the label kept."""
    array, label = sample
    return -array, label


class Point(NamedTuple):
    image: Any
    label: int


class Typed:
    """Sample i in one of the shapes default_collate treats specially (``kind`` picks which)."""

    def __init__(self, kind: str, length: int = 10) -> None:
        self.kind, self.length = kind, int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        if self.kind == "namedtuple":
            return Point(np.full((2, 2), i, dtype=np.float32), i)
        if self.kind == "tuple-of-strings":
            return np.float32(i), f"name-{i}", (f"a{i}", b"b")
        if self.kind == "bfloat16":
            return torch.full((3,), i / 3, dtype=torch.bfloat16), torch.tensor(i, dtype=torch.bfloat16)
        if self.kind == "float16":
            return np.full(3, i / 7, dtype=np.float16), torch.full((2,), i / 7, dtype=torch.float16)
        if self.kind == "bool":
            return i % 2 == 0, np.array([i % 3 == 0, True]), torch.tensor(i > 4)
        if self.kind == "0-d":
            return np.array(i * 1.5, dtype=np.float64), torch.tensor(i), np.int16(i), 2.5 * i
        raise ValueError(self.kind)


class GlobalAugmented:
    """Sample i: a fixed array plus noise drawn from torch's, numpy's and Python's global generators, as a random
    transform of torchvision or a hand-written ``np.random`` augmentation draws it (nothing from ``sample_info``)."""

    def __init__(self, length: int = 48, delay: float = 0.0) -> None:
        self.length, self.delay = int(length), float(delay)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if self.delay:
            time.sleep(self.delay)
        noise = torch.rand(4) + torch.from_numpy(np.random.rand(4).astype(np.float32)) + random.random()
        return torch.full((4,), float(index)) + noise, index


class Tiles:
    """Sample i: a 3 x size x size image of value i and its label; ``train=True`` augments it as a training transform
    does, from torch's generator (a random flip and noise), ``train=False`` (a validation transform) does not. The
    same files and the same fingerprint either way, as torchvision's ImageFolder with either transform."""

    def __init__(self, length: int = 16, size: int = 8, train: bool = True) -> None:
        self.length, self.size, self.train = int(length), int(size), bool(train)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        image = torch.full((3, self.size, self.size), float(index))
        image[:, 0, :] += torch.arange(self.size, dtype=torch.float32)  # something a flip changes
        if self.train:
            if torch.rand(()) < 0.5:
                image = image.flip(-1)
            image = image + torch.rand(image.shape)
        return image, index % 2

"""Datasets of the ferry.DataLoader tests (tests/test_dataloader_port.py, tests/test_frameworks.py): importable, so
that spawned producers and frameworks' processes find them."""

from __future__ import annotations

import collections
import os
import threading

import numpy as np
import torch
from torch.utils.data import Dataset

#: a namedtuple of a module the trainer imports (the tests compare the class itself, not its look)
Sample = collections.namedtuple("Sample", ["index", "augmented"])


class Augmented(Dataset):
    """Sample ``i``: its index, and an "augmentation" drawn from torch's, numpy's global and Python's generators,
    as a random transform draws them; with the pid and thread of whoever loaded it."""

    def __init__(self, size: int = 24) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        import random

        noise = torch.rand(3) + float(np.random.rand()) + random.random()
        return {"index": index, "augmented": noise, "pid": os.getpid(), "thread": threading.get_ident()}


class Indexed(Dataset):
    """Sample ``i`` is ``Sample(i, float tensor of i)``: a namedtuple batch."""

    def __init__(self, size: int = 12) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        return Sample(index, torch.full((2,), float(index)))


class Stream(torch.utils.data.IterableDataset):
    """An iterable of ``size`` numbers, split by worker as DataLoader's documentation splits one."""

    def __init__(self, size: int = 10) -> None:
        self.size = size

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        return iter(range(worker, self.size, workers))


class Bulk(Dataset):
    """A map-style dataset with ``__getitems__``: a batch's samples in one call, as DataLoader's fetcher asks."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int):
        return torch.tensor([index])

    def __getitems__(self, indices):
        return [torch.tensor([index * 10]) for index in indices]

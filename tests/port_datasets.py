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

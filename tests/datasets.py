"""Datasets the tests serve through real producers, by spec (``tests.datasets:Name``)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np


def _array(index: int, shape: tuple[int, ...]) -> np.ndarray:
    return (np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + index * 1000).astype(np.float32)


class PairDataset:
    """Sample i is (float32 array, int i)."""

    def __init__(self, length: int = 50, shape=(3, 4), delay: float = 0.0) -> None:
        self.length, self.shape, self.delay = int(length), tuple(shape), float(delay)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if self.delay:
            time.sleep(self.delay)
        return _array(index, self.shape), index


class DictDataset:
    """Sample i is a dict of an array, an int, a float, a bool, a str and a nested tuple."""

    def __init__(self, length: int = 40) -> None:
        self.length = int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return {
            "image": _array(index, (2, 3)),
            "label": index % 3,
            "weight": index / 7.0,
            "flag": index % 2 == 0,
            "name": f"sample-{index}",
            "extra": (np.full(2, index, dtype=np.int16), np.float32(index) / 2),
        }


class FailingDataset(PairDataset):
    """Like PairDataset, but the indices in ``bad`` raise ValueError."""

    def __init__(self, length: int = 50, bad=(7,), shape=(3, 4)) -> None:
        super().__init__(length, shape)
        self.bad = set(bad)

    def __getitem__(self, index: int):
        if index in self.bad:
            raise ValueError(f"corrupt sample {index}")
        return super().__getitem__(index)


class SlowToOpen(PairDataset):
    """A PairDataset whose construction takes ``open_s`` seconds (a folder scan, an index to load)."""

    def __init__(self, length: int = 50, open_s: float = 0.0) -> None:
        time.sleep(open_s)
        super().__init__(length)


class PidDataset(PairDataset):
    """Sample i is (array, i, pid of the producer that loaded it): shows which producer served a batch."""

    canary_values = False  # its samples name the producer: they differ from one to another by design

    def __getitem__(self, index: int):
        array, i = super().__getitem__(index)
        return array, i, os.getpid()


class ClassSorted:
    """Sample i is (int64 [i], i // per_class): as ImageFolder orders a folder, class after class."""

    def __init__(self, length: int = 96, per_class: int = 15) -> None:
        self.length, self.per_class = int(length), int(per_class)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return np.array([index], dtype=np.int64), index // self.per_class


class UserFolder:
    """A user's folder dataset laid out as torchvision's DatasetFolder (``root``, ``classes``, ``samples``), with no
    fingerprint of its own: sample i is (the .npy file's array, its class)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = [(os.path.join(root, c, f), label) for label, c in enumerate(self.classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        return np.load(path), label


#: OverlapProbe's state, one per producer process: loads running now, the most seen at once, and an event set
#: when a load starts while another runs.
_PROBE = {"active": 0, "peak": 0}
_PROBE_LOCK = threading.Lock()
_PROBE_OVERLAP = threading.Event()


class OverlapProbe:
    """Sample i is ``[i, peak]``: ``peak``, the most ``__getitem__`` calls this process has seen running at
    once so far. Sample ``waiter`` waits (up to ``wait`` seconds) for another call to start while it runs, so
    that loads that may overlap do overlap (a batch's first sample of a first batch loads alone: it teaches
    the row layout), and loads that may not leave it waiting out its time."""

    def __init__(self, length: int = 16, waiter: int = 1, wait: float = 1.0) -> None:
        self.length, self.waiter, self.wait = int(length), int(waiter), float(wait)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        with _PROBE_LOCK:
            _PROBE["active"] += 1
            _PROBE["peak"] = max(_PROBE["peak"], _PROBE["active"])
            if _PROBE["active"] > 1:
                _PROBE_OVERLAP.set()
        try:
            if index == self.waiter:
                _PROBE_OVERLAP.wait(self.wait)
            with _PROBE_LOCK:
                return np.array([index, _PROBE["peak"]], np.int64)
        finally:
            with _PROBE_LOCK:
                _PROBE["active"] -= 1


class ThreadBound:
    """Sample i is ``[i, n]``: ``n``, the number of distinct threads that ran ``__getitem__`` in this process so
    far. Like a dataset whose connection (sqlite3, say) works only on the thread that opened it."""

    _threads: set[int] = set()

    def __init__(self, length: int = 16) -> None:
        self.length = int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        with _PROBE_LOCK:
            ThreadBound._threads.add(threading.get_ident())
            return np.array([index, len(ThreadBound._threads)], np.int64)

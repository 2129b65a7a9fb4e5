"""Datasets and child-process bodies for the DataLoader-parity tests of issue 18: lifecycles, error types,
seeds and respawns. Importable (``tests.lifecycle_datasets``), so that spawned children and producers started
by spec find them."""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing
import os
import time
from typing import Any

import torch

from tests.datasets import PairDataset


# --- a loader inside a multiprocessing child ----------------------------------------------------------
#: what a training script keeps until its process exits: a module-level loader, or one its trainer object holds
KEPT: list[Any] = []


def train_without_close(report: Any, batches: int = 3) -> None:
    """The body of a ``torch.multiprocessing.spawn`` child (or any multiprocessing child): iterate a few batches
    of a local-mode loader and return *without* ``close()``, as a DataLoader user's training function does. The
    loader is still referenced when the process exits (``KEPT``). The producers' pids go to ``report`` (a
    ``multiprocessing`` queue) first."""
    from ferry import RemoteLoader

    loader = RemoteLoader(dataset=PairDataset(length=64), local_producers=2, batch_size=4, timeout=30)
    KEPT.append(loader)
    report.put(list(loader._local.pids))
    it = iter(loader)
    for _ in range(batches):
        next(it)


def spawn_entry(rank: int, report: Any) -> None:
    """``torch.multiprocessing.spawn`` passes the rank first."""
    train_without_close(report)


# --- seeds ----------------------------------------------------------------------------------------------
#: seconds a SynchronizedSeedDataset sample waits for the others before it gives up (and returns -1)
SYNC_WAIT_S = 20.0


class SynchronizedSeedDataset:
    """PyTorch's own ``test_dataloader.py`` dataset: each ``__getitem__`` waits until ``num_workers`` samples are
    being loaded at once, then returns ``torch.initial_seed()`` of the process that loads it. With as many
    samples as workers, every worker must load one sample for the epoch to finish, so the seeds seen are every
    worker's. Unlike PyTorch's, its wait is bounded: a sample that waits SYNC_WAIT_S returns -1."""

    def __init__(self, size: int, num_workers: int) -> None:
        self.count = multiprocessing.Value("i", 0, lock=True)
        self.barrier = multiprocessing.Semaphore(0)
        self.num_workers = num_workers
        self.size = size

    def __getitem__(self, index: int) -> int:
        with self.count.get_lock():
            self.count.value += 1
            if self.count.value == self.num_workers:
                self.barrier.release()
        if not self.barrier.acquire(timeout=SYNC_WAIT_S):
            return -1
        self.barrier.release()
        return torch.initial_seed()

    def __len__(self) -> int:
        return self.size


class SeedDataset:
    """Sample i: (i, the loading process's ``torch.initial_seed()``, its pid), each after ``delay`` seconds."""

    canary_values = False  # its samples name the process that loaded them

    def __init__(self, length: int = 64, delay: float = 0.0) -> None:
        self.length, self.delay = int(length), float(delay)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if self.delay:
            time.sleep(self.delay)
        return index, torch.initial_seed(), os.getpid()


# --- crashes --------------------------------------------------------------------------------------------
class SegfaultAt(PairDataset):
    """PairDataset whose samples in ``crash`` kill the process that loads them with SIGSEGV (a decoder's bug)."""

    def __init__(self, length: int = 40, crash=(9,), delay: float = 0.0) -> None:
        super().__init__(length, delay=delay)
        self.crash = set(crash)

    def __getitem__(self, index: int):
        if index in self.crash:
            faulthandler.disable()  # pytest's, inherited by a forked producer: no stack dump in the test's output
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        return super().__getitem__(index)


# --- error types ----------------------------------------------------------------------------------------
class LabelMissing(KeyError):
    """A user's own exception class, importable here, with the usual one-message constructor."""


class NeedsTwo(ValueError):
    """A user's exception whose constructor takes two arguments: it cannot be rebuilt from a message."""

    def __init__(self, path: str, code: int) -> None:
        super().__init__(f"{path}: code {code}")
        self.path, self.code = path, code


class Raising(PairDataset):
    """PairDataset whose sample ``bad`` raises the exception ``kind`` names (see :func:`make_error`)."""

    def __init__(self, length: int = 16, bad: int = 5, kind: str = "KeyError") -> None:
        super().__init__(length)
        self.bad, self.kind = int(bad), kind

    def __getitem__(self, index: int):
        if index == self.bad:
            raise make_error(self.kind, index)
        return super().__getitem__(index)


def make_error(kind: str, index: int) -> BaseException:
    if kind == "KeyError":
        return KeyError(f"label of sample {index}")
    if kind == "LabelMissing":
        return LabelMissing(f"no label for {index}")
    if kind == "NeedsTwo":
        return NeedsTwo(f"/data/{index}.jpg", 7)
    if kind == "UnicodeDecodeError":
        return UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    if kind == "Unimported":  # a class of a module the trainer never imported: an OSError subclass
        from tests import unimported_errors

        return unimported_errors.DecoderError(f"cannot decode sample {index}")
    if kind == "StopIteration":  # an iterator run dry inside __getitem__ (next() on an exhausted reader)
        return StopIteration(f"no record for sample {index}")
    raise ValueError(kind)


def collate_raising_type_error(samples: list) -> Any:
    """A collate_fn that refuses its batch with a TypeError, as default_collate does for odd samples."""
    raise TypeError(f"cannot collate {len(samples)} samples of type {type(samples[0]).__name__}")

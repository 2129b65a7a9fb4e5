"""Datasets and hooks for the tests of producers under an engine (probes, exit statuses, drain, discovery), served
through real producers by spec (``tests.engine_datasets:Name``)."""

from __future__ import annotations

import os
import time

from .datasets import PairDataset


class SlowPairs(PairDataset):
    """PairDataset whose samples take ``delay`` seconds each; its fingerprint does not depend on the delay, so a
    slow and a fast producer serve one loader. ``loading``: a file created as a sample starts to load, for a test to
    know that one is in progress. ``shift``: added to every value (the fingerprint stays): an intruder's dataset.
    ``until``: a file whose appearance ends the delay."""

    fingerprint = "engine-slow-pairs"
    canary = False  # a sample may take a minute: a stand-in for a load that hangs, never loaded at start

    def __init__(self, length: int = 50, delay: float = 0.0, loading: str = "", shift: float = 0.0,
                 until: str = "") -> None:
        super().__init__(length=length, delay=delay)
        self.loading, self.shift, self.until = loading, float(shift), until

    def __getitem__(self, index: int):
        if self.loading:
            with open(self.loading, "a"):
                pass
        if self.until and self.delay and os.path.exists(self.until):
            self.delay = 0.0  # the test is done waiting: the rest of the epoch at full speed
        array, label = super().__getitem__(index)
        return (array + self.shift if self.shift else array), label  # shift: an intruder's other values


def storage_not_mounted(worker_id: int) -> None:
    """An init hook that fails as one whose storage is not there yet."""
    raise OSError(f"worker {worker_id}: /data is not mounted yet")


def fails_once(worker_id: int) -> None:
    """An init hook that fails as storage not mounted yet (the producer exits 4) the first time it runs, and passes
    after: the file named by ``TEST_FAILS_ONCE_FILE`` marks that first time."""
    marker = os.environ["TEST_FAILS_ONCE_FILE"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise OSError(f"worker {worker_id}: /data is not mounted yet (its first start)")

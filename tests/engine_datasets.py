"""Datasets and hooks for the tests of producers under an engine (probes, exit statuses, drain, discovery), served
through real producers by spec (``tests.engine_datasets:Name``)."""

from __future__ import annotations

import time

from .datasets import PairDataset


class SlowPairs(PairDataset):
    """PairDataset whose samples take ``delay`` seconds each; its fingerprint does not depend on the delay, so a
    slow and a fast producer serve one loader. ``loading``: a file created as a sample starts to load, for a test to
    know that one is in progress."""

    fingerprint = "engine-slow-pairs"
    canary = False  # a sample may take a minute: a stand-in for a load that hangs, never loaded at start

    def __init__(self, length: int = 50, delay: float = 0.0, loading: str = "") -> None:
        super().__init__(length=length, delay=delay)
        self.loading = loading

    def __getitem__(self, index: int):
        if self.loading:
            with open(self.loading, "a"):
                pass
        return super().__getitem__(index)


def storage_not_mounted(worker_id: int) -> None:
    """An init hook that fails as one whose storage is not there yet."""
    raise OSError(f"worker {worker_id}: /data is not mounted yet")

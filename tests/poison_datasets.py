"""Datasets for the poison-task tests, served by real producers (``tests.poison_datasets:Name``)."""

from __future__ import annotations

import time

from tests.datasets import PairDataset


class SlowSampleDataset(PairDataset):
    """PairDataset whose samples in ``slow`` each sleep ``sleep`` seconds: longer than any task_timeout."""

    def __init__(self, length: int = 20, slow=(5,), sleep: float = 30.0) -> None:
        super().__init__(length)
        self.slow, self.sleep = set(slow), float(sleep)

    def __getitem__(self, index: int):
        if index in self.slow:
            time.sleep(self.sleep)
        return super().__getitem__(index)

"""Datasets that tell a test what a producer is doing, served by spec (``tests.progress_datasets:Name``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ferry.common.datasets import SyntheticDataset


class TellingDataset(SyntheticDataset):
    """SyntheticDataset (same samples, same fast path) that appends ``"<pid> <index>"`` to the file ``log``
    as each sample *starts* loading, before its ``delay``: a test can stop the producer while that sample's
    row is still to be written."""

    def __init__(self, log: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log = log

    def read_into(self, index: int, out: np.ndarray) -> int:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {index}\n")
        return super().read_into(index, out)


def started_by(log: str, pid: int) -> int:
    """How many samples the producer ``pid`` has started, according to ``log``."""
    try:
        with open(log) as f:
            return sum(1 for line in f if line.split(" ", 1)[0] == str(pid))
    except FileNotFoundError:
        return 0

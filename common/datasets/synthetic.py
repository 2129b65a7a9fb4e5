"""The ``synthetic`` dataset: deterministic samples for demos, tests and benchmarks."""

from __future__ import annotations

import time
from typing import Iterable

import numpy as np

from ferry.common.errors import ConfigError

__all__ = ["SyntheticDataset"]


class SyntheticDataset:
    """Deterministic samples, for demos, tests and benchmarks.

    Sample ``i`` is ``(array, label)``: an array of ``shape`` and ``dtype`` whose content depends only on
    ``i``, and the label ``i % num_classes``. Each access sleeps ``delay`` seconds first, standing in for
    storage latency (it releases the GIL, as real I/O does).

    Args:
        length: number of samples.
        shape: shape of each sample's array.
        dtype: numpy dtype name of the array.
        delay: seconds each sample takes to "load". [Unit: second]
        num_classes: labels cycle through ``range(num_classes)``.
    """

    def __init__(
        self,
        length: int = 1024,
        shape: Iterable[int] = (13, 32, 32),
        dtype: str = "float32",
        delay: float = 0.0,
        num_classes: int = 2,
    ) -> None:
        if int(length) < 0:
            raise ConfigError(f"length must be >= 0, got {length}")
        if float(delay) < 0:
            raise ConfigError(f"delay must be >= 0, got {delay}")
        self.length = int(length)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.delay = float(delay)
        self.num_classes = int(num_classes)
        self._base = (np.arange(int(np.prod(self.shape)), dtype=np.int64) % 251).reshape(self.shape)
        self.fingerprint = f"synthetic:{self.length}:{self.shape}:{self.dtype.str}:{self.num_classes}"

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} samples")
        if self.delay:
            time.sleep(self.delay)
        return self.sample_array(index), index % self.num_classes

    def sample_array(self, index: int) -> np.ndarray:
        return ((self._base + index) % 251).astype(self.dtype)

    # --- the batch fast path (see ferry.producer.loading.batcher): write a sample into its row of a reused buffer ---
    def array_layout(self) -> tuple[tuple[int, ...], np.dtype]:
        return self.shape, self.dtype

    def read_into(self, index: int, out: np.ndarray) -> int:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} samples")
        if self.delay:
            time.sleep(self.delay)
        np.copyto(out, (self._base + index) % 251, casting="unsafe")
        return index % self.num_classes

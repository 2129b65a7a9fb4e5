"""A dataset whose samples say how many CPU threads torch's operations get on the thread that loaded them
(tests/test_torch_threads.py). This module does not import torch: ``__getitem__`` does, as a dataset that imports
it lazily, unless ``import_at_open`` (then torch is loaded before the producer's loading threads start)."""

from __future__ import annotations

import numpy as np


class TorchThreads:
    def __init__(self, length: int = 8, import_at_open: bool = False) -> None:
        self.length = length
        if import_at_open:
            import torch  # noqa: F401

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        import torch

        return np.array([torch.get_num_threads()], np.int64)

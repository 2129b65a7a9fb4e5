"""Benchmark-only datasets, served by producers through their spec ``benchmarks.datasets:Name``."""

from __future__ import annotations

import numpy as np


class Blank:
    """Ready-made samples of ``mib`` MiB with no load cost: the fast path writes nothing into the row.

    With ``batch_size=1`` each batch is one ``mib`` MiB frame, which isolates transport and consumer cost.
    """

    def __init__(self, length: int = 1000, mib: float = 16) -> None:
        self.length = int(length)
        self.nbytes = int(mib * (1 << 20))
        self.fingerprint = f"blank:{self.length}:{self.nbytes}"

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return np.zeros(self.nbytes, np.uint8), 0

    def array_layout(self):
        return (self.nbytes,), np.dtype(np.uint8)

    def read_into(self, index: int, out: np.ndarray) -> int:
        return 0


class UserNpyFolder:
    """A dataset written the way users write one: ``np.load(path)`` in ``__getitem__``, returning
    ``(array, label)`` from class folders (``root/<class>/<name>.npy``). No fast-path methods: Ferry serves it
    through its general path, DataLoader through its workers. The benchmark's headline rows use this class,
    the same object for both.
    """

    def __init__(self, root: str) -> None:
        import os

        self.root = root
        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.samples = [(os.path.join(root, c, name), label) for label, c in enumerate(classes)
                        for name in sorted(os.listdir(os.path.join(root, c))) if name.endswith(".npy")]
        self.fingerprint = f"user-npy:{len(self.samples)}"

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        return np.load(path), label


class UserTorchTransform(UserNpyFolder):
    """:class:`UserNpyFolder` with the transform users write with torch (as torchvision's): the sample as a float
    tensor, normalized per channel, flipped at random. Its operations run on torch's threads, which a producer
    keeps to one per load, as DataLoader's workers (``--torch-threads``, docs/performance.md)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.fingerprint = f"user-torch:{len(self.samples)}"

    def __getitem__(self, index: int):
        import torch

        path, label = self.samples[index]
        x = torch.from_numpy(np.load(path)).float()
        x = (x - x.mean(dim=(-2, -1), keepdim=True)) / (x.std(dim=(-2, -1), keepdim=True) + 1e-6)
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x, label


class SeedTiles(UserTorchTransform):
    """The seed workload of the Ray Data rows (scenario 8): :class:`UserTorchTransform`'s tiles, each returned with its
    index as well, ``(tensor, label, index)``, so that the order each system yields can be checked against the plan.
    ``row`` is the same sample as a Ray Data row (``{"x", "label", "index"}``, the tensor as numpy)."""

    def __getitem__(self, index: int):
        x, label = super().__getitem__(index)
        return x, label, index

    def row(self, row: dict) -> dict:
        x, label, index = self[int(row["index"])]
        return {"x": x.numpy(), "label": label, "index": index}

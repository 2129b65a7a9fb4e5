"""The ``npy-folder`` dataset: ``.npy`` files in class folders, with a read-into-the-batch fast path."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ferry.common.datasets.folders import scan_class_folders
from ferry.common.errors import DatasetError, SampleLoadError

__all__ = ["NpyFolderDataset", "read_npy_header", "read_npy_into"]


def read_npy_header(f: Any) -> tuple[tuple[int, ...], np.dtype, bool]:
    """Parse a ``.npy`` header (format 1.0 or 2.0) from an open file; leaves it at the data."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise DatasetError(f".npy format {version} is not supported by the fast path")
    return tuple(shape), np.dtype(dtype), bool(fortran)


def read_npy_into(path: str, out: np.ndarray) -> None:
    """Read a ``.npy`` file straight into ``out`` (C-contiguous, same shape and dtype): no allocation.

    Raises:
        DatasetError: the file's shape, dtype or layout differs from ``out``, or the file is short.
    """
    with open(path, "rb", buffering=0) as f:
        shape, dtype, fortran = read_npy_header(f)
        if shape != out.shape or dtype != out.dtype or fortran or dtype.hasobject:
            raise DatasetError(f"holds {dtype}{list(shape)}{' (Fortran order)' if fortran else ''}, "
                             f"the batch expects {out.dtype}{list(out.shape)}")
        view = memoryview(out.reshape(-1).view(np.uint8))
        done = 0
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:
                raise DatasetError(f"is truncated: {done} of {len(view)} data bytes")
            done += n


class NpyFolderDataset:
    """``.npy`` files in class subfolders: ``root/<class>/<name>.npy``.

    The layout of torchvision's ImageFolder: classes are the sorted subfolder names, a class's label is
    its position in that list, and samples are ordered by class, then by file name. Sample ``i`` is
    ``(array, label)``.
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"npy-folder root {self.root!r} is not a directory")
        self.classes, self.samples, self.fingerprint = scan_class_folders(self.root, (".npy",), "npy-folder",
                                                                       fold_case=False)
        if not self.classes:
            raise FileNotFoundError(f"npy-folder root {self.root!r} has no class subfolders")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        path, label = self.samples[index]
        try:
            array = np.load(path, allow_pickle=False)
        except Exception as exc:
            raise SampleLoadError(f"cannot load sample {index} from {path}: {type(exc).__name__}: {exc}") from exc
        return array, label

    # --- the batch fast path (see ferry.producer.loading.batcher): header parse, then readinto the batch row ---
    def array_layout(self) -> tuple[tuple[int, ...], np.dtype] | None:
        """Shape and dtype of sample 0, if the fast path can serve this folder (else None)."""
        if not self.samples:
            return None
        try:
            with open(self.samples[0][0], "rb") as f:
                shape, dtype, fortran = read_npy_header(f)
        except (OSError, ValueError):
            return None
        return None if fortran or dtype.hasobject else (shape, dtype)

    def read_into(self, index: int, out: np.ndarray) -> int:
        path, label = self.samples[index]
        try:
            read_npy_into(path, out)
        except Exception as exc:
            raise SampleLoadError(f"cannot load sample {index} from {path}: {type(exc).__name__}: {exc}") from exc
        return label

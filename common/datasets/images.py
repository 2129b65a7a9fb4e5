"""The ``image-folder`` dataset: PNG, JPEG and (multi-channel) TIFF files in class folders.

Same layout and labels as ``npy-folder`` (torchvision's ImageFolder). Samples are ``(array, label)``
with the array in channels-first order (C, H, W), in the file's own dtype (uint8 for PNG/JPEG), so
that uint8 crosses the network and becomes float on the device (``device_transform``).

PNG and JPEG are read with Pillow, TIFF with tifffile: the optional extra ``pip install 'ferry[images]'``.
For TIFF, tifffile says which axes it read: interleaved samples (axes ending in ``S``) are (H, W, C) and
get transposed; any other 3-D layout (``CYX``, ``QYX``, ``IYX`` ...) already has its channels first.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ferry.common.datasets.folders import scan_class_folders
from ferry.common.errors import DatasetError, MissingExtraError, SampleLoadError

EXTENSIONS = {".png": "pillow", ".jpg": "pillow", ".jpeg": "pillow", ".tif": "tifffile", ".tiff": "tifffile"}
EXTRA_HINT = "install the images extra: pip install 'ferry[images]' (Pillow and tifffile)"


def _import(name: str) -> Any:
    try:
        if name == "pillow":
            from PIL import Image

            return Image
        import tifffile

        return tifffile
    except ImportError as exc:
        raise MissingExtraError(f"image-folder needs {'Pillow' if name == 'pillow' else 'tifffile'} "
                                f"to read these files: {EXTRA_HINT}") from exc


def _chw(array: np.ndarray, channels_last: bool) -> np.ndarray:
    if array.ndim == 2:
        return array[None]
    if array.ndim != 3:
        raise DatasetError(f"image has {array.ndim} dimensions, expected 2 or 3")
    return np.ascontiguousarray(array.transpose(2, 0, 1) if channels_last else array)


class ImageFolderDataset:
    """Images in ``root/<class>/<file>``; see the module docstring."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"image-folder root {self.root!r} is not a directory")
        self.classes, self.samples, self.fingerprint = scan_class_folders(self.root, tuple(EXTENSIONS), "image-folder")
        if not self.samples:
            raise FileNotFoundError(f"image-folder root {self.root!r} holds no {sorted(EXTENSIONS)} files "
                                    "in class subfolders")
        for reader in {EXTENSIONS[os.path.splitext(p)[1].lower()] for p, _ in self.samples}:
            _import(reader)  # fail at start, with the hint, not at the first sample

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        path, label = self.samples[index]
        reader = EXTENSIONS[os.path.splitext(path)[1].lower()]
        try:
            if reader == "pillow":
                with _import("pillow").open(path) as image:
                    return _chw(np.asarray(image), channels_last=True), label
            with _import("tifffile").TiffFile(path) as tiff:
                series = tiff.series[0]
                return _chw(series.asarray(), channels_last=series.axes.endswith("S")), label
        except MissingExtraError:
            raise
        except Exception as exc:
            raise SampleLoadError(f"cannot load sample {index} from {path}: {type(exc).__name__}: {exc}") from exc

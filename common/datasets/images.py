"""The ``image-folder`` dataset: PNG, JPEG and (multi-channel) TIFF files in class folders.

Same layout and labels as ``npy-folder`` (torchvision's ImageFolder). Samples are ``(array, label)``
with the array in channels-first order (C, H, W), in the file's own dtype (uint8 for PNG/JPEG), so
that uint8 crosses the network and becomes float on the device (``device_transform``).

Ordinary photos differ in size and mode (grayscale, RGBA, palette), and a batch needs one shape: give
``mode="RGB"`` and ``resize``/``crop`` (torchvision's ``convert``, ``Resize`` and ``CenterCrop``, see
:mod:`.decoding`), or a producer transform that makes them alike (docs/datasets.md has one with torchvision).

PNG and JPEG are read with Pillow, TIFF with tifffile: the optional extra ``pip install 'ferry[images]'``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ferry.common.datasets.decoding import EXTENSIONS, EXTRA_HINT, ImageDecoding, import_reader
from ferry.common.datasets.folders import scan_class_folders
from ferry.common.errors import MissingExtraError, SampleLoadError

__all__ = ["ImageFolderDataset", "EXTENSIONS", "EXTRA_HINT"]


class ImageFolderDataset:
    """Images in ``root/<class>/<file>``; see the module docstring.

    Args:
        root: the folder of class folders.
        mode: convert every image to this Pillow mode (``"RGB"``, ``"L"`` …); None keeps each file's.
        resize: an int (the shorter side, aspect kept) or ``[height, width]``. [Unit: pixel]
        crop: an int or ``[height, width]``: the centre, after ``resize``. [Unit: pixel]

    Raises:
        FileNotFoundError: ``root`` is not a folder, or holds no image in a class folder.
        DatasetError: an option out of range.
        MissingExtraError: Pillow or tifffile is needed and missing.
    """

    def __init__(self, root: str, mode: str | None = None, resize: Any = None, crop: Any = None) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.decoding = ImageDecoding.of(mode, resize, crop)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"image-folder root {self.root!r} is not a directory")
        self.classes, self.samples, fingerprint = scan_class_folders(self.root, tuple(EXTENSIONS), "image-folder")
        options = self.decoding.describe()  # another decoding serves other arrays
        self.fingerprint = f"{fingerprint}:{options}" if options else fingerprint
        if not self.samples:
            raise FileNotFoundError(f"image-folder root {self.root!r} holds no {sorted(EXTENSIONS)} files "
                                    "in class subfolders")
        for reader in {EXTENSIONS[os.path.splitext(p)[1].lower()] for p, _ in self.samples}:
            import_reader(reader)  # fail at start, with the hint, not at the first sample
        if self.decoding.resize is not None:
            import_reader("pillow")  # resizing needs Pillow, for TIFFs too

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        path, label = self.samples[index]
        try:
            return self.decoding.read(path, os.path.splitext(path)[1]), label
        except MissingExtraError:
            raise
        except Exception as exc:
            raise SampleLoadError(f"cannot load sample {index} from {path}: {type(exc).__name__}: {exc}") from exc

    def encoded(self, index: int) -> tuple[str, bytes, int]:
        """Sample ``index`` as its file holds it: ``(extension, bytes, label)``, the extension in lower case.
        ``ferry pack --format tar`` stores this (WebDataset's convention: producers decode)."""
        path, label = self.samples[index]
        with open(path, "rb") as f:
            return os.path.splitext(path)[1].lower(), f.read(), label

    def decoding_args(self) -> dict[str, Any]:
        """The keyword arguments that make ``tar-shards`` decode these images as this dataset does."""
        d = self.decoding
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in
                (("mode", d.mode), ("resize", d.resize[0] if d.resize and len(d.resize) == 1 else d.resize),
                 ("crop", d.crop)) if v is not None}

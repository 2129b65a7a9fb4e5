"""Decoding an image file into a channels-first array, as ``image-folder`` and ``tar-shards`` both do, with the
options a folder of ordinary photos needs: ``mode`` (Pillow's, e.g. ``"RGB"``), ``resize`` and ``crop``.

PNG and JPEG are read with Pillow, TIFF with tifffile: the optional extra ``pip install 'ferry[images]'``.
For TIFF, tifffile says which axes it read: interleaved samples (axes ending in ``S``) are (H, W, C) and get
transposed; any other 3-D layout (``CYX``, ``QYX``, ``IYX`` ...) already has its channels first.

The options follow torchvision's PIL path, so that a photo comes out as
``CenterCrop(crop)(Resize(resize)(Image.open(f).convert(mode)))`` would give it, as a (C, H, W) array in the
image's dtype (uint8 for an 8-bit mode): ``resize`` an int matches the shorter side to it, keeping the aspect
ratio (the longer side rounded down); ``[height, width]`` sets both. Resampling is bilinear. ``crop`` (an int or
``[height, width]``) takes the centre; an image smaller than the crop is an error, not padded. A TIFF keeps its
channels: ``mode`` only checks that their count is the mode's, and each channel is resized on its own (as
32-bit floats, rounded back to the TIFF's integer dtype).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from ferry.common.errors import DatasetError, MissingExtraError

__all__ = ["EXTENSIONS", "EXTRA_HINT", "ImageDecoding", "import_reader", "channels_first"]

#: Image file extensions (lower case) and the library that reads them.
EXTENSIONS = {".png": "pillow", ".jpg": "pillow", ".jpeg": "pillow", ".tif": "tifffile", ".tiff": "tifffile"}
EXTRA_HINT = "install the images extra: pip install 'ferry[images]' (Pillow and tifffile)"

#: Pillow modes an image may be converted to, and their channels.
MODES = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "CMYK": 4, "YCbCr": 3, "LAB": 3, "HSV": 3, "I": 1, "F": 1}


def import_reader(name: str) -> Any:
    """Pillow's ``Image`` module (``name`` "pillow") or ``tifffile``.

    Raises:
        MissingExtraError: the library is not installed; the message says how to install it.
    """
    try:
        if name == "pillow":
            from PIL import Image

            return Image
        import tifffile

        return tifffile
    except ImportError as exc:
        raise MissingExtraError(f"image-folder needs {'Pillow' if name == 'pillow' else 'tifffile'} "
                                f"to read these files: {EXTRA_HINT}") from exc


def channels_first(array: np.ndarray, channels_last: bool) -> np.ndarray:
    """(H, W) -> (1, H, W); (H, W, C) -> (C, H, W) when ``channels_last``; a (C, H, W) array as it is."""
    if array.ndim == 2:
        return array[None]
    if array.ndim != 3:
        raise DatasetError(f"image has {array.ndim} dimensions, expected 2 or 3")
    return np.ascontiguousarray(array.transpose(2, 0, 1) if channels_last else array)


def _size(value: Any, what: str, *, single: bool) -> tuple[int, ...] | None:
    """An int (``single``: kept as one number) or ``[height, width]``, each >= 1; None stays None."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        sizes: tuple[Any, ...] = (value,) if single else (value, value)
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        sizes = tuple(value)
    else:
        sizes = ()
    if not sizes or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes):
        raise DatasetError(f"{what} must be an int or [height, width] of ints >= 1 (pixels), got {value!r}")
    return sizes


@dataclass(frozen=True)
class ImageDecoding:
    """How an image file becomes an array; see the module docstring. The default changes nothing."""

    mode: str | None = None
    resize: tuple[int, ...] | None = None  # (shorter side,) or (height, width) [Unit: pixel]
    crop: tuple[int, int] | None = None  # (height, width) of the centre [Unit: pixel]

    @classmethod
    def of(cls, mode: Any = None, resize: Any = None, crop: Any = None) -> "ImageDecoding":
        """The options as a dataset's keyword arguments give them.

        Raises:
            DatasetError: a mode Pillow cannot convert to, or a size that is not an int or [height, width] >= 1.
        """
        if mode is not None and mode not in MODES:
            raise DatasetError(f"mode must be one of Pillow's {sorted(MODES)} (or None: the file's own), got {mode!r}")
        crop_size = _size(crop, "crop", single=False)
        return cls(mode, _size(resize, "resize", single=True), crop_size)  # type: ignore[arg-type]

    def describe(self) -> str:
        """The options that change something, for a fingerprint: "" when none does."""
        parts = [f"{name}={value}" for name, value in (("mode", self.mode), ("resize", self.resize),
                                                       ("crop", self.crop)) if value is not None]
        return ",".join(parts)

    def read(self, source: Any, extension: str) -> np.ndarray:
        """The image in ``source`` (a path, or the file's bytes) whose name ends in ``extension``."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            source = io.BytesIO(source)
        if EXTENSIONS[extension.lower()] == "pillow":
            with import_reader("pillow").open(source) as image:
                return self.from_pillow(image)
        with import_reader("tifffile").TiffFile(source) as tiff:
            series = tiff.series[0]
            return self.from_array(channels_first(series.asarray(), channels_last=series.axes.endswith("S")))

    def from_pillow(self, image: Any) -> np.ndarray:
        if self.mode is not None and image.mode != self.mode:
            image = image.convert(self.mode)
        if self.resize is not None:
            height, width = self._resized(image.height, image.width)
            if (height, width) != (image.height, image.width):
                image = image.resize((width, height), import_reader("pillow").Resampling.BILINEAR)
        if self.crop is not None:
            top, left = self._crop_origin(image.height, image.width)
            image = image.crop((left, top, left + self.crop[1], top + self.crop[0]))
        return channels_first(np.asarray(image), channels_last=True)

    def from_array(self, array: np.ndarray) -> np.ndarray:
        """A (C, H, W) array (a TIFF's), resized and cropped channel by channel."""
        if self.mode is not None and array.shape[0] != MODES[self.mode]:
            raise DatasetError(f"a TIFF of {array.shape[0]} channels cannot be read as mode {self.mode!r} "
                               f"({MODES[self.mode]} channels): TIFF channels are kept as they are")
        if self.resize is not None:
            height, width = self._resized(*array.shape[1:])
            if (height, width) != array.shape[1:]:
                array = np.stack([self._resize_plane(plane, height, width) for plane in array])
        if self.crop is not None:
            top, left = self._crop_origin(*array.shape[1:])
            array = np.ascontiguousarray(array[:, top:top + self.crop[0], left:left + self.crop[1]])
        return array

    def _resized(self, height: int, width: int) -> tuple[int, int]:
        assert self.resize is not None
        if len(self.resize) == 2:
            return self.resize[0], self.resize[1]
        (short,) = self.resize
        if width <= height:
            return int(short * height / width), short
        return short, int(short * width / height)

    def _crop_origin(self, height: int, width: int) -> tuple[int, int]:
        assert self.crop is not None
        if height < self.crop[0] or width < self.crop[1]:
            raise DatasetError(f"image of {height}x{width} (height x width, after resize) is smaller than the crop "
                               f"{self.crop[0]}x{self.crop[1]}: give a resize of at least the crop")
        return int(round((height - self.crop[0]) / 2.0)), int(round((width - self.crop[1]) / 2.0))

    @staticmethod
    def _resize_plane(plane: np.ndarray, height: int, width: int) -> np.ndarray:
        image = import_reader("pillow").fromarray(plane.astype(np.float32))  # mode "F"
        resized = np.asarray(image.resize((width, height), import_reader("pillow").Resampling.BILINEAR))
        if np.issubdtype(plane.dtype, np.integer):
            info = np.iinfo(plane.dtype)
            resized = np.clip(np.rint(resized), info.min, info.max)
        return resized.astype(plane.dtype)

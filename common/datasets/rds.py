"""The ``rds-folder`` dataset: R's ``saveRDS`` files in class folders, as an R torch user keeps them.

Each file holds one sample: a numeric, integer or logical R vector (or array), written by ``saveRDS`` with
any of its compressions (gzip, R's default; xz; bzip2; none). Its values, in R's order (column-major for an
array), fill ``shape`` as R's ``array(values, dim = shape)`` does: element ``[i, j, k]`` (0-based here) is
value ``i + j * shape[0] + k * shape[0] * shape[1]`` of the file, so that the sample is the array R itself makes
of the file, index for index (R's ``a[i + 1, j + 1, k + 1]``). Files may have any extension (the seed's are
named ``.png``); names starting with a dot are skipped. Labels are the class folders' positions, as
torchvision's ``ImageFolder`` (and ``npy-folder``) give them.

Read with the ``rdata`` package (pure Python: a parser of R's serialization format; ``pip install
'ferry[rds]'``). A file whose length does not match ``shape``, or that holds something else (a list, a data
frame, strings), or values the ``dtype`` cannot hold, is a ``SampleLoadError`` naming the file.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ferry.common.datasets.folders import scan_class_folders
from ferry.common.errors import DatasetError, MissingExtraError, SampleLoadError

__all__ = ["RdsFolderDataset", "read_rds_values", "parse_shape", "EXTRA_HINT"]

EXTRA_HINT = "install the rds extra: pip install 'ferry[rds]' (the rdata package)"

#: The dtypes a sample may be made of: R's numbers fit them (integer ones are checked per sample).
DTYPES = ("float32", "float64", "float16", "uint8", "int8", "int16", "int32", "int64", "bool")


def _rdata() -> Any:
    try:
        import rdata
    except ImportError as exc:
        raise MissingExtraError(f"rds-folder needs the rdata package: {EXTRA_HINT}") from exc
    return rdata


def parse_shape(shape: Any) -> tuple[int, ...]:
    """``shape`` as given: a list of ints, or a string such as ``"13,299,299"`` (or ``13x299x299``).

    Raises:
        DatasetError: not a list of positive ints.
    """
    if isinstance(shape, str):
        parts = [p for p in shape.replace("x", ",").replace(" ", ",").split(",") if p]
        try:
            shape = [int(p) for p in parts]
        except ValueError:
            raise DatasetError(f"rds-folder shape {shape!r} must be positive integers, e.g. 13,299,299") from None
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = [shape]
    if (not isinstance(shape, (list, tuple)) or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
        raise DatasetError(f"rds-folder shape {shape!r} must be positive integers, e.g. [13, 299, 299]")
    return tuple(shape)


def read_rds_values(path: str) -> np.ndarray:
    """The values of the R vector or array an RDS file holds, flat, in R's (column-major) order.

    Raises:
        DatasetError: the file holds no numeric, integer or logical vector, or holds NA in an integer or logical one.
        OSError: the file cannot be read.
    """
    rdata = _rdata()
    with open(path, "rb") as f:
        data = f.read()
    # extension=".rds": what the file holds, whatever its name says (rdata warns about names otherwise)
    value = rdata.conversion.convert(rdata.parser.parse_data(data, extension=".rds"))
    values = getattr(value, "values", value)  # an array with dimnames comes as an xarray DataArray
    if isinstance(values, np.ma.MaskedArray):
        if np.ma.is_masked(values):
            raise DatasetError(f"holds NA at value {int(np.argmax(np.ma.getmaskarray(values).ravel(order='F')))} "
                               "(0-based, R's order)")
        values = values.data
    if not isinstance(values, np.ndarray) or values.dtype.kind not in "fiub":
        what = type(value).__name__ if not isinstance(values, np.ndarray) else f"{values.dtype} values"
        raise DatasetError(f"holds {what}, not an R numeric, integer or logical vector or array")
    return values.ravel(order="F")  # no copy for R's own column-major arrays and for vectors


class RdsFolderDataset:
    """``saveRDS`` files in ``root/<class>/<file>``; see the module docstring. Sample ``i`` is ``(array, label)``.

    Args:
        root: the folder of class folders.
        shape: each sample's shape, e.g. ``[13, 299, 299]`` or ``"13,299,299"``, filled as R's
            ``array(values, dim = shape)``.
        dtype: the samples' numpy dtype (``float32`` by default; ``float64`` keeps R's doubles; ``uint8`` carries
            whole numbers 0..255, as tiles of counts, in 8 times fewer bytes than R's doubles). Values an integer
            dtype cannot hold exactly (a fraction, NaN, out of range) are an error naming the file.

    Raises:
        FileNotFoundError: ``root`` is not a folder, or has no file in a class folder.
        DatasetError: ``shape`` or ``dtype`` is invalid.
        MissingExtraError: rdata is not installed.
    """

    def __init__(self, root: str, shape: Any, dtype: str = "float32") -> None:
        _rdata()  # fail at start, with the hint, not at the first sample
        self.root = os.path.abspath(os.fspath(root))
        self.shape = parse_shape(shape)
        if str(dtype) not in DTYPES:
            raise DatasetError(f"rds-folder dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        self.dtype = np.dtype(str(dtype))
        self.length = math.prod(self.shape)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"rds-folder root {self.root!r} is not a directory")
        self.classes, self.samples, fingerprint = scan_class_folders(self.root, None, "rds-folder")
        if not self.samples:
            raise FileNotFoundError(f"rds-folder root {self.root!r} has no files in class subfolders")
        self.fingerprint = f"{fingerprint}:shape={'x'.join(map(str, self.shape))}:{self.dtype.name}"

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        out = np.empty(self.shape, self.dtype)
        return out, self.read_into(index, out)

    # --- the batch fast path (see ferry.producer.batcher): each file parsed straight into its row of the batch ---
    def array_layout(self) -> tuple[tuple[int, ...], np.dtype]:
        return self.shape, self.dtype

    def read_into(self, index: int, out: np.ndarray) -> int:
        path, label = self.samples[index]
        try:
            values = read_rds_values(path)
            if values.size != self.length:
                raise DatasetError(f"holds {values.size} values; shape {list(self.shape)} needs {self.length}")
            self._check_fits(values)
            out[...] = values.reshape(self.shape, order="F")  # R's array(values, dim = shape), cast on the way
        except MissingExtraError:
            raise
        except Exception as exc:
            raise SampleLoadError(f"cannot load sample {index} from {path}: {type(exc).__name__}: {exc}") from exc
        return label

    def _check_fits(self, values: np.ndarray) -> None:
        """An integer dtype must hold every value exactly: no fraction, NaN or value out of its range."""
        if self.dtype.kind not in "iu" or values.dtype == self.dtype:
            return
        info = np.iinfo(self.dtype)
        low, high = values.min(), values.max()
        if not (info.min <= low and high <= info.max):  # False for NaN too
            raise DatasetError(f"holds values from {low} to {high}, outside {self.dtype.name}'s {info.min}..{info.max}")
        if values.dtype.kind == "f" and not np.array_equal(values, np.trunc(values)):
            raise DatasetError(f"holds fractions, which {self.dtype.name} cannot hold; use a float dtype")

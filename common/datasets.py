"""Dataset specs and the built-in datasets.

A *spec* names a map-style dataset (``__len__`` + ``__getitem__``) that a producer builds for itself:

* a built-in name: ``synthetic``, ``npy-folder``, ``image-folder`` or ``packed`` (see :data:`BUILTINS`);
* ``package.module:callable``: a class or factory, called with the spec's keyword arguments.

``--dataset-arg key=value`` values are parsed as JSON when they parse, else taken as strings.

Every dataset has a *fingerprint*: a short string that two producers of the same data agree on. A
dataset may define ``fingerprint`` (a str attribute or a method); otherwise it is the class's qualified
name and the length. The consumer rejects a producer whose fingerprint differs from the first one's.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import time
from typing import Any, Callable, Iterable

import numpy as np

from ferry.common.errors import DatasetSpecError

__all__ = [
    "BUILTINS",
    "SyntheticDataset",
    "NpyFolderDataset",
    "SampleLoadError",
    "resolve_dataset",
    "parse_dataset_args",
    "dataset_fingerprint",
]


class SampleLoadError(Exception):
    """A built-in dataset could not load one sample; the message names the file."""


def read_npy_header(f: Any) -> tuple[tuple[int, ...], np.dtype, bool]:
    """Parse a ``.npy`` header (format 1.0 or 2.0) from an open file; leaves it at the data."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f".npy format {version} is not supported by the fast path")
    return tuple(shape), np.dtype(dtype), bool(fortran)


def read_npy_into(path: str, out: np.ndarray) -> None:
    """Read a ``.npy`` file straight into ``out`` (C-contiguous, same shape and dtype): no allocation.

    Raises:
        ValueError: the file's shape, dtype or layout differs from ``out``, or the file is short.
    """
    with open(path, "rb", buffering=0) as f:
        shape, dtype, fortran = read_npy_header(f)
        if shape != out.shape or dtype != out.dtype or fortran or dtype.hasobject:
            raise ValueError(f"holds {dtype}{list(shape)}{' (Fortran order)' if fortran else ''}, "
                             f"the batch expects {out.dtype}{list(out.shape)}")
        view = memoryview(out.reshape(-1).view(np.uint8))
        done = 0
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:
                raise ValueError(f"is truncated: {done} of {len(view)} data bytes")
            done += n


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
            raise ValueError(f"length must be >= 0, got {length}")
        if float(delay) < 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
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

    # --- the batch fast path (see ferry.producer.batcher): write a sample into its row of a reused buffer ---
    def array_layout(self) -> tuple[tuple[int, ...], np.dtype]:
        return self.shape, self.dtype

    def read_into(self, index: int, out: np.ndarray) -> int:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} samples")
        if self.delay:
            time.sleep(self.delay)
        np.copyto(out, (self._base + index) % 251, casting="unsafe")
        return index % self.num_classes


def scan_class_folders(root: str, extensions: tuple[str, ...], kind: str,
                       fold_case: bool = True) -> tuple[list[str], list[tuple[str, int]], str]:
    """ImageFolder's layout: ``root/<class>/<file>``, classes sorted, a label its class's position, files sorted
    within a class. Returns the classes, the ``(path, label)`` samples and a fingerprint of names and sizes.
    ``fold_case``: match extensions case-insensitively."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        files = sorted(f for f in os.listdir(folder)
                       if (os.path.splitext(f)[1].lower() if fold_case else os.path.splitext(f)[1]) in extensions)
        samples.extend((os.path.join(folder, f), label) for f in files)
    digest = hashlib.sha1()
    for path, label in samples:
        digest.update(f"{os.path.relpath(path, root)}:{label}:{os.path.getsize(path)}\n".encode())
    return classes, samples, f"{kind}:{len(samples)}:{digest.hexdigest()[:16]}"


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

    # --- the batch fast path (see ferry.producer.batcher): header parse, then readinto the batch row ---
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


def _image_folder(root: str) -> Any:
    from ferry.common.images import ImageFolderDataset

    return ImageFolderDataset(root)


def _packed(root: str) -> Any:
    from ferry.common.packed import PackedDataset

    return PackedDataset(root)


#: Built-in dataset names and their factories.
BUILTINS: dict[str, Callable[..., Any]] = {
    "synthetic": SyntheticDataset,
    "npy-folder": NpyFolderDataset,
    "packed": _packed,
    "image-folder": _image_folder,
}


def resolve_dataset(spec: str, kwargs: dict[str, Any] | None = None) -> Any:
    """Build the dataset a spec names.

    Raises:
        DatasetSpecError: the spec is malformed, its module or attribute is missing, the factory raised,
            or what it returned is not a map-style dataset. The message names the spec and the cause.
    """
    kwargs = dict(kwargs or {})
    if not isinstance(spec, str) or not spec:
        raise DatasetSpecError(f"dataset spec must be a non-empty string, got {spec!r}")
    if spec in BUILTINS:
        factory = BUILTINS[spec]
    elif ":" in spec:
        factory = resolve_callable(spec, "dataset spec")
    else:
        raise DatasetSpecError(
            f"dataset spec {spec!r} is neither a built-in ({', '.join(sorted(BUILTINS))}) "
            "nor 'package.module:callable'"
        )
    try:
        dataset = factory(**kwargs)
    except Exception as exc:
        raise DatasetSpecError(f"dataset spec {spec!r} with {kwargs!r} failed: {type(exc).__name__}: {exc}") from exc
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise DatasetSpecError(f"dataset spec {spec!r} returned {type(dataset).__name__}, not a map-style dataset")
    return dataset


class Transformed:
    """A dataset whose samples pass through ``transform`` (a producer-side, per-sample hook)."""

    def __init__(self, dataset: Any, transform: Any, spec: str) -> None:
        self.dataset, self.transform, self.spec = dataset, transform, spec
        self.fingerprint = f"{dataset_fingerprint(dataset)}|transform={spec}"

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.transform(self.dataset[index])


def resolve_callable(spec: str, what: str = "transform") -> Any:
    """``package.module:callable`` -> the callable, with errors that name the spec."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise DatasetSpecError(f"{what} {spec!r} must look like 'package.module:callable'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise DatasetSpecError(f"{what} {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise DatasetSpecError(f"{what} {spec!r}: {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(obj):
        raise DatasetSpecError(f"{what} {spec!r}: {attr_path!r} is not callable")
    return obj


def parse_dataset_args(pairs: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are JSON when they parse, else plain strings."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise DatasetSpecError(f"dataset argument {pair!r} must look like key=value")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def dataset_fingerprint(dataset: Any) -> str:
    """The dataset's own ``fingerprint`` if it has one, else its class's qualified name and its length."""
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        own = own()
    if own is not None:
        return str(own)
    cls = type(dataset)
    return f"{cls.__module__}.{cls.__qualname__}:{len(dataset)}"

"""The ``tar-shards`` dataset: a sharded (streaming) source in the WebDataset convention, and its writer.

A shard is a ``.tar`` file; its members are grouped into samples by *key*: the member's path up to the first
dot of its file name (``000017.npy`` and ``000017.cls`` are one sample, key ``000017``), in the order they
appear. Each member is decoded by its last extension:

* ``.npy``: the array (``allow_pickle=False``);
* ``.png``, ``.jpg``, ``.jpeg``, ``.tif``, ``.tiff``: the image as image-folder reads it, channels first
  (C, H, W) in the file's dtype (Pillow or tifffile: ``pip install 'ferry[images]'``);
* ``.cls``: an int label (decimal text);
* anything else: the member's bytes.

A sample of one array (or image) and a ``.cls`` is ``(array, label)``, as npy-folder and image-folder give
it; a sample of one member is that value; any other sample is a dict from extension to value.

Shard names are the files' paths relative to the folder the glob's matches share, so producers that mount
the data in different places still agree on them. ``shard_len`` counts a shard's keys by reading the tar's
headers (member data is skipped), so ``len(loader)`` is known.

:func:`pack_tar` (``ferry pack --format tar``) writes any map-style dataset of ``(array, label)`` samples (or
bare arrays) as such shards: ``shard-00000.tar`` … with members ``<index>.npy`` and ``<index>.cls``.
"""

from __future__ import annotations

import glob as globbing
import io
import os
import tarfile
from typing import Any, Iterator

import numpy as np

from ferry.common.errors import DatasetError, SampleLoadError

__all__ = ["TarShardsDataset", "pack_tar", "decode_member"]

IMAGE_EXTENSIONS = {".png": "pillow", ".jpg": "pillow", ".jpeg": "pillow", ".tif": "tifffile", ".tiff": "tifffile"}


class TarShardsDataset:
    """``.tar`` shards matching ``pattern`` (a glob, or a folder: its ``*.tar``); see the module docstring."""

    def __init__(self, pattern: str) -> None:
        pattern = os.path.abspath(os.path.expanduser(os.fspath(pattern)))
        if os.path.isdir(pattern):
            pattern = os.path.join(pattern, "*.tar")
        paths = sorted(p for p in globbing.glob(pattern) if os.path.isfile(p))
        if not paths:
            raise FileNotFoundError(f"tar-shards: no file matches {pattern!r}")
        self.pattern = pattern
        base = os.path.commonpath([os.path.dirname(p) for p in paths])
        self._paths = {os.path.relpath(p, base): p for p in paths}
        self._lengths: dict[str, int] = {}

    def shards(self) -> list[str]:
        return list(self._paths)

    def shard_len(self, name: str) -> int:
        if name not in self._lengths:
            with tarfile.open(self._path(name), "r:") as tar:
                self._lengths[name] = len({_key(m.name) for m in tar if m.isfile()})
        return self._lengths[name]

    def iter_shard(self, name: str) -> Iterator[Any]:
        path = self._path(name)
        with tarfile.open(path, "r|") as tar:  # a stream: one pass, no seeking
            key, members = None, {}
            for member in tar:
                if not member.isfile():
                    continue
                this = _key(member.name)
                if this != key and members:
                    yield _sample(members, key, path)
                    members = {}
                key = this
                extension = member.name[len(this):]
                handle = tar.extractfile(member)
                members[extension] = handle.read() if handle is not None else b""
            if members:
                yield _sample(members, key, path)

    def _path(self, name: str) -> str:
        try:
            return self._paths[name]
        except KeyError:
            raise DatasetError(f"tar-shards: no shard named {name!r} (this producer sees {len(self._paths)} shards "
                               f"matching {self.pattern!r})") from None


def _key(member_name: str) -> str:
    folder, base = os.path.split(member_name)
    return os.path.join(folder, base.split(".", 1)[0])


def _sample(members: dict[str, bytes], key: Any, path: str) -> Any:
    try:
        values = {extension.lstrip("."): decode_member(extension, data) for extension, data in members.items()}
    except Exception as exc:
        raise SampleLoadError(f"cannot decode sample {key!r} of {path}: {type(exc).__name__}: {exc}") from exc
    if len(values) == 2 and "cls" in values:
        (data,) = [v for k, v in values.items() if k != "cls"]
        if isinstance(data, np.ndarray):
            return data, values["cls"]
    if len(values) == 1:
        return next(iter(values.values()))
    return dict(sorted(values.items()))


def decode_member(extension: str, data: bytes) -> Any:
    """A member's value, by its last extension (see the module docstring)."""
    last = "." + extension.rsplit(".", 1)[-1].lower()
    if last == ".npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    if last == ".cls":
        return int(data.decode().strip())
    if last in IMAGE_EXTENSIONS:
        from ferry.common.datasets.images import _chw, _import

        if IMAGE_EXTENSIONS[last] == "pillow":
            with _import("pillow").open(io.BytesIO(data)) as image:
                return _chw(np.asarray(image), channels_last=True)
        with _import("tifffile").TiffFile(io.BytesIO(data)) as tiff:
            series = tiff.series[0]
            return _chw(series.asarray(), channels_last=series.axes.endswith("S"))
    return data


def pack_tar(dataset: Any, out: str, *, shard_samples: int = 1000, progress: Any = None) -> list[str]:
    """Write a map-style ``dataset`` as WebDataset ``.tar`` shards of ``shard_samples`` samples each in ``out``.

    Samples must be ``(array, label)`` or bare arrays. Returns the shard file names, in order.

    Raises:
        DatasetError: an empty dataset, or a sample of another kind.
    """
    n = len(dataset)
    if n == 0:
        raise DatasetError("cannot pack an empty dataset")
    if shard_samples < 1:
        raise DatasetError(f"shard_samples must be at least 1, got {shard_samples}")
    os.makedirs(out, exist_ok=True)
    digits = max(6, len(str(n - 1)))
    names: list[str] = []
    tar = None
    try:
        for i in range(n):
            if i % shard_samples == 0:
                if tar is not None:
                    tar.close()
                names.append(f"shard-{len(names):05d}.tar")
                tar = tarfile.open(os.path.join(out, names[-1]), "w", format=tarfile.USTAR_FORMAT)
            sample = dataset[i]
            array, label = sample if isinstance(sample, tuple) and len(sample) == 2 else (sample, None)
            if not isinstance(array, np.ndarray) or (label is not None and not isinstance(label, (int, np.integer))):
                raise DatasetError(f"sample {i} is {type(sample).__name__}; tar packing takes (array, int label) "
                                   "or array samples")
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
            _add(tar, f"{i:0{digits}d}.npy", buffer.getvalue())
            if label is not None:
                _add(tar, f"{i:0{digits}d}.cls", str(int(label)).encode())
            if progress and (i + 1) % 1000 == 0:
                progress(i + 1, n)
    finally:
        if tar is not None:
            tar.close()
    return names


def _add(tar: Any, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))

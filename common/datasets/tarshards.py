"""The ``tar-shards`` dataset: a sharded (streaming) source in the WebDataset convention.

A shard is a ``.tar`` file; its members are grouped into samples by *key*: the member's path up to the first
dot of its file name (``000017.npy`` and ``000017.cls`` are one sample, key ``000017``), in the order they
appear. Each member is decoded by its last extension:

* ``.npy``: the array (``allow_pickle=False``);
* ``.png``, ``.jpg``, ``.jpeg``, ``.tif``, ``.tiff``: the image as image-folder reads it, channels first
  (C, H, W) in the file's dtype, with the same ``mode``, ``resize`` and ``crop`` options (:mod:`.decoding`;
  Pillow or tifffile: ``pip install 'ferry[images]'``);
* ``.cls``: an int label (decimal text);
* anything else: the member's bytes.

A sample of one array (or image) and a ``.cls`` is ``(array, label)``, as npy-folder and image-folder give
it; a sample of one member is that value; any other sample is a dict from extension to value.

Shard names are the files' paths relative to the folder the glob's matches share, so producers that mount
the data in different places still agree on them; the fingerprint covers the names, the files' sizes, the
shuffle buffer and the decoding options. ``shard_len`` comes from :data:`SHARD_INDEX` in that folder (wids'
shard index, which ``ferry pack --format tar`` writes) for each shard it lists at its current size, else from
counting the tar's headers (member data is skipped); producers announce the lengths, so ``len(loader)`` is
known. ``shuffle_buffer`` shuffles within each shard (:mod:`ferry.common.shardplan`).

The writer, :func:`~ferry.common.datasets.tarpack.pack_tar` (``ferry pack --format tar``), is in
:mod:`.tarpack`.
"""

from __future__ import annotations

import glob as globbing
import hashlib
import io
import json
import os
import tarfile
from typing import Any, Iterator

import numpy as np

from ferry.common.datasets.decoding import EXTENSIONS as IMAGE_EXTENSIONS
from ferry.common.datasets.decoding import ImageDecoding
from ferry.common.errors import DatasetError, SampleLoadError

__all__ = ["TarShardsDataset", "pack_tar", "decode_member", "SHARD_INDEX", "read_shard_index"]

#: The shard index ``ferry pack --format tar`` writes beside the shards, in wids' format (webdataset's indexed
#: datasets): ``{"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": [{"url", "nsamples",
#: "filesize"}, ...]}``, urls relative to its folder.
SHARD_INDEX = "shardindex.json"
INDEX_KIND = "wids-shard-index-v1"


class TarShardsDataset:
    """``.tar`` shards matching ``pattern`` (a glob, or a folder: its ``*.tar``); see the module docstring.

    Args:
        pattern: a glob of ``.tar`` files, or a folder.
        shuffle_buffer: with a loader's ``shuffle=True``, each shard's samples pass through a buffer of this many,
            seeded from (seed, epoch, shard) only (:func:`ferry.common.shardplan.shuffled`); 0: file order.
        mode, resize, crop: how image members are decoded, as image-folder's options (:mod:`.decoding`).

    Raises:
        FileNotFoundError: no file matches ``pattern``.
        DatasetError: an option out of range.
    """

    def __init__(self, pattern: str, shuffle_buffer: int = 0, mode: str | None = None, resize: Any = None,
                 crop: Any = None) -> None:
        if not isinstance(shuffle_buffer, int) or isinstance(shuffle_buffer, bool) or shuffle_buffer < 0:
            raise DatasetError(f"tar-shards: shuffle_buffer must be an int >= 0 (samples), got {shuffle_buffer!r}")
        self.shuffle_buffer = shuffle_buffer
        self.decoding = ImageDecoding.of(mode, resize, crop)
        pattern = os.path.abspath(os.path.expanduser(os.fspath(pattern)))
        if os.path.isdir(pattern):
            pattern = os.path.join(pattern, "*.tar")
        paths = sorted(p for p in globbing.glob(pattern) if os.path.isfile(p))
        if not paths:
            raise FileNotFoundError(f"tar-shards: no file matches {pattern!r}")
        self.pattern = pattern
        base = os.path.commonpath([os.path.dirname(p) for p in paths])
        self._paths = {os.path.relpath(p, base): p for p in paths}
        sizes = {name: os.path.getsize(path) for name, path in self._paths.items()}
        self._lengths = {name: count for name, (count, size) in read_shard_index(base).items()
                         if sizes.get(name) == size}  # an entry for a file since rewritten is not trusted
        digest = hashlib.sha256("".join(f"{name}:{size}\n" for name, size in sizes.items()).encode())
        options = ",".join(filter(None, [f"buffer={shuffle_buffer}" if shuffle_buffer else "",
                                         self.decoding.describe()]))
        self.fingerprint = f"tar-shards:{len(paths)}:{digest.hexdigest()[:16]}" + (f":{options}" if options else "")

    def shards(self) -> list[str]:
        return list(self._paths)

    def shard_len(self, name: str) -> int:
        """Samples in shard ``name``: from the shard index when it lists the file at its size, else counted from
        the tar's headers (member data is skipped)."""
        if name not in self._lengths:
            path = self._path(name)
            _check_complete(path)
            with tarfile.open(path, "r:") as tar:
                self._lengths[name] = len({_key(m.name) for m in tar if m.isfile()})
        return self._lengths[name]

    def iter_shard(self, name: str) -> Iterator[Any]:
        path = self._path(name)
        _check_complete(path)
        with tarfile.open(path, "r|") as tar:  # a stream: one pass, no seeking
            key, members = None, {}
            for member in tar:
                if not member.isfile():
                    continue
                this = _key(member.name)
                if this != key and members:
                    yield _sample(members, key, path, self.decoding)
                    members = {}
                key = this
                extension = member.name[len(this):]
                handle = tar.extractfile(member)
                members[extension] = handle.read() if handle is not None else b""
            if members:
                yield _sample(members, key, path, self.decoding)

    def _path(self, name: str) -> str:
        try:
            return self._paths[name]
        except KeyError:
            raise DatasetError(f"tar-shards: no shard named {name!r} (this producer sees {len(self._paths)} shards "
                               f"matching {self.pattern!r})") from None


def read_shard_index(folder: str) -> dict[str, tuple[int, int]]:
    """``{shard name: (samples, file size)}`` from ``folder``'s :data:`SHARD_INDEX`; empty without one (or with
    one that is not a wids shard index: it is then ignored, and the shards counted)."""
    try:
        with open(os.path.join(folder, SHARD_INDEX)) as f:
            index = json.load(f)
        return {str(e["url"]): (int(e["nsamples"]), int(e["filesize"])) for e in index["shardlist"]
                if index.get("__kind__") == INDEX_KIND}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _check_complete(path: str) -> None:
    """Raises SampleLoadError where the tar at ``path`` lacks the end every tar writer gives it (two zero blocks of
    512 bytes, then zeros to a whole record): it was cut short, by a copy or a write that did not finish. Python's
    tarfile would read such a file as a shorter shard without a word, its last sample perhaps missing members."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(max(0, size - _END_BYTES))
        tail = f.read(_END_BYTES)
    if size < _END_BYTES or size % tarfile.BLOCKSIZE or tail.count(0) != _END_BYTES:
        raise SampleLoadError(f"tar-shards: {path} is cut short ({size} bytes, not ending with a tar's two zero "
                              f"blocks): a copy or a write that did not finish; write or copy it again")


#: A tar's end-of-archive: two zero blocks.
_END_BYTES = 2 * tarfile.BLOCKSIZE


def _key(member_name: str) -> str:
    folder, base = os.path.split(member_name)
    return os.path.join(folder, base.split(".", 1)[0])


def _sample(members: dict[str, bytes], key: Any, path: str, decoding: ImageDecoding) -> Any:
    try:
        values = {extension.lstrip("."): decode_member(extension, data, decoding)
                  for extension, data in members.items()}
    except Exception as exc:
        raise SampleLoadError(f"cannot decode sample {key!r} of {path}: {type(exc).__name__}: {exc}") from exc
    if len(values) == 2 and "cls" in values:
        (data,) = [v for k, v in values.items() if k != "cls"]
        if isinstance(data, np.ndarray):
            return data, values["cls"]
    if len(values) == 1:
        return next(iter(values.values()))
    return dict(sorted(values.items()))


def decode_member(extension: str, data: bytes, decoding: ImageDecoding = ImageDecoding()) -> Any:
    """A member's value, by its last extension (see the module docstring); images as ``decoding`` says."""
    last = "." + extension.rsplit(".", 1)[-1].lower()
    if last == ".npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    if last == ".cls":
        return int(data.decode().strip())
    if last in IMAGE_EXTENSIONS:
        return decoding.read(data, last)
    return data


def pack_tar(dataset: Any, out: str, **options: Any) -> list[str]:
    """Write ``dataset`` as ``.tar`` shards: :func:`ferry.common.datasets.tarpack.pack_tar`."""
    from ferry.common.datasets.tarpack import pack_tar as write

    return write(dataset, out, **options)

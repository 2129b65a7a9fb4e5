"""Packed shards: fixed-size records in a few large files, so that one sample is one contiguous read.

Layout of a packed folder (``ferry pack`` writes it)::

    index.json          {"format": "ferry-packed", "version": 1, "dtype": "<f4", "shape": [13, 299, 299],
                         "record_bytes": ..., "classes": [...], "shards": [{"file": ..., "count": ...}], ...}
    labels.npy          int64 label of every sample, in order
    shard-00000.bin     records 0 .. count-1, back to back, no headers

The ``packed`` dataset reads a sample with one ``pread`` (``os.preadv`` straight into the batch row on
the fast path), so there is no per-file open, no header parse and no allocation.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

import numpy as np

from ferry.common.constants import DEFAULT_SHARD_BYTES
from ferry.common.errors import DatasetError

__all__ = ["PackedDataset", "pack"]

INDEX = "index.json"
FORMAT = "ferry-packed"


class PackedDataset:
    """Samples of a packed folder: ``(array, label)``, as npy-folder gives them."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.fspath(root))
        path = os.path.join(self.root, INDEX)
        try:
            with open(path) as f:
                index = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.root!r} is not a packed dataset (no {INDEX}; make one with ferry pack)")
        if index.get("format") != FORMAT or index.get("version") != 1:
            raise DatasetError(f"{path}: not a version-1 {FORMAT} index")
        self.dtype = np.dtype(index["dtype"])
        self.shape = tuple(index["shape"])
        self.record_bytes = int(index["record_bytes"])
        if self.record_bytes != self.dtype.itemsize * int(np.prod(self.shape)):
            raise DatasetError(f"{path}: record_bytes does not match dtype and shape")
        self.classes = list(index.get("classes", []))
        self.labels = np.load(os.path.join(self.root, "labels.npy"), allow_pickle=False)
        self.shards = [(os.path.join(self.root, s["file"]), int(s["count"])) for s in index["shards"]]
        self.starts = np.cumsum([0] + [count for _, count in self.shards])
        if self.starts[-1] != len(self.labels):
            raise DatasetError(f"{path}: shards hold {self.starts[-1]} records, labels.npy {len(self.labels)}")
        self.fingerprint = f"packed:{len(self.labels)}:{index.get('source_fingerprint', '')}"
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.labels)

    def _locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < len(self.labels):
            raise IndexError(f"index {index} out of range for {len(self.labels)} samples")
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        if os.getpid() != self._pid:  # opened in a parent process: open our own
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds[shard] = os.open(self.shards[shard][0], os.O_RDONLY)
        return fd, (index - int(self.starts[shard])) * self.record_bytes

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        out = np.empty(self.shape, self.dtype)
        return out, self.read_into(index, out)

    def array_layout(self) -> tuple[tuple[int, ...], np.dtype]:
        return self.shape, self.dtype

    def read_into(self, index: int, out: np.ndarray) -> int:
        fd, offset = self._locate(index)
        view = memoryview(out.reshape(-1).view(np.uint8))
        done = 0
        while done < self.record_bytes:
            n = os.preadv(fd, [view[done:]], offset + done)
            if n <= 0:
                raise OSError(f"{self.shards[0][0]}: short read of sample {index} at byte {offset + done}")
            done += n
        return int(self.labels[index])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fds"] = {}
        return state

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass


def pack(dataset: Any, out: str, *, shard_bytes: int = DEFAULT_SHARD_BYTES, classes: Iterable[str] = (),
         progress: Any = None) -> dict[str, Any]:
    """Write ``dataset`` (samples ``(array, label)`` of one shape and dtype) as a packed folder; ``progress(done,
    total, bytes_written)`` is called after every sample.

    Raises:
        DatasetError: an empty dataset, or a sample of another shape or dtype than the first.
    """
    n = len(dataset)
    if n == 0:
        raise DatasetError("cannot pack an empty dataset")
    first, _ = dataset[0]
    first = np.ascontiguousarray(first)
    shape, dtype = first.shape, first.dtype
    record = first.nbytes
    per_shard = max(1, shard_bytes // max(1, record))
    os.makedirs(out, exist_ok=True)
    labels = np.empty(n, np.int64)
    shards = []
    handle = None
    for i in range(n):
        if i % per_shard == 0:
            if handle:
                handle.close()
            name = f"shard-{len(shards):05d}.bin"
            shards.append({"file": name, "count": 0})
            handle = open(os.path.join(out, name), "wb")
        array, label = dataset[i]
        array = np.ascontiguousarray(array)
        if array.shape != shape or array.dtype != dtype:
            handle.close()
            raise DatasetError(f"sample {i} is {array.dtype}{list(array.shape)}; packed records must all be "
                             f"{dtype}{list(shape)}")
        handle.write(memoryview(array.reshape(-1).view(np.uint8)))
        labels[i] = int(label)
        shards[-1]["count"] += 1
        if progress is not None:
            progress(i + 1, n, (i + 1) * record)
    handle.close()
    np.save(os.path.join(out, "labels.npy"), labels)
    index = {"format": FORMAT, "version": 1, "dtype": dtype.str, "shape": list(shape), "record_bytes": record,
             "classes": list(classes), "shards": shards,
             "source_fingerprint": str(getattr(dataset, "fingerprint", ""))}
    with open(os.path.join(out, INDEX), "w") as f:
        json.dump(index, f, indent=1)
    return index

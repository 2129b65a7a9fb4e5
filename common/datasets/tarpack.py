"""Writing a map-style dataset as ``tar-shards`` (``ferry pack --format tar``): WebDataset ``.tar`` shards and
their shard index.

Shards are ``shard-00000.tar`` … of ``shard_samples`` samples each. Sample ``i`` is stored under the key ``i``
(zero-padded): ``<i>.npy`` for an array, or, where the dataset gives it (:meth:`encoded`, as ``image-folder``
does), the file as it is, ``<i>.png`` / ``<i>.jpg`` …: encoded images stay encoded (WebDataset's convention)
and producers decode them. A label is ``<i>.cls``.

* **Order.** In the dataset's order, or with ``shuffle=SEED`` in a random order drawn from ``SEED``. A shuffle
  buffer mixes samples within a shard only, so shards written from a class-sorted source (npy-folder,
  image-folder) give batches of one or two classes whatever the buffer: shuffle them here. The result says
  whether the labels came out sorted.
* **Index.** :data:`~ferry.common.datasets.tarshards.SHARD_INDEX` beside the shards lists each one's sample
  count and file size, so that ``shard_len`` (and with it ``len(loader)``) costs no pass over the tars.
* **Progress.** ``progress(done, total, bytes_written)`` after every sample; the caller decides what to show.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from typing import Any, Callable

import numpy as np

from ferry.common.datasets.tarshards import INDEX_KIND, SHARD_INDEX
from ferry.common.errors import DatasetError

__all__ = ["pack_tar", "ShardNames"]


class ShardNames(list):
    """The shard file names written, in order (a list); ``sorted_by_label``: every label was at least the one
    before it, over more than one label (a class-sorted pack)."""

    sorted_by_label: bool = False


def pack_tar(dataset: Any, out: str, *, shard_samples: int = 1000, shuffle: int | None = None,
             progress: Callable[[int, int, int], None] | None = None) -> ShardNames:
    """Write a map-style ``dataset`` as WebDataset ``.tar`` shards in ``out``; see the module docstring.

    Samples must be ``(array, label)`` or bare arrays (numpy arrays or CPU tensors), unless the dataset has
    ``encoded(i) -> (extension, bytes, label)``. Should a sample fail, the shards this call wrote are removed.

    Raises:
        DatasetError: an empty dataset, ``shard_samples`` < 1, or a sample of another kind.
    """
    n = len(dataset)
    if n == 0:
        raise DatasetError("cannot pack an empty dataset")
    if shard_samples < 1:
        raise DatasetError(f"shard_samples must be at least 1, got {shard_samples}")
    order = np.random.default_rng(shuffle).permutation(n) if shuffle is not None else range(n)
    os.makedirs(out, exist_ok=True)
    digits = max(6, len(str(n - 1)))
    encoded = getattr(dataset, "encoded", None)
    names, counts, written, labels = ShardNames(), [], 0, []
    tar = None
    try:
        for done, i in enumerate(order):
            i = int(i)
            if done % shard_samples == 0:
                if tar is not None:
                    tar.close()
                names.append(f"shard-{len(names):05d}.tar")
                counts.append(0)
                tar = tarfile.open(os.path.join(out, names[-1]), "w", format=tarfile.USTAR_FORMAT)
            extension, data, label = encoded(i) if callable(encoded) else _as_npy(dataset[i], i)
            written += _add(tar, f"{i:0{digits}d}{extension}", data)
            if label is not None:
                written += _add(tar, f"{i:0{digits}d}.cls", str(int(label)).encode())
                labels.append(int(label))
            counts[-1] += 1
            if progress is not None:
                progress(done + 1, n, written)
    except BaseException:
        if tar is not None:
            tar.close()
            tar = None
        for name in names:  # no partial pack is left to be taken for a whole one
            try:
                os.unlink(os.path.join(out, name))
            except OSError:
                pass
        raise
    finally:
        if tar is not None:
            tar.close()
    _write_index(out, names, counts)
    names.sorted_by_label = len(set(labels)) > 1 and bool(np.all(np.diff(labels) >= 0))
    return names


def _as_npy(sample: Any, index: int) -> tuple[str, bytes, int | None]:
    array, label = sample if isinstance(sample, tuple) and len(sample) == 2 else (sample, None)
    if type(array).__module__.startswith("torch") and callable(getattr(array, "numpy", None)):
        array = array.detach().cpu().numpy()  # a tensor, as the packed format takes it
    if not isinstance(array, np.ndarray) or (label is not None and not isinstance(label, (int, np.integer))):
        kind = (f"a tuple of ({', '.join(type(x).__name__ for x in sample)})" if isinstance(sample, tuple)
                else type(sample).__name__)
        raise DatasetError(f"sample {index} is {kind}; tar packing takes (array, int label) or array samples, an "
                           f"array being a numpy array or a tensor")
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return ".npy", buffer.getvalue(), label


def _add(tar: Any, name: str, data: bytes) -> int:
    """Add a member; returns the bytes it takes in the tar (header and padding included)."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
    return tarfile.BLOCKSIZE + -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _write_index(out: str, names: list[str], counts: list[int]) -> None:
    shardlist = [{"url": name, "nsamples": count, "filesize": os.path.getsize(os.path.join(out, name))}
                 for name, count in zip(names, counts)]
    with open(os.path.join(out, SHARD_INDEX), "w") as f:
        json.dump({"__kind__": INDEX_KIND, "wids_version": 1, "shardlist": shardlist}, f, indent=1)

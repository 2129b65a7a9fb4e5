"""The epoch plan of a *sharded* (streaming) dataset: which shards, in which order, batched how.

A sharded dataset is a stream of shards instead of a map (docs/ARCHITECTURE.md#streaming-sources)::

    class MyShards:
        def shards(self) -> list[str]: ...                 # stable names, the same on every producer
        def iter_shard(self, name: str) -> Iterator[sample]: ...
        def shard_len(self, name: str) -> int: ...         # optional: makes len(loader) known
        shuffle_buffer = 1000                              # optional: shuffle within each shard

The epoch's plan is over shard *positions*: this rank's shards, permuted by ``(seed, epoch)`` when
shuffled and split across ranks exactly as ``DistributedSampler`` splits indices (so with padding, a rank may
see a shard twice). A task is batch ``k`` of the shard at position ``p``; its ``seq`` is
``p * SHARD_STRIDE + k``. Batches never cross shards; a shard's last batch may be short (``drop_last`` drops
it). How many batches a shard has is discovered by reading it: the answer to ``(p, k)`` may say "end of
shard". So the sequence of batches depends only on the dataset, seed, epoch, rank, world size, batch size
and drop_last.

With ``shuffle`` and a dataset attribute ``shuffle_buffer = N`` (an int, default 0: none), each shard's
samples also pass through a shuffle buffer of N samples seeded from ``(seed, epoch, shard index)`` only
(:func:`shuffled`), so the order within a shard is as reproducible as the shard order.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ferry.common.constants import MAX_ANNOUNCED_SHARDS
from ferry.common.errors import ConfigError, ConfigTypeError
from ferry.common.plan import distributed_indices

__all__ = ["SHARD_STRIDE", "shuffle_buffer", "shuffled", "is_sharded", "check_sharded", "looks_streaming",
           "is_torch_iterable", "shard_names",
           "shard_fingerprint", "announced_shard_lengths", "ShardPlan", "build_shard_plan", "encode_seq", "decode_seq"]

#: seq = position * SHARD_STRIDE + batch: room for 2**32 batches per shard and 2**30 shard positions.
SHARD_STRIDE = 1 << 32

_CONTRACT = "shards() -> list[str] and iter_shard(name) -> iterator of samples"


def is_sharded(dataset: Any) -> bool:
    """Whether ``dataset`` follows the sharded contract (both methods callable)."""
    return callable(getattr(dataset, "shards", None)) and callable(getattr(dataset, "iter_shard", None))


def check_sharded(dataset: Any) -> None:
    """Raise a clear error for a streaming dataset that has half of the sharded contract. (One with neither
    method is an iterable dataset: :mod:`ferry.common.streamplan`.)

    Raises:
        ConfigTypeError: a streaming dataset with one of ``shards`` and ``iter_shard`` but not both callable.
    """
    if is_sharded(dataset):
        return
    missing = [m for m in ("shards", "iter_shard") if not callable(getattr(dataset, m, None))]
    raise ConfigTypeError(
        f"{type(dataset).__name__} is a streaming dataset without {' and '.join(missing)}: a sharded dataset must "
        f"define {_CONTRACT} (docs/datasets.md, 'Sharded sources'); one that defines neither is iterated as an "
        f"IterableDataset")


def looks_streaming(dataset: Any) -> bool:
    """An iterable dataset (torch's ``IterableDataset``, or ``__iter__`` without ``__getitem__``)."""
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__") and not is_torch_iterable(dataset):
        return False
    return is_torch_iterable(dataset) or hasattr(dataset, "__iter__") or is_sharded(dataset)


def is_torch_iterable(dataset: Any) -> bool:
    """An instance of torch's ``IterableDataset`` (told by its class's bases, without importing torch)."""
    return any(c.__name__ == "IterableDataset" and c.__module__.startswith("torch.") for c in type(dataset).__mro__)


def shard_names(dataset: Any) -> list[str]:
    """``dataset.shards()``, checked: a non-empty list of distinct strings."""
    names = list(dataset.shards())
    if not names:
        raise ConfigError(f"{type(dataset).__name__}.shards() returned no shard")
    if not all(isinstance(n, str) for n in names):
        raise ConfigTypeError(f"{type(dataset).__name__}.shards() must return strings, got {names[:3]!r}…")
    if len(set(names)) != len(names):
        raise ConfigError(f"{type(dataset).__name__}.shards() returned duplicate names")
    return names


def announced_shard_lengths(dataset: Any) -> list[int] | None:
    """:func:`shard_lengths` for a producer's HELLO: None as well where the dataset has more than
    MAX_ANNOUNCED_SHARDS shards."""
    if not callable(getattr(dataset, "shard_len", None)):
        return None
    names = shard_names(dataset)
    return shard_lengths(dataset, names) if len(names) <= MAX_ANNOUNCED_SHARDS else None


def shard_lengths(dataset: Any, names: list[str] | None = None) -> list[int] | None:
    """Each shard's ``shard_len``, in ``shards()`` order (``names``, where the caller has them already); None where
    the dataset has no ``shard_len`` or one of its shards cannot be counted (logged, naming the shard: the loader's
    ``len()`` is then not known, and the shard's own error comes when it is read, as DataLoader's would).

    Raises:
        ConfigTypeError: a ``shard_len`` that returns something other than an int >= 0.
    """
    if not callable(getattr(dataset, "shard_len", None)):
        return None
    lengths = []
    for name in shard_names(dataset) if names is None else names:
        try:
            n = dataset.shard_len(name)
        except Exception as exc:  # a user's dataset: any error; it must stop neither a producer nor the trainer
            logging.getLogger(__name__).warning("cannot count shard %r (%s: %s): len(loader) will not be "
                                                 "known", name, type(exc).__name__, exc)
            return None
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise ConfigTypeError(f"{type(dataset).__name__}.shard_len({name!r}) must return an int >= 0, got {n!r}")
        lengths.append(int(n))
    return lengths


def shard_fingerprint(dataset: Any, names: list[str]) -> str:
    """Class, a digest of the shard names and the shuffle buffer: producers that differ are rejected."""
    cls = type(dataset)
    module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    buffer = shuffle_buffer(dataset)
    return f"{module}.{cls.__qualname__}:shards={len(names)}:{digest}" + (f":buffer={buffer}" if buffer else "")


def shuffle_buffer(dataset: Any) -> int:
    """The dataset's ``shuffle_buffer`` (samples; 0: none).

    Raises:
        ConfigTypeError: not an int >= 0.
    """
    value = getattr(dataset, "shuffle_buffer", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigTypeError(f"{type(dataset).__name__}.shuffle_buffer must be an int >= 0, got {value!r}")
    return value


def shuffled(samples: Iterator[Any], size: int, *, seed: int, epoch: int, shard: int) -> Iterator[Any]:
    """``samples`` through a shuffle buffer of ``size``, drawn from a generator seeded with (seed, epoch,
    shard) only: the same order on every producer, and after a re-issue."""
    rng = np.random.default_rng([seed, epoch, shard])
    buffer: list[Any] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        i = int(rng.integers(size))
        buffer[i], sample = sample, buffer[i]
        yield sample
    for i in rng.permutation(len(buffer)):
        yield buffer[int(i)]


def encode_seq(position: int, batch: int) -> int:
    return position * SHARD_STRIDE + batch


def decode_seq(seq: int) -> tuple[int, int]:
    return divmod(seq, SHARD_STRIDE)


@dataclass(frozen=True)
class ShardPlan:
    """One epoch of a sharded dataset on one rank: ``order[p]`` is the index (into ``shards()``) of the shard
    at position ``p``. ``lengths`` (samples per position) when the dataset gives ``shard_len``."""

    epoch: int
    order: tuple[int, ...]
    batch_size: int
    drop_last: bool
    lengths: tuple[int, ...] | None = None
    shuffle: bool = False  # shuffle within shards too, where the dataset has a shuffle_buffer

    def __len__(self) -> int:
        """Batches in the epoch, when the shard lengths are known.

        Raises:
            TypeError: the dataset gives no ``shard_len`` (as ``len()`` of a DataLoader over an IterableDataset).
        """
        if self.lengths is None:
            raise TypeError("len() of a sharded dataset's loader needs the shard lengths: define "
                            "shard_len(name) -> int on the dataset")
        per = (lambda n: n // self.batch_size) if self.drop_last else (lambda n: math.ceil(n / self.batch_size))
        return sum(per(n) for n in self.lengths)

    @property
    def positions(self) -> int:
        return len(self.order)

    def batch(self, seq: int) -> list[int]:
        """What a TASK's ``indices`` carry for ``seq``: the one shard index (producers check its range)."""
        return [self.order[decode_seq(seq)[0]]]

    def task_fields(self, seq: int) -> dict[str, Any]:
        """The TASK's ``shard`` field: ``[batch k, batch_size, drop_last, shuffle]``."""
        return {"shard": [decode_seq(seq)[1], self.batch_size, int(self.drop_last), int(self.shuffle)]}


def build_shard_plan(*, epoch: int, shard_count: int, batch_size: int, shuffle: bool, seed: int, drop_last: bool,
                     rank: int, world_size: int, lengths: list[int] | None = None) -> ShardPlan:
    """Shard positions as DistributedSampler would give the indices ``0..shard_count-1`` to ``rank``."""
    if batch_size is None:
        raise ConfigError("a sharded dataset needs a batch_size")
    order = distributed_indices(shard_count, epoch=epoch, rank=rank, world_size=world_size, shuffle=shuffle,
                                seed=seed, drop_last=drop_last)
    order = tuple(int(i) for i in np.asarray(order))
    per_position = tuple(int(lengths[i]) for i in order) if lengths is not None else None
    return ShardPlan(epoch, order, batch_size, drop_last, per_position, shuffle)

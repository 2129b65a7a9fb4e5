"""The epoch plan of an *iterable* dataset (a torch ``IterableDataset`` without ``shards()``/``iter_shard()``):
N streams, each one copy of the dataset iterated as DataLoader's worker ``w`` of ``N`` iterates it, batched per
stream and interleaved in DataLoader's order (docs/ARCHITECTURE.md#iterable-datasets).

* **Streams.** Stream ``w`` is ``iter(dataset)`` run while ``torch.utils.data.get_worker_info()`` reports
  ``id=w, num_workers=N``: a dataset that shards itself with ``get_worker_info()`` yields the same samples in
  stream ``w`` as in DataLoader's worker ``w``. N is the loader's ``iterable_streams`` (by default its
  ``local_producers``, else 1).
* **Batches.** Batch ``k`` of stream ``w`` is that stream's samples ``k * B .. (k + 1) * B - 1``; its ``seq`` is
  ``w * SHARD_STRIDE + k`` (:func:`~ferry.common.shardplan.encode_seq`). A stream's last batch may be short, and
  ``drop_last`` drops it, as each DataLoader worker batches its own stream. How many batches a stream has is
  discovered by reading it, as a shard's.
* **Order.** Round robin: every stream's batch 0 in stream order, then every stream's batch 1, …, a stream that
  ended left out: the order in which DataLoader hands on its workers' batches.
* **Length.** ``len(loader)`` follows DataLoader: ``len(dataset)`` batched (``ceil``, or ``floor`` with
  ``drop_last``), TypeError without ``len(dataset)``.

A TASK for batch ``k`` of stream ``w`` carries ``indices == [w]``, ``shard == [k, batch_size, drop_last, 0]`` and
``streams == N``; its answer is counted (``count``/``last``) as a shard's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ferry.common.constants import MAX_STREAMS
from ferry.common.errors import ConfigError, ConfigTypeError
from ferry.common.shardplan import decode_seq, is_sharded, is_torch_iterable

__all__ = ["MAX_STREAMS", "AUTOSCALED", "is_iterable", "check_iterable", "check_iterable_options", "iterable_len",
           "iterable_fields", "StreamPlan"]


def is_iterable(dataset: Any) -> bool:
    """An iterable dataset planned over streams: torch's ``IterableDataset``, or an object with ``__iter__`` and
    no ``__getitem__``, that names neither ``shards`` nor ``iter_shard`` (those follow the sharded contract)."""
    if is_sharded(dataset) or hasattr(dataset, "shards") or hasattr(dataset, "iter_shard"):
        return False
    cls = type(dataset)  # special methods are looked up on the class; None there says "not supported"
    iterates, maps = getattr(cls, "__iter__", None) is not None, getattr(cls, "__getitem__", None) is not None
    return is_torch_iterable(dataset) or (iterates and not maps)


#: Why ``local_producers="auto"`` does not serve an iterable dataset.
AUTOSCALED = ('local_producers="auto" changes the number of producers, and an IterableDataset is split into a '
              "fixed number of streams, each read by the producer of its own worker id (DataLoader's num_workers): "
              "give local_producers=N")


def check_iterable(dataset: Any) -> None:
    """Raise a clear error for an iterable that cannot be iterated once per stream and epoch.

    Raises:
        ConfigTypeError: ``dataset`` is an iterator (``__next__``): one pass consumes it.
    """
    if hasattr(dataset, "__next__"):
        raise ConfigTypeError(f"{type(dataset).__name__} is an iterator: one pass consumes it, and Ferry iterates "
                              "the dataset once per stream and epoch. Give an IterableDataset whose __iter__ "
                              "starts a new pass")


def check_iterable_options(*, shuffle: bool, sampler: Any, batch_sampler: Any) -> None:
    """An iterable dataset yields its samples in its own order, as DataLoader rules.

    Raises:
        ConfigError: ``shuffle=True``, a ``sampler`` or a ``batch_sampler`` (a ValueError, naming the option).
    """
    for name, value in (("shuffle", True if shuffle else None), ("sampler", sampler),
                        ("batch_sampler", batch_sampler)):
        if value is not None:
            raise ConfigError(f"an IterableDataset yields its samples in its own order: expected no {name}, got "
                              f"{name}={value!r} (DataLoader refuses it too). Shuffle inside the dataset")


def iterable_len(dataset: Any) -> int | None:
    """``len(dataset)``, or None where it has none (DataLoader's ``len()`` then raises TypeError).

    Raises:
        ConfigTypeError: ``__len__`` returned something other than an int >= 0.
    """
    try:
        n = len(dataset)
    except TypeError:  # no __len__, or a ChainDataset of datasets without one
        return None
    if n < 0:
        raise ConfigTypeError(f"len() of {type(dataset).__name__} must be >= 0, got {n}")
    return int(n)


def iterable_fields(dataset: Any) -> dict[str, Any]:
    """What a producer's HELLO adds to its ``dataset`` for an iterable dataset: ``iterable``, and ``sized`` (its
    ``len`` is then ``len(dataset)``; unsized, ``len`` is 0)."""
    return {"iterable": True, "sized": iterable_len(dataset) is not None}


@dataclass(frozen=True)
class StreamPlan:
    """One epoch of an iterable dataset: ``streams`` streams batched by ``batch_size``; ``length`` is
    ``len(dataset)`` where known (for ``len()`` only: batches are discovered). ``unbatched`` (DataLoader's
    ``batch_size=None``): each task is one sample, not collated (``batch_size`` is then 1)."""

    epoch: int
    streams: int
    batch_size: int
    drop_last: bool
    length: int | None = None
    unbatched: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.streams <= MAX_STREAMS:
            raise ConfigError(f"iterable_streams must be in 1..{MAX_STREAMS}, got {self.streams}")
        if self.batch_size is None:
            raise ConfigError("an iterable dataset needs a batch_size")

    def __len__(self) -> int:
        """DataLoader's ``len()`` of an IterableDataset: ``len(dataset)`` in batches.

        Raises:
            TypeError: the dataset has no ``len()``.
        """
        if self.length is None:
            raise TypeError("len() of a loader over an IterableDataset needs len(dataset): the dataset defines no "
                            "__len__")
        return self.length // self.batch_size if self.drop_last else math.ceil(self.length / self.batch_size)

    def batch(self, seq: int) -> list[int]:
        """What a TASK's ``indices`` carry for ``seq``: the stream."""
        return [decode_seq(seq)[0]]

    def task_fields(self, seq: int) -> dict[str, Any]:
        """The TASK's ``shard`` (``[batch k, batch_size, drop_last, 0]``) and ``streams`` (N) fields, and
        ``unbatched`` ("index": the stream's sample ``k`` as it is) for an unbatched plan."""
        return {"shard": [decode_seq(seq)[1], self.batch_size, int(self.drop_last), 0], "streams": self.streams,
                **({"unbatched": "index"} if self.unbatched else {})}

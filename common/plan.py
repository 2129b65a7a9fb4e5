"""The epoch plan (docs/ARCHITECTURE.md#epoch-plan): which sample indices make up batch ``seq`` of epoch ``e`` on rank ``r``.

The consumer owns the plan; producers only see index lists. The default plan reproduces, batch for batch,
``DataLoader(ds, batch_size=B, drop_last=D, sampler=DistributedSampler(ds, num_replicas=W, rank=r,
shuffle=S, seed=seed, drop_last=D))`` after ``sampler.set_epoch(e)``, whatever the number of producers.
A user ``sampler`` (batched with ``batch_size`` / ``drop_last``) or ``batch_sampler`` replaces it.

torch is imported only when a shuffled plan is built: the permutation must be torch's own ``randperm``
to match DistributedSampler bit for bit. Producers never build plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from ferry.common.errors import ConfigError

__all__ = ["EpochPlan", "distributed_indices", "build_plan", "plan_length"]


@dataclass(frozen=True)
class EpochPlan:
    """The batches of one epoch on one rank: ``batch(seq)`` is a list of sample indices."""

    epoch: int
    _flat: np.ndarray  # all indices of the epoch, concatenated
    _starts: np.ndarray  # batch k is _flat[_starts[k]:_starts[k + 1]]

    def __len__(self) -> int:
        return len(self._starts) - 1

    def batch(self, seq: int) -> list[int]:
        return self._flat[self._starts[seq] : self._starts[seq + 1]].tolist()

    @classmethod
    def from_batches(cls, epoch: int, batches: Iterable[Sequence[int]]) -> "EpochPlan":
        lists = [list(map(int, b)) for b in batches]
        sizes = np.fromiter((len(b) for b in lists), dtype=np.int64, count=len(lists))
        if (sizes == 0).any():
            raise ConfigError("the batch sampler yielded an empty batch")
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = np.fromiter((i for b in lists for i in b), dtype=np.int64, count=int(starts[-1]))
        return cls(epoch, flat, starts)

    @classmethod
    def from_indices(cls, epoch: int, indices: np.ndarray, batch_size: int, drop_last: bool) -> "EpochPlan":
        n = len(indices)
        count = n // batch_size if drop_last else math.ceil(n / batch_size)
        starts = np.minimum(np.arange(count + 1, dtype=np.int64) * batch_size, n)
        return cls(epoch, np.asarray(indices, dtype=np.int64), starts)


def distributed_indices(
    dataset_len: int, *, epoch: int, rank: int, world_size: int, shuffle: bool, seed: int, drop_last: bool
) -> np.ndarray:
    """The indices ``DistributedSampler`` yields, same arithmetic, same permutation."""
    if drop_last and dataset_len % world_size != 0:
        num_samples = math.ceil((dataset_len - world_size) / world_size)
    else:
        num_samples = math.ceil(dataset_len / world_size)
    total_size = num_samples * world_size
    if shuffle:
        import torch

        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        indices = torch.randperm(dataset_len, generator=generator).numpy().astype(np.int64)
    else:
        indices = np.arange(dataset_len, dtype=np.int64)
    if not drop_last:
        padding = total_size - len(indices)
        if padding > 0 and len(indices) > 0:
            indices = np.concatenate([indices, np.resize(indices, padding)])
    else:
        indices = indices[:total_size]
    return indices[rank:total_size:world_size]


def plan_length(dataset_len: int, *, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Number of batches per epoch of the default plan (what ``len(loader)`` says)."""
    if drop_last and dataset_len % world_size != 0:
        num_samples = math.ceil((dataset_len - world_size) / world_size)
    else:
        num_samples = math.ceil(dataset_len / world_size)
    return num_samples // batch_size if drop_last else math.ceil(num_samples / batch_size)


def build_plan(
    *,
    epoch: int,
    dataset_len: int | None,
    batch_size: int | None,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    rank: int,
    world_size: int,
    sampler: Any = None,
    batch_sampler: Any = None,
) -> EpochPlan:
    """Build epoch ``epoch``'s plan. A user sampler gets ``set_epoch(epoch)`` first, if it has one."""
    if batch_sampler is not None:
        _set_epoch(batch_sampler, epoch)
        _set_epoch(getattr(batch_sampler, "sampler", None), epoch)
        return EpochPlan.from_batches(epoch, batch_sampler)
    assert batch_size is not None
    if sampler is not None:
        _set_epoch(sampler, epoch)
        indices = np.fromiter((int(i) for i in sampler), dtype=np.int64)
        return EpochPlan.from_indices(epoch, indices, batch_size, drop_last)
    if dataset_len is None:
        raise ConfigError("the dataset length is not known yet")
    indices = distributed_indices(
        dataset_len, epoch=epoch, rank=rank, world_size=world_size, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    return EpochPlan.from_indices(epoch, indices, batch_size, drop_last)


def _set_epoch(obj: Any, epoch: int) -> None:
    set_epoch = getattr(obj, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)

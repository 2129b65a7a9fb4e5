"""The epoch plan (docs/ARCHITECTURE.md#epoch-plan): which sample indices make up batch ``seq`` of epoch ``e`` on rank ``r``.

The consumer owns the plan; producers only see index lists. The default plan reproduces, batch for batch,
``DataLoader(ds, batch_size=B, drop_last=D, sampler=DistributedSampler(ds, num_replicas=W, rank=r,
shuffle=S, seed=seed, drop_last=D))`` after ``sampler.set_epoch(e)``, whatever the number of producers.
A user ``sampler`` (batched with ``batch_size`` / ``drop_last``) or ``batch_sampler`` replaces it. Unbatched
(``batch_size=None``), each index (or each list of indices a sampler yields) is a task of its own. With a
``generator`` the shuffled permutation is instead the one ``DataLoader(shuffle=True, generator=g)`` draws in that
epoch (:class:`GeneratorOrder`), split across ranks as DistributedSampler splits its own.

torch is imported only when a shuffled plan is built: the permutation must be torch's own ``randperm``
to match DistributedSampler bit for bit. Producers never build plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from ferry.common.errors import ConfigError

__all__ = ["EpochPlan", "GeneratorOrder", "distributed_indices", "build_plan", "plan_length"]


@dataclass(frozen=True)
class EpochPlan:
    """The batches of one epoch on one rank: ``batch(seq)`` is a list of sample indices. An unbatched plan's
    ``unbatched`` says what each is: "index", one sample ``dataset[i]``; "list", one sample ``dataset[list]``."""

    epoch: int
    _flat: np.ndarray  # all indices of the epoch, concatenated
    _starts: np.ndarray  # batch k is _flat[_starts[k]:_starts[k + 1]]
    unbatched: str | None = None  # None: batches to collate

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

    @classmethod
    def unbatched_items(cls, epoch: int, items: Iterable[Any]) -> "EpochPlan":
        """An unbatched plan (``batch_size=None``): each item a task of its own, as DataLoader hands each item
        of its sampler to ``dataset[item]``: an index, or a list of indices (a list, tuple, or 1-d array or
        tensor), all of one kind.

        Raises:
            ConfigError: indices and lists mixed, or an empty list.
        """
        batches, kinds = [], set()
        for item in items:
            if isinstance(item, (list, tuple)) or getattr(item, "ndim", 0) == 1:
                batches.append([int(i) for i in item])
                kinds.add("list")
                if not batches[-1]:
                    raise ConfigError("with batch_size=None the sampler yielded an empty list of indices")
            else:
                batches.append([int(item)])
                kinds.add("index")
        if len(kinds) > 1:
            raise ConfigError("with batch_size=None a sampler yields indices or lists of indices, not both")
        plan = cls.from_batches(epoch, batches)
        return cls(epoch, plan._flat, plan._starts, kinds.pop() if kinds else "index")


class GeneratorOrder:
    """The permutations ``DataLoader(ds, shuffle=True, generator=g)`` draws, epoch by epoch, replayed from ``g``'s
    state when the loader was built (``state``, a copy: ``g`` itself is never drawn from here).

    Each iteration of such a DataLoader draws its workers' base seed from ``g`` (one int64, whatever
    ``num_workers``; ``_BaseDataLoaderIter``), then ``RandomSampler`` draws ``torch.randperm(n, generator=g)``, its
    order, and once its iterator runs out a second one (its tail, ``randperm(n)[:num_samples % n]``, empty here).
    Epoch ``e``'s order is therefore that of DataLoader's ``e``-th iteration (from 0) when each one before it ran
    to its end and nothing else drew from ``g`` in between, whichever way ``e`` is reached here (in turn,
    ``set_epoch``, a resume). The state at the start of each epoch replayed so far is kept (about 5 KB each), so
    epochs in turn cost two ``randperm`` each and a jump replays only the epochs never reached before.
    """

    def __init__(self, state: Any) -> None:
        self._initial = state
        self._length: int | None = None
        self._states: dict[int, Any] = {}

    def permutation(self, epoch: int, dataset_len: int) -> np.ndarray:
        """Epoch ``epoch``'s permutation of ``range(dataset_len)``."""
        import torch

        if dataset_len != self._length:  # every draw depends on the length: replay from the start
            self._length, self._states = dataset_len, {0: self._initial}
        start = max(e for e in self._states if e <= epoch)
        generator = torch.Generator()
        generator.set_state(self._states[start])
        for e in range(start, epoch + 1):
            self._states[e] = generator.get_state()
            torch.empty((), dtype=torch.int64).random_(generator=generator)  # the iteration's workers' base seed
            order = torch.randperm(dataset_len, generator=generator)
            torch.randperm(dataset_len, generator=generator)  # RandomSampler's empty tail, drawn at its end
        self._states[epoch + 1] = generator.get_state()
        return order.numpy().astype(np.int64)


def distributed_indices(
    dataset_len: int, *, epoch: int, rank: int, world_size: int, shuffle: bool, seed: int, drop_last: bool,
    order: np.ndarray | None = None,
) -> np.ndarray:
    """The indices ``DistributedSampler`` yields, same arithmetic, same permutation; with ``order`` (a shuffle's
    permutation drawn elsewhere: :class:`GeneratorOrder`) that permutation instead of its own."""
    if drop_last and dataset_len % world_size != 0:
        num_samples = math.ceil((dataset_len - world_size) / world_size)
    else:
        num_samples = math.ceil(dataset_len / world_size)
    total_size = num_samples * world_size
    if shuffle and order is not None:
        indices = np.asarray(order, dtype=np.int64)
    elif shuffle:
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
    order: np.ndarray | None = None,
    unbatched: bool = False,
) -> EpochPlan:
    """Build epoch ``epoch``'s plan. A user sampler gets ``set_epoch(epoch)`` first, if it has one. ``order``:
    the shuffle's permutation, drawn elsewhere (:class:`GeneratorOrder`); None: DistributedSampler's.
    ``unbatched`` (``batch_size`` None, no ``batch_sampler``): one sample a task, its sampler's items as given
    (:meth:`EpochPlan.unbatched_items`)."""
    if batch_sampler is not None:
        _set_epoch(batch_sampler, epoch)
        _set_epoch(getattr(batch_sampler, "sampler", None), epoch)
        return EpochPlan.from_batches(epoch, batch_sampler)
    if sampler is not None:
        _set_epoch(sampler, epoch)
        if unbatched:
            return EpochPlan.unbatched_items(epoch, sampler)
        indices = np.fromiter((int(i) for i in sampler), dtype=np.int64)
        assert batch_size is not None
        return EpochPlan.from_indices(epoch, indices, batch_size, drop_last)
    if dataset_len is None:
        raise ConfigError("the dataset length is not known yet")
    indices = distributed_indices(dataset_len, epoch=epoch, rank=rank, world_size=world_size, shuffle=shuffle,
                                  seed=seed, drop_last=drop_last, order=order)
    if unbatched:
        plan = EpochPlan.from_indices(epoch, indices, 1, False)
        return EpochPlan(epoch, plan._flat, plan._starts, "index")
    assert batch_size is not None
    return EpochPlan.from_indices(epoch, indices, batch_size, drop_last)


def _set_epoch(obj: Any, epoch: int) -> None:
    set_epoch = getattr(obj, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)

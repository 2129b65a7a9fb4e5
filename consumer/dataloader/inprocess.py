"""``ferry.DataLoader(num_workers=0)``: the pass loaded in the calling process, as DataLoader's single-process
iterator loads it. No thread, no socket, no process: ``dataset[i]`` runs on the training thread, where a debugger
stops in it.

A map-style sample is loaded under the generators a producer would seed for it (torch's CPU generator, numpy's
global one and Python's ``random``, from ``(seed, epoch, index)``: :func:`ferry.common.sampleinfo.loading`), so
its pixels are those of the same loader with any number of producers; the training process's own generator
states are put back after each batch (:func:`ferry.common.sampleinfo.kept_generators`), as a library leaves its
host's generators alone. With ``seed_per_sample=False`` nothing is seeded or put back: the samples draw from the
trainer's generators, as in DataLoader's own single process. ``ferry.sample_info()`` describes the sample while it loads, as in a producer. A dataset
with ``__getitems__`` (a batch in one call) gets it, as DataLoader's fetcher calls it, under the seeds of the
batch's first index. An iterable dataset is read as DataLoader's single process reads it (``iter(dataset)``, batches
of ``batch_size``), without per-sample seeds (docs/datasets.md#iterable-datasets).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from ferry.common.plan import EpochPlan
from ferry.common.sampleinfo import kept_generators, loading

__all__ = ["InProcessPass", "IterablePass"]


class InProcessPass:
    """One pass over ``plan`` from batch ``first``, loaded here; ``delivered`` counts the batches the loop got."""

    def __init__(self, dataset: Any, plan: EpochPlan, *, first: int, seed: int, seed_per_sample: bool,
                 collate_fn: Callable[[Any], Any], pin: bool, device: torch.device | None,
                 device_transform: Callable[[Any], Any] | None) -> None:
        self._dataset, self._plan, self._seed = dataset, plan, seed
        self._seed_globals = seed_per_sample
        self._collate, self._pin, self._device, self._transform = collate_fn, pin, device, device_transform
        self._next = first
        self.delivered = first
        self.finished = False

    def __iter__(self) -> "InProcessPass":
        return self

    def __len__(self) -> int:
        return len(self._plan) - self._next

    def __next__(self) -> Any:
        if self._next >= len(self._plan):
            self.finished = True
            raise StopIteration
        seq, self._next = self._next, self._next + 1
        batch = self._load(self._plan.batch(seq))
        self.delivered = seq + 1
        return _staged(batch, self._pin, self._device, self._transform)

    def _load(self, indices: list[int]) -> Any:
        """The batch, its samples loaded under their seeds and collated right after, as a producer does (a
        ``collate_fn`` that draws, mixup's, then draws what it draws there); the trainer's generator states are put
        back once the batch is made (once a batch: saving and restoring them costs about as much as seeding)."""
        if not self._seed_globals:
            return self._batch(indices)
        with kept_generators():
            return self._batch(indices)

    def _batch(self, indices: list[int]) -> Any:
        dataset, epoch = self._dataset, self._plan.epoch
        if self._plan.unbatched == "list":  # a sampler's list of indices, given whole to dataset[list]
            return self._collate(self._one(lambda: dataset[indices], epoch, indices[0]))
        if self._plan.unbatched == "index":
            return self._collate(self._one(lambda: dataset[indices[0]], epoch, indices[0]))
        getitems = getattr(dataset, "__getitems__", None)
        if callable(getitems):  # DataLoader's fetcher hands such a dataset the batch's indices in one call
            return self._collate(self._one(lambda: getitems(indices), epoch, indices[0]))
        return self._collate([self._one(lambda i=i: dataset[i], epoch, i) for i in indices])

    def _one(self, load: Callable[[], Any], epoch: int, index: int) -> Any:
        with loading(self._seed, epoch, index, seed_globals=self._seed_globals):
            return load()


class IterablePass:
    """One pass over an iterable dataset, read here as DataLoader's single process reads it: its items in batches of
    ``batch_size`` (the last one short unless ``drop_last``), or each item alone when ``batch_size`` is None; the
    first ``first`` batches (a resume) are read and dropped."""

    def __init__(self, dataset: Any, *, batch_size: int | None, drop_last: bool, first: int,
                 collate_fn: Callable[[Any], Any], pin: bool, device: torch.device | None,
                 device_transform: Callable[[Any], Any] | None) -> None:
        self._batches = _batches(iter(dataset), batch_size, drop_last)
        self._collate, self._pin, self._device, self._transform = collate_fn, pin, device, device_transform
        self.delivered = 0
        self.finished = False
        for _ in range(first):  # a stream resumes by being read again from its start (docs/porting.md#resume)
            if next(self._batches, None) is None:
                break
            self.delivered += 1

    def __iter__(self) -> "IterablePass":
        return self

    def __next__(self) -> Any:
        items = next(self._batches, None)
        if items is None:
            self.finished = True
            raise StopIteration
        self.delivered += 1
        return _staged(self._collate(items), self._pin, self._device, self._transform)


def _batches(items: Iterator[Any], batch_size: int | None, drop_last: bool) -> Iterator[Any]:
    if batch_size is None:
        yield from items
        return
    while True:
        batch = [item for _, item in zip(range(batch_size), items)]
        if not batch or (drop_last and len(batch) < batch_size):
            return
        yield batch


def _staged(batch: Any, pin: bool, device: torch.device | None, transform: Callable[[Any], Any] | None) -> Any:
    """The batch as the loader's staging would hand it on: pinned (``pin_memory`` with CUDA), on ``device``, through
    ``device_transform``."""
    if pin:
        from torch.utils.data._utils.pin_memory import pin_memory

        batch = pin_memory(batch)
    if device is not None and device.type != "cpu":
        from torch.utils._pytree import tree_map_only

        batch = tree_map_only(torch.Tensor, lambda t: t.to(device, non_blocking=True), batch)
    return transform(batch) if transform is not None else batch

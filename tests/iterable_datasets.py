"""Iterable datasets for tests/test_iterable_datasets.py, importable (by spec, and by spawned producers), and the
reference they are checked against: what ``torch.utils.data.DataLoader(num_workers=N)`` itself yields."""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class WorkerShards(IterableDataset):
    """The pattern of torch's IterableDataset docs: ``__iter__`` shards by ``get_worker_info()``. Worker w of N takes
    every N-th item of ``sizes`` samples starting at w, but ``extra * w`` more at its end, so the workers' streams
    have different lengths (an uneven tail, and streams that end at different rounds). Sample: ``[w, i]`` (an int64
    pair) and ``i`` as its label. ``delay`` [Unit: second] per sample."""

    def __init__(self, size: int = 40, extra: int = 3, delay: float = 0.0, sized: bool = True) -> None:
        self.size, self.extra, self.delay, self.sized = size, extra, delay, sized

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in [*range(worker, self.size, workers), *range(self.size, self.size + self.extra * worker)]:
            if self.delay:
                time.sleep(self.delay)
            yield np.array([worker, i], dtype=np.int64), i

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError(f"{type(self).__name__} has no len()")
        return self.size


class AugmentedShards(WorkerShards):
    """:class:`WorkerShards` as README tells a user to augment: each sample carries a value drawn from
    ``ferry.sample_info().seed``, and the epoch ``sample_info()`` gave its ``__iter__`` (where a stream seeds its
    own shuffle). A stream read again (a resume, a producer lost) must be read under the same values."""

    def __iter__(self):
        import ferry

        epoch = ferry.sample_info().epoch
        for sample, i in super().__iter__():
            noise = int(np.random.default_rng(ferry.sample_info().seed).integers(1 << 20))
            yield np.array([*sample, epoch, noise], dtype=np.int64), i


class RangeStream(IterableDataset):
    """torch's IterableDataset docs, example 2: ``range(start, end)``, split among the workers by
    :func:`split_range` as ``worker_init_fn`` (``producer_init=``): each worker's copy gets its own part.
    ``delay`` [Unit: second] per sample."""

    def __init__(self, start: int, end: int, delay: float = 0.0) -> None:
        self.start, self.end, self.delay = start, end, delay

    def __iter__(self):
        for i in range(self.start, self.end):
            if self.delay:
                time.sleep(self.delay)
            yield i


def split_range(worker_id: int) -> None:
    """``worker_init_fn`` of torch's docs: this worker's copy of the dataset iterates its share only."""
    info = get_worker_info()
    dataset = info.dataset
    overall_start, overall_end = dataset.start, dataset.end
    per_worker = -(-(overall_end - overall_start) // info.num_workers)
    dataset.start = overall_start + worker_id * per_worker
    dataset.end = min(dataset.start + per_worker, overall_end)


def dataloader_batches(dataset: Any, *, workers: int, batch_size: int, drop_last: bool = False,
                       worker_init_fn: Any = None) -> list[Any]:
    """What ``DataLoader(dataset, num_workers=workers)`` yields, as lists (forked workers, as local producers)."""
    with warnings.catch_warnings():  # more workers than this machine's CPUs: on purpose, as for local producers
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        loader = DataLoader(dataset, batch_size=batch_size, drop_last=drop_last, num_workers=workers,
                            worker_init_fn=worker_init_fn, multiprocessing_context="fork" if workers else None)
        return [as_lists(batch) for batch in loader]


def as_lists(batch: Any) -> Any:
    """A batch's tensors as nested lists, to compare batches with ``==``."""
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    return [as_lists(leaf) for leaf in batch]

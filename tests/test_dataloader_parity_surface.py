"""PyTorch's own DataLoader tests, adapted to Ferry (issue 18): the constructor and the loader's surface (options
refused, attributes, typing, len, list()/tuple() of a loader), unbatched mode and iterable datasets, from
``TestDataLoader`` in pytorch/pytorch ``test/test_dataloader.py``.

Each case names its original and keeps its expectation (the exception *type*; the message is Ferry's, which
names the option). Refusals start nothing, so most cases here cost no producer. docs/porting.md lists every
original case and what became of it.
"""

from __future__ import annotations

import functools
import operator
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler, ChainDataset, IterableDataset, SequentialSampler, TensorDataset, get_worker_info,
)

from ferry import RemoteLoader

from . import parity_datasets as pd
from .parity_support import BULK_START_METHODS, COMMON, WORKERS, cpus, local, xfail

DATASET = TensorDataset(torch.randn(100, 2, 3, 5, generator=torch.Generator().manual_seed(0)),
                        torch.arange(50).repeat(2))


@pytest.fixture(params=BULK_START_METHODS)
def mp_context(request) -> str:
    return request.param


def refused(error: type[BaseException], dataset: Any = DATASET, **options: Any) -> None:
    """``RemoteLoader(dataset=..., local_producers=N, **options)`` raises ``error``; a loader built by mistake is
    closed at once."""
    with pytest.raises(error):
        loader = RemoteLoader(dataset=dataset, **{"local_producers": WORKERS, **COMMON, **options})
        loader.close()


class Counting(IterableDataset):
    """CountingIterableDataset: 0..n-1 in every worker, with a length."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class PerWorker(IterableDataset):
    """WorkerSpecificIterableDataset: worker k yields range(sizes[k])."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self):
        return iter(range(self.sizes[get_worker_info().id]))

    def __len__(self) -> int:
        return sum(self.sizes)


# --- the constructor ----------------------------------------------------------------------------------------
def test_invalid_ctor_args_combinations_general():
    """torch: TestDataLoader.test_invalid_ctor_args_combinations, its general part: a negative worker count or
    timeout, and batch_size=None with drop_last, are ValueErrors."""
    refused(ValueError, local_producers=-1)
    refused(ValueError, timeout=-1)
    refused(ValueError, batch_size=None, drop_last=True)


def test_invalid_ctor_args_combinations_start_method():
    """torch: TestDataLoader.test_invalid_ctor_args_combinations: an unknown start method is a ValueError."""
    refused(ValueError, mp_context="bad")


def test_invalid_ctor_args_combinations_context_type():
    """torch: TestDataLoader.test_invalid_ctor_args_combinations: a context that is neither a name nor a
    context object is a TypeError."""
    refused(TypeError, mp_context=object())


def test_invalid_ctor_args_combinations_context_without_workers():
    """torch: TestDataLoader.test_invalid_ctor_args_combinations: a start method without workers
    (num_workers=0, here local_producers=0) is a ValueError."""
    refused(ValueError, local_producers=0, mp_context="spawn")


def test_invalid_ctor_args_combinations_map_style():
    """torch: TestDataLoader.test_invalid_ctor_args_combinations, map-style part: sampler with shuffle, and
    batch_sampler with batch_size, shuffle, sampler or drop_last, are ValueErrors (shuffle=3 and drop_last=3
    included: ConfigTypeError is a ValueError too)."""
    sampler = SequentialSampler(DATASET)
    batch_sampler = BatchSampler(sampler, 3, False)
    refused(ValueError, batch_size=11, sampler=sampler, shuffle=True)
    refused(ValueError, batch_sampler=batch_sampler, sampler=sampler, shuffle=True)
    refused(ValueError, batch_sampler=batch_sampler, sampler=sampler, shuffle=3)
    refused(ValueError, batch_size=11, batch_sampler=batch_sampler)
    refused(ValueError, shuffle=True, batch_sampler=batch_sampler)
    refused(ValueError, drop_last=True, batch_sampler=batch_sampler)
    refused(ValueError, drop_last=3, batch_sampler=batch_sampler)


def test_invalid_ctor_args_combinations_iterable_style():
    """torch: TestDataLoader.test_invalid_ctor_args_combinations, iterable-style part: an IterableDataset is
    accepted, but not with shuffle, a sampler or a batch_sampler (ValueError naming the option)."""
    dataset = Counting(20)
    with RemoteLoader(dataset=dataset, local_producers=WORKERS, **COMMON) as loader:
        assert len(loader) == 20
    for options in ({"shuffle": True}, {"shuffle": 3}, {"sampler": SequentialSampler(dataset)}, {"sampler": 3},
                    {"batch_sampler": BatchSampler(SequentialSampler(dataset), 3, False)}, {"batch_sampler": 3}):
        name = next(iter(options))
        with pytest.raises(ValueError, match=name):
            RemoteLoader(dataset=dataset, local_producers=WORKERS, **COMMON, **options).close()


# --- the loader's surface -----------------------------------------------------------------------------------
def test_invalid_assign_after_init():
    """torch: TestDataLoader.test_invalid_assign_after_init: batch_size, sampler, batch_sampler, drop_last and
    dataset cannot be assigned once the loader is built (ValueError)."""
    with RemoteLoader(dataset=DATASET, local_producers=1, **COMMON) as loader:
        for name in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset"):
            with pytest.raises(ValueError):
                setattr(loader, name, {})


def test_typing():
    """torch: TestDataLoader.test_typing: the loader class can be subscripted, as in an annotation
    ``-> DataLoader[list[torch.Tensor]]`` (evaluated here: this module defers its annotations)."""
    alias = RemoteLoader[list[torch.Tensor]]
    assert alias.__origin__ is RemoteLoader


def test_builtin_collection_conversion_map_style(mp_context):
    """torch: TestDataLoader.test_builtin_collection_conversion, map-style auto-batching part: list(loader) and
    tuple(loader) over CountingDataset(20) in batches of 2."""
    with local(pd.Items(range(20)), mp_context, batch_size=2) as loader:
        for kind in (list, tuple):
            fetched = kind(loader)
            assert type(fetched) is kind and len(fetched) == 10
            for got, start in zip(fetched, range(0, 20, 2)):
                assert torch.equal(got, torch.tensor([start, start + 1]))


def test_builtin_collection_conversion_unbatched():
    """torch: TestDataLoader.test_builtin_collection_conversion, map-style batch_size=None part: the samples
    themselves, 0..19 as ints."""
    with RemoteLoader(dataset=pd.Items(range(20)), local_producers=1, batch_size=None, **COMMON) as loader:
        assert list(loader) == list(range(20)) and tuple(loader) == tuple(range(20))


def test_builtin_collection_conversion_iterable_style():
    """torch: TestDataLoader.test_builtin_collection_conversion, iterable-style part (one worker, so that the
    stream is not repeated): batches of 2 of CountingIterableDataset(20)."""
    with RemoteLoader(dataset=Counting(20), local_producers=1, batch_size=2, **COMMON) as loader:
        assert [b.tolist() for b in loader] == [[i, i + 1] for i in range(0, 20, 2)]


def test_excessive_thread_creation_warning():
    """torch: TestDataLoader.test_excessive_thread_creation_warning: more workers than CPUs warns. The original
    asks for 1000 workers, which DataLoader only starts on iter(); Ferry starts its producers when built, so
    this asks for one more than the CPUs this process may use."""
    with pytest.warns(UserWarning, match="excessive"):
        RemoteLoader(dataset=DATASET, local_producers=cpus() + 1, **COMMON).close()


# --- unbatched mode (batch_size=None) -----------------------------------------------------------------------
def test_sequential_nonbatch():
    """torch: TestDataLoader.test_sequential_nonbatch: batch_size=None yields sample i at step i."""
    with RemoteLoader(dataset=DATASET, local_producers=WORKERS, batch_size=None, **COMMON) as loader:
        for i, (sample, target) in enumerate(loader):
            assert torch.equal(sample, DATASET[i][0]) and torch.equal(target, DATASET[i][1])
    assert i == len(DATASET) - 1


def test_shuffle_batch_none():
    """torch: TestDataLoader.test_shuffle_batch_none: batch_size=None, shuffled: every sample once."""
    with RemoteLoader(dataset=DATASET, local_producers=WORKERS, batch_size=None, shuffle=True, **COMMON) as loader:
        assert sorted(int(target) for _, target in loader) == sorted(DATASET.tensors[1].tolist())


def test_bulk_loading_nobatch():
    """torch: TestDataLoader.test_bulk_loading_nobatch: batch_size=None with a sampler that yields lists of
    indices hands each list to the dataset's __getitem__ (BulkLoadingDataset); every index comes back."""
    class Bulk:
        def __len__(self):
            return 35

        def __getitem__(self, indices):
            assert isinstance(indices, (list, tuple))
            return torch.as_tensor(indices)

    sampler = [list(chunk) for chunk in torch.randperm(35).split(4)]
    with RemoteLoader(dataset=Bulk(), local_producers=WORKERS, batch_size=None, sampler=sampler, **COMMON) as loader:
        assert set(torch.cat(list(loader)).tolist()) == set(range(35))


# --- iterable datasets --------------------------------------------------------------------------------------
def test_iterable_style_dataset():
    """torch: TestDataLoader.test_iterable_style_dataset, its multi-worker batched parts: worker k yields
    range(sizes[k]); batches of 7 never mix workers: {range(4), range(7), range(7, 14), range(14, 20)}, and with
    drop_last {range(7), range(7, 14)}. (Its unbatched parts are gap "unbatched mode"; its single-process parts
    have no equivalent: a loader always has producers. Its workers-exit parts are Ferry's leak checks.)"""
    sizes = [0, 4, 20]
    with RemoteLoader(dataset=PerWorker(sizes), local_producers=3, batch_size=7, **COMMON) as loader:
        fetched = [tuple(b.tolist()) for b in loader]
    assert len(fetched) == 4
    assert set(fetched) == {tuple(range(4)), tuple(range(7)), tuple(range(7, 14)), tuple(range(14, 20))}
    assert sorted(functools.reduce(operator.iadd, (list(range(s)) for s in sizes), [])) == sorted(
        i for t in fetched for i in t)
    with RemoteLoader(dataset=PerWorker(sizes), local_producers=3, batch_size=7, drop_last=True, **COMMON) as loader:
        assert {tuple(b.tolist()) for b in loader} == {tuple(range(7)), tuple(range(7, 14))}


def test_iterable_style_dataset_length_warning():
    """torch: TestDataLoader.test_iterable_style_dataset, its length-warning part: 3 workers each yield all of
    CountingIterableDataset(20): no warning before len(loader) is asked, nor within its 20, then one at every
    batch past it (DataLoader's check compares the batches with len(dataset))."""
    with RemoteLoader(dataset=Counting(20), local_producers=3, **COMMON) as loader:
        it = iter(loader)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(40):
                next(it)
        assert len(loader) == 20
        it = iter(loader)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(20):
                next(it)
        for _ in range(3):
            with pytest.warns(UserWarning, match="batches have been fetched"):
                next(it)


def test_iterable_style_dataset_unbatched():
    """torch: TestDataLoader.test_iterable_style_dataset, its multi-worker unbatched part: batch_size=None, worker
    k yields range(sizes[k]): every int comes once, as an int."""
    sizes = [0, 4, 20]
    with RemoteLoader(dataset=PerWorker(sizes), local_producers=3, batch_size=None, **COMMON) as loader:
        fetched = list(loader)
    assert all(isinstance(i, int) for i in fetched)
    assert sorted(fetched) == sorted(functools.reduce(operator.iadd, (list(range(s)) for s in sizes), []))


def test_chain_iterable_style_dataset():
    """torch: TestDataLoader.test_chain_iterable_style_dataset: ChainDataset of two counting streams, one
    worker: 0..19 then 0..14."""
    chained = ChainDataset([Counting(20), Counting(15)])
    with RemoteLoader(dataset=chained, local_producers=1, **COMMON) as loader:
        assert [int(b) for b in loader] == list(range(20)) + list(range(15))


def test_iterabledataset_len():
    """torch: TestDataLoader.test_iterabledataset_len: len() of an IterableDataset of 10 is ceil(10 / bs), also
    with drop_last (DataLoader cannot know which worker's tail to drop)."""
    for batch_size, drop_last, expected in ((1, False, 10), (2, True, 5), (3, False, 4), (3, True, 3)):
        with RemoteLoader(dataset=Counting(10), local_producers=1, batch_size=batch_size, drop_last=drop_last,
                          **COMMON) as loader:
            assert len(loader) == expected


def test_multi_epochs_reproducibility():
    """torch: TestDataLoader.test_multi_epochs_reproducibility: with 2 workers each yielding its id, batch i
    of every epoch comes from worker i % 2 (TestMultiEpochDataset)."""
    class Ids(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            return iter([info.id] * (20 // info.num_workers))

        def __len__(self):
            return 20

    with RemoteLoader(dataset=Ids(), local_producers=2, batch_size=10, **COMMON) as loader:
        for _ in range(3):
            assert [b.tolist() for b in loader] == [[0] * 10, [1] * 10]

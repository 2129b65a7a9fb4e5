"""PyTorch's own DataLoader tests, adapted to Ferry (issue 18): what a batch looks like: dicts, namedtuples,
strings, custom collate_fn outputs, default_collate's types, pinned memory, from pytorch/pytorch
``test/test_dataloader.py``.

The originals of default_collate and default_convert call those functions directly; Ferry builds its batches
itself on the producers, so here the same samples go through a RemoteLoader and the batch is compared with
DataLoader's (``num_workers=0``) for the same samples. Cases that need pinned memory run only with CUDA, as the
originals do. docs/porting.md lists every original case and what became of it.
"""

from __future__ import annotations

import gc
import tempfile

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ferry import RemoteLoader

from . import parity_datasets as pd
from .helpers import assert_tree_equal, open_fds
from .parity_support import BULK_START_METHODS, COMMON, local

CUDA = torch.cuda.is_available()
cuda = pytest.mark.skipif(not CUDA, reason="pinned memory needs CUDA (the original skips without an accelerator)")

DATASET = TensorDataset(torch.randn(100, 2, 3, 5, generator=torch.Generator().manual_seed(0)),
                        torch.arange(50).repeat(2))


@pytest.fixture(params=BULK_START_METHODS)
def mp_context(request) -> str:
    return request.param


def types(tree):
    """The exact container and leaf types of a batch, dict and list subclasses included."""
    if isinstance(tree, dict):
        return type(tree), {key: types(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree), [types(value) for value in tree]
    return (type(tree), tree.dtype) if isinstance(tree, torch.Tensor) else type(tree)


def same_as_dataloader(samples: list, method: str = "fork") -> None:
    """One batch of ``samples`` from a RemoteLoader equals DataLoader's: values, dtypes, exact container types."""
    expected = next(iter(DataLoader(pd.Items(samples), batch_size=len(samples))))
    with local(pd.Items(samples), method, batch_size=len(samples)) as loader:
        got = next(iter(loader))
    assert_tree_equal(got, expected)
    assert types(got) == types(expected)


# --- dicts, namedtuples, strings ----------------------------------------------------------------------------
def test_dict_sequential_batch(mp_context):
    """torch: TestDictDataLoader.test_sequential_batch (persistent_workers False and True: Ferry's producers
    are persistent): nested dicts collate key by key, tensors and numbers batched in order."""
    with local(pd.Dicts(), mp_context, batch_size=2, shuffle=False) as loader:
        batches = list(loader)
    assert len(batches) == 2
    for i, sample in enumerate(batches):
        start = i * 2
        assert set(sample) == {"a_tensor", "another_dict"} and set(sample["another_dict"]) == {"a_number"}
        assert sample["a_tensor"].size() == torch.Size([2, 4, 2])
        assert (sample["a_tensor"][0] == start).all() and (sample["a_tensor"][1] == start + 1).all()
        assert sample["another_dict"]["a_number"].tolist() == [start, start + 1]


@pytest.mark.skipif(CUDA, reason="the original runs only without an accelerator")
def test_pin_memory_no_accelerator():
    """torch: TestDictDataLoader.test_pin_memory_no_accelerator: pin_memory=True without an accelerator warns
    (DataLoader does too) and the batches are not pinned."""
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = local(pd.Dicts(), "fork", batch_size=2, pin_memory=True)
    with loader:
        for sample in loader:
            assert not sample["a_tensor"].is_pinned()
            assert not sample["another_dict"]["a_number"].is_pinned()


@pytest.mark.parametrize("method", BULK_START_METHODS)
def test_dataloader_with_namedtuple(method):
    """torch: TestNamedTupleDataLoader.test_dataloader_with_namedtuple, auto-collation part: the batch is the
    sample's namedtuple, nested namedtuple and all, with tensors for numbers (pinned where CUDA is)."""
    with local(pd.NamedTuples(), method, batch_size=2, pin_memory=CUDA) as loader:
        for batch in loader:
            assert isinstance(batch, pd.Batch) and isinstance(batch.data, pd.Data)
            assert isinstance(batch.data.positive, torch.Tensor)
            assert batch.random_tensor.is_pinned() == CUDA and batch.data.positive.is_pinned() == CUDA


def test_dataloader_with_namedtuple_unbatched():
    """torch: TestNamedTupleDataLoader.test_dataloader_with_namedtuple, batch_size=None part: the samples as they
    are (numbers not turned into tensors)."""
    with RemoteLoader(dataset=pd.NamedTuples(), local_producers=1, batch_size=None, **COMMON) as loader:
        for batch in loader:
            assert isinstance(batch, pd.Batch) and not isinstance(batch.data.positive, torch.Tensor)


@cuda
def test_string_shuffle_pin_memory():
    """torch: TestStringDataLoader.test_shuffle_pin_memory: strings stay strings, numbers are pinned."""
    with local(pd.Strings(), "fork", batch_size=2, shuffle=True, pin_memory=True) as loader:
        for strings, numbers in loader:
            assert isinstance(strings[0], str) and numbers.is_pinned()


# --- collate_fn outputs that are not plain trees ------------------------------------------------------------
@pytest.mark.parametrize("collate_fn,kind", [
    pytest.param(pd.collate_wrapper, pd.SimpleCustomBatch, id="custom-batch"),
    pytest.param(pd.collate_into_packed_sequence, torch.nn.utils.rnn.PackedSequence, id="packed"),
    pytest.param(pd.collate_into_packed_sequence_batch_first, torch.nn.utils.rnn.PackedSequence,
                 id="packed-batch-first"),
])
def test_custom_batch_pin_worker(collate_fn, kind):
    """torch: TestCustomPinFn.test_custom_batch_pin_worker and test_custom_batch_pin (num_workers=0): a
    collate_fn's own batch type (a class with pin_memory(), a PackedSequence) reaches the loop as that type,
    pinned where CUDA is (the originals run only with CUDA; without, the type is checked)."""
    samples = TensorDataset(torch.arange(50, dtype=torch.float32).view(10, 5),
                            torch.arange(50, dtype=torch.float32).view(10, 5))
    with local(samples, "fork", batch_size=2, collate_fn=collate_fn, pin_memory=CUDA) as loader:
        for batch in loader:
            assert isinstance(batch, kind)
            assert not CUDA or batch.is_pinned()


# --- default_collate and default_convert, through the loader ------------------------------------------------
def test_default_collate_dtype():
    """torch: TestDataLoader.test_default_collate_dtype: ints become int64, floats float64, bools bool, strings
    stay a list of strings (the four columns of one batch)."""
    same_as_dataloader([(1, 1.1, True, "a"), (2, 2.3, False, "b"), (-1, -0.9, True, "c")])


def test_default_collate_mapping_keep_type():
    """torch: TestDataLoader.test_default_collate_mapping_keep_type: a batch of CustomDicts is a CustomDict."""
    same_as_dataloader([pd.CustomDict({"a": 1, "b": 2}), pd.CustomDict({"a": 3, "b": 4})])


def test_default_collate_sequence_keep_type():
    """torch: TestDataLoader.test_default_collate_sequence_keep_type: a batch of CustomLists is a CustomList."""
    same_as_dataloader([pd.CustomList([1, 2, 3]), pd.CustomList([4, 5, 6])])


def test_default_collate_sequence_dont_keep_type():
    """torch: TestDataLoader.test_default_collate_sequence_dont_keep_type: ranges collate into a list."""
    same_as_dataloader([range(2), range(2)])


def test_default_collate_bad_numpy_types_no_op():
    """torch: TestDataLoader.test_default_collate_bad_numpy_types, its no-op part: numpy strings come back as
    they are."""
    same_as_dataloader(list(np.array(["a", "b", "c"])))


def test_default_collate_bad_numpy_types():
    """torch: TestDataLoader.test_default_collate_bad_numpy_types, its error part: string and object arrays
    cannot be collated: TypeError in the loop."""
    for samples in ([np.array([["a", "b", "c"]])] * 2, [np.array([object(), object()])] * 2):
        with local(pd.Items(samples), "fork", batch_size=2) as loader:
            with pytest.raises(TypeError):
                next(iter(loader))


def test_default_collate_bad_sequence_type():
    """torch: TestDataLoader.test_default_collate_bad_sequence_type: sequences of unequal length in one batch:
    RuntimeError in the loop, whichever comes first."""
    for samples in ([["X"], ["X", "X"]], [["X", "X"], ["X"]]):
        with local(pd.Items(samples), "fork", batch_size=2) as loader:
            with pytest.raises(RuntimeError):
                next(iter(loader))


def test_default_collate_numpy_memmap():
    """torch: TestDataLoader.test_default_collate_numpy_memmap: rows of a numpy memmap collate into a tensor."""
    with tempfile.TemporaryFile() as f:
        rows = np.array([[0, 1], [2, 3], [4, 5], [6, 7]])
        writer = np.memmap(f, dtype=rows.dtype, mode="w+", shape=rows.shape)
        writer[:] = rows
        reader = np.memmap(f, dtype=rows.dtype, mode="r", shape=rows.shape)
        with local(pd.Items(list(reader)), "fork", batch_size=4) as loader:
            batch = next(iter(loader))
    assert torch.equal(batch, torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]]))


@pytest.mark.parametrize("name,sample,expected", [
    ("mapping_keep_type", pd.CustomDict({"a": 1, "b": 2}), pd.CustomDict({"a": 1, "b": 2})),
    ("sequence_keep_type", pd.CustomList([1, 2, 3]), pd.CustomList([1, 2, 3])),
    ("sequence_dont_keep_type", range(2), [0, 1]),
])
def test_default_convert(name, sample, expected):
    """torch: TestDataLoader.test_default_convert_mapping_keep_type, test_default_convert_sequence_keep_type,
    test_default_convert_sequence_dont_keep_type: default_convert is what an unbatched loader (batch_size=None)
    applies to each sample."""
    with RemoteLoader(dataset=pd.Items([sample]), local_producers=1, batch_size=None, **COMMON) as loader:
        (got,) = list(loader)
    assert type(got) is type(expected) and got == expected


# --- sparse and nested tensors ------------------------------------------------------------------------------
def test_sparse_tensor_multiprocessing():
    """torch: TestDataLoaderDevice.test_sparse_tensor_multiprocessing (cpu, fork): sparse COO samples through
    _sparse_coo_collate (a clone each) come back equal."""
    dataset = [torch.randn(5, 5).to_sparse() for _ in range(10)]
    with local(pd.Items(dataset), "fork", batch_size=1, collate_fn=pd.clone_collate) as loader:
        for i, batch in enumerate(loader):
            assert torch.equal(batch[0].to_dense(), dataset[i].to_dense())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_nested_tensor_multiprocessing():
    """torch: TestDataLoaderDevice.test_nested_tensor_multiprocessing (cpu, fork): nested-tensor samples through
    _clone_collate come back equal; default_collate refuses them with a RuntimeError that says so."""
    dataset = [torch.nested.nested_tensor([torch.randn(5)]) for _ in range(10)]
    with local(pd.Items(dataset), "fork", batch_size=1, collate_fn=pd.clone_collate) as loader:
        for i, batch in enumerate(loader):
            assert all(torch.equal(a, b) for a, b in zip(batch[0].unbind(), dataset[i].unbind()))
    with local(pd.Items(dataset), "fork", batch_size=1) as loader:
        with pytest.raises(RuntimeError, match="not currently supported by the default collate_fn"):
            next(iter(loader))


# --- pinned memory (CUDA) -----------------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("shuffle", [False, True], ids=["sequential", "shuffle"])
def test_pin_memory(shuffle):
    """torch: TestDataLoader.test_sequential_pin_memory, TestDataLoader.test_shuffle_pin_memory,
    TestDictDataLoaderDevice.test_pin_memory: pin_memory=True gives pinned tensors, inputs, targets, nested."""
    with local(DATASET, "fork", batch_size=2, shuffle=shuffle, pin_memory=True) as loader:
        for inputs, targets in loader:
            assert inputs.is_pinned() and targets.is_pinned()
    with local(pd.Dicts(), "fork", batch_size=2, pin_memory=True) as loader:
        for sample in loader:
            assert sample["a_tensor"].is_pinned() and sample["another_dict"]["a_number"].is_pinned()


@cuda
def test_pin_memory_for_device():
    """torch: TestDataLoaderDevice.test_pin_memory_for_device: a list of tensors, pin_memory=True: pinned."""
    with local(pd.Items([torch.randn(3, 5) for _ in range(10)]), "fork", batch_size=2, pin_memory=True) as loader:
        for batch in loader:
            assert batch[0].is_pinned()


@cuda
def test_persistent_workers_pin_memory_fd_does_not_grow_linearly():
    """torch: TestDataLoaderPersistentWorkers.test_persistent_workers_pin_memory_fd_does_not_grow_linearly: 16
    pinned one-worker loaders, each dropped after a batch, leave at most 8 more fds than the first."""
    def once() -> None:
        loader = local(DATASET, "fork", local_producers=1, batch_size=2, pin_memory=True)
        it = iter(loader)
        next(it)
        del it, loader
        gc.collect()

    once()
    baseline = len(open_fds())
    for _ in range(15):
        once()
    assert len(open_fds()) <= baseline + 8

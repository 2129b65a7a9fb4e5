"""PyTorch's own DataLoader tests, adapted to Ferry (issue 18): the batching, shuffling, sampler and length cases
of ``TestDataLoader`` in pytorch/pytorch ``test/test_dataloader.py``.

Each case names its original (``torch: Class.test_name``) and keeps its expectation, with
``RemoteLoader(dataset=..., local_producers=N)`` where the original has ``DataLoader(..., num_workers=N)``
(``num_workers=0`` originals too: the contract is the same). Every case runs under fork; test_batch_sampler,
which the original runs under spawn too, under spawn as well; the others under spawn with ``-m slow``.
The loaders of read-only cases are shared (tests/parity_support.py). What became of every original case, the
ones that do not apply included, is in docs/porting.md.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset, random_split
from torch.utils.data.distributed import DistributedSampler

from ferry import RemoteSampleError

from . import parity_datasets as pd
from .parity_support import BULK_START_METHODS, START_METHODS, SharedLoaders, WORKERS, local

# TestDataLoader.setUp: 100 samples of 2x3x5, labels 0..49 twice (fixed here, so that every case sees one set)
_gen = torch.Generator().manual_seed(0)
DATA = torch.randn(100, 2, 3, 5, generator=_gen)
LABELS = torch.randperm(50, generator=_gen).repeat(2)
DATASETS = {"tensors": TensorDataset(DATA, LABELS), "ints": torch.IntTensor(range(9))}


@pytest.fixture(scope="module", params=BULK_START_METHODS)
def mp_context(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def shared(mp_context):
    loaders = SharedLoaders(mp_context, DATASETS)
    yield loaders
    loaders.close()


# --- the original's helpers, restated -----------------------------------------------------------------------
def check_sequential(loader) -> None:
    """_test_sequential: batch i holds samples i*bs .. i*bs+bs-1, and the epoch has ceil(100 / bs) batches."""
    size = loader.batch_size
    count = 0
    for i, (sample, target) in enumerate(loader):
        assert torch.equal(sample, DATA[i * size:(i + 1) * size]), f"batch {i}: samples out of order"
        assert torch.equal(target, LABELS[i * size:(i + 1) * size]), f"batch {i}: labels out of order"
        count += 1
    assert count == math.ceil(len(DATA) / size)


def check_shuffle(loader) -> None:
    """_test_shuffle: every sample exactly once with its own label, full batches but the last."""
    size = loader.batch_size
    seen = [0] * len(DATA)
    count = 0
    for i, (samples, targets) in enumerate(loader):
        for sample, target in zip(samples, targets):
            found = [j for j in range(len(DATA)) if torch.equal(DATA[j], sample)]
            assert len(found) == 1, "a sample that is not in the dataset"
            assert seen[found[0]] == 0, f"sample {found[0]} twice in one epoch"
            seen[found[0]] += 1
            assert torch.equal(target, LABELS[found[0]])
        assert sum(seen) == min((i + 1) * size, len(DATA))
        count += 1
    assert count == math.ceil(len(DATA) / size) and sum(seen) == len(DATA)


def check_error(loader, dataset_len: int) -> None:
    """_test_error: every batch raises NotImplementedError in the loop, and the epoch still ends."""
    errors = 0
    it = iter(loader)
    for _ in range(dataset_len + 1):  # bounded: one more than the batches there can be
        try:
            next(it)
        except NotImplementedError:
            errors += 1
        except StopIteration:
            break
    assert errors == math.ceil(dataset_len / loader.batch_size)


# --- sequential and shuffled epochs -------------------------------------------------------------------------
def test_sequential_batch(shared):
    """torch: TestDataLoader.test_sequential_batch"""
    check_sequential(shared.get("tensors"))
    check_sequential(shared.get("tensors", batch_size=2))


def test_sequential_workers(shared):
    """torch: TestDataLoader.test_sequential_workers"""
    check_sequential(shared.get("tensors"))


def test_seqential_batch_workers(shared):
    """torch: TestDataLoader.test_seqential_batch_workers"""
    check_sequential(shared.get("tensors", batch_size=2))


def test_seqential_batch_workers_prefetch(shared):
    """torch: TestDataLoader.test_seqential_batch_workers_prefetch. prefetch_factor=3 per worker becomes
    buffer_batches=3*N, Ferry's bound on the batches buffered and in flight over all producers."""
    check_sequential(shared.get("tensors", batch_size=2, buffer_batches=3 * WORKERS))


def test_shuffle(shared):
    """torch: TestDataLoader.test_shuffle"""
    check_shuffle(shared.get("tensors", shuffle=True))


def test_shuffle_batch(shared):
    """torch: TestDataLoader.test_shuffle_batch"""
    check_shuffle(shared.get("tensors", batch_size=2, shuffle=True))


def test_shuffle_workers(shared):
    """torch: TestDataLoader.test_shuffle_workers"""
    check_shuffle(shared.get("tensors", shuffle=True))


def test_shuffle_batch_workers(shared):
    """torch: TestDataLoader.test_shuffle_batch_workers"""
    check_shuffle(shared.get("tensors", batch_size=2, shuffle=True))


def test_shuffle_batch_workers_prefetch(shared):
    """torch: TestDataLoader.test_shuffle_batch_workers_prefetch (prefetch_factor as in the sequential case)"""
    check_shuffle(shared.get("tensors", batch_size=2, shuffle=True, buffer_batches=3 * WORKERS))


def test_shuffle_reproducibility(mp_context):
    """torch: TestDataLoader.test_shuffle_reproducibility: two loaders with generator=Generator().manual_seed(42)
    yield the same batches."""
    def epoch() -> list:
        with local(DATASETS["tensors"], mp_context, shuffle=True,
                   generator=torch.Generator().manual_seed(42)) as loader:
            return list(loader)

    first, second = epoch(), epoch()
    assert len(first) == len(second) == len(DATA)
    for (x1, y1), (x2, y2) in zip(first, second):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_len(shared):
    """torch: TestDataLoader.test_len: len() is the number of batches an epoch yields."""
    assert len(DATASETS["tensors"]) == 100
    for batch_size, expected in ((2, 50), (3, 34)):
        loader = shared.get("tensors", batch_size=batch_size)
        assert len(loader) == expected
        assert sum(1 for _ in loader) == expected


# --- samplers -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("start_method", BULK_START_METHODS)
def test_sampler(start_method):
    """torch: TestDataLoader.test_sampler: a plain iterable of indices (range(2, 12)) as the sampler. (Its
    spawn line runs _test_batch_sampler, which test_batch_sampler covers under spawn.)"""
    with local(DATASETS["tensors"], start_method, sampler=range(2, 12), batch_size=2) as loader:
        assert len(loader) == 5
        count = 0
        for i, (inputs, _) in enumerate(loader):
            assert len(inputs) == 2
            assert torch.equal(inputs, DATA[i * 2 + 2:i * 2 + 4])
            count += 1
    assert count == 5


@pytest.mark.parametrize("start_method", START_METHODS)
def test_batch_sampler(start_method):
    """torch: TestDataLoader.test_batch_sampler: a plain list of index tuples, of sizes 2 and 3 in turn."""
    batches = []
    for start in range(0, 20, 5):
        batches += [tuple(range(start, start + 2)), tuple(range(start + 2, start + 5))]
    with local(DATASETS["tensors"], start_method, batch_sampler=batches) as loader:
        assert len(loader) == 8
        count = 0
        for i, (inputs, _) in enumerate(loader):
            offset, size = i * 5 // 2, 2 if i % 2 == 0 else 3
            assert len(inputs) == size
            assert torch.equal(inputs, DATA[offset:offset + size])
            count += 1
    assert count == 8


@pytest.mark.parametrize("replacement", [True, False])
def test_random_sampler_len(mp_context, replacement):
    """torch: TestDataLoader.test_random_sampler_len_with_replacement (True),
    TestDataLoader.test_random_sampler_len_without_replacement (False): len() follows the sampler's
    num_samples (105 of 100 samples), for batch sizes 1 and 6."""
    num_samples = len(DATA) + 5
    sampler = RandomSampler(DATASETS["tensors"], replacement=replacement, num_samples=num_samples)
    assert len(sampler) == num_samples and sum(1 for _ in sampler) == num_samples
    for batch_size in (1, 6):
        with local(DATASETS["tensors"], mp_context, batch_size=batch_size, sampler=sampler) as loader:
            assert len(loader) == math.ceil(num_samples / batch_size)


def test_duplicating_data_with_drop_last(mp_context):
    """torch: TestDataLoader.test_duplicating_data_with_drop_last: 4 ranks' DistributedSampler over 9 samples
    with drop_last never yield a sample twice."""
    dataset = DATASETS["ints"]
    scanned = torch.IntTensor([])
    for rank in range(4):
        sampler = DistributedSampler(dataset, 4, rank)
        with local(dataset, mp_context, batch_size=9 // 4, drop_last=True, sampler=sampler) as loader:
            for batch in loader:
                scanned = torch.cat((scanned, batch), 0)
    assert scanned.numel() > 0 and scanned.size() == scanned.unique().size()


# --- sample types -------------------------------------------------------------------------------------------
def test_numpy(mp_context):
    """torch: TestDataLoader.test_numpy: float64 arrays collate into a DoubleTensor batch."""
    with local(pd.NumpyOnes(), mp_context, batch_size=12) as loader:
        batch = next(iter(loader))
    assert isinstance(batch, torch.DoubleTensor)
    assert batch.size() == torch.Size([12, 2, 3, 4])


def test_numpy_scalars(mp_context):
    """torch: TestDataLoader.test_numpy_scalars: each numpy scalar type collates into its tensor type (all eight
    in one sample, one loader, instead of one loader per type)."""
    with local(pd.NumpyScalars(), mp_context, batch_size=2) as loader:
        batch = next(iter(loader))
    assert len(batch) == len(pd.NUMPY_SCALAR_TENSORS)
    for column, (kind, tensor_type) in zip(batch, pd.NUMPY_SCALAR_TENSORS.items()):
        assert isinstance(column, tensor_type), f"{kind.__name__}: {column.type()} is not {tensor_type.__name__}"


def test_subset_custom_getitem(mp_context):
    """torch: TestDataLoader.test_subset_custom_getitem: a Subset subclass's own __getitem__ is what loads."""
    subset = pd.Doubled(pd.Items(torch.arange(20)), [0, 1, 2, 3])
    with local(subset, mp_context, batch_size=2) as loader:
        batches = list(loader)
    assert [b.tolist() for b in batches] == [[0, 2], [4, 6]]


def test_subset_custom_getitem_with_tuple_data(mp_context):
    """torch: TestDataLoader.test_subset_custom_getitem_with_tuple_data"""
    pairs = pd.Items(zip(torch.arange(10), torch.arange(100, 110)))
    subset = pd.Summed(pairs, [0, 1, 2, 3])
    with local(subset, mp_context, batch_size=2) as loader:
        batches = list(loader)
    assert [b.tolist() for b in batches] == [[100, 102], [104, 106]]


def test_splits_indexing_type(mp_context):
    """torch: TestDatasetRandomSplit.test_splits_indexing_type: a random_split Subset, loaded, indexes its
    dataset with Python ints (by count and by fraction)."""
    for lengths in ([5], [1.0]):
        subset = random_split(pd.IntKeysOnly([1, 2, 3, 4, 5]), lengths)[0]
        with local(subset, mp_context, batch_size=1) as loader:
            assert sorted(int(b) for b in loader) == [1, 2, 3, 4, 5]


# --- errors in the dataset ----------------------------------------------------------------------------------
def test_error(mp_context):
    """torch: TestDataLoader.test_error: every batch of ErrorDataset(100) raises NotImplementedError."""
    with local(pd.NoGetItem(100), mp_context, batch_size=2, shuffle=True) as loader:
        check_error(loader, 100)


def test_error_workers(mp_context):
    """torch: TestDataLoader.test_error_workers: ErrorDataset(41), batches of 2: 21 NotImplementedErrors."""
    with local(pd.NoGetItem(41), mp_context, batch_size=2, shuffle=True) as loader:
        check_error(loader, 41)


def test_error_workers_as_remote_sample_errors(mp_context):
    """torch: TestDataLoader.test_error_workers, the part Ferry keeps today: each of the 21 batches raises in the
    loop (as RemoteSampleError naming NotImplementedError) and the epoch goes on to its end."""
    with local(pd.NoGetItem(41), mp_context, batch_size=2, shuffle=True) as loader:
        it, errors = iter(loader), []
        for _ in range(42):
            try:
                next(it)
            except RemoteSampleError as exc:
                errors.append(exc.exc_type)
            except StopIteration:
                break
    assert errors == ["NotImplementedError"] * 21


def test_reference_values_match_dataloader():
    """The fixed data of these cases, through DataLoader itself: the expectations above hold for it."""
    check_sequential(DataLoader(DATASETS["tensors"], batch_size=2, num_workers=0))
    check_shuffle(DataLoader(DATASETS["tensors"], batch_size=2, shuffle=True))

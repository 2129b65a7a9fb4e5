"""Datasets, collate functions and producer init functions of the adaptation of PyTorch's DataLoader tests
(tests/test_dataloader_parity*.py). They live in an importable module, not in the tests, so that producers
started with ``mp_context="spawn"`` can unpickle them. Each says which helper of pytorch/pytorch
``test/test_dataloader.py`` it stands in for; they are written for Ferry's tests, not copied."""

from __future__ import annotations

import collections
import ctypes
import faulthandler
import multiprocessing
import os
import time

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Subset, get_worker_info

# Value and Semaphore of the spawn context: usable by forked producers (inherited) and spawned ones (pickled
# while the producer process starts), as the original's are
_SPAWN = multiprocessing.get_context("spawn")


class Items(Dataset):
    """Sample i is ``items[i]`` (CountingDataset is ``Items(range(n))``; also the samples of default_collate's
    cases)."""

    def __init__(self, items) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


class NoGetItem(Dataset):
    """ErrorDataset: a torch Dataset without ``__getitem__``, so every sample raises NotImplementedError."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


class Segfaulting(Dataset):
    """SegfaultDataset: every sample dereferences NULL."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int):
        return ctypes.string_at(0)


class SlowFirst(Dataset):
    """SleepDataset: the first sample a process loads takes ``seconds``; sample i is i."""

    def __init__(self, size: int, seconds: float) -> None:
        self.size, self.seconds, self.slept = size, seconds, False

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        if not self.slept:
            self.slept = True
            time.sleep(self.seconds)
        return index


class SlowHalf(IterableDataset):
    """TestSlowIterableDataset(start=0, end=10): worker w of N yields (w, i) for its ceil(10 / N) share of 0..9,
    and sample 5 (worker 1's first of two) takes ``seconds``."""

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds

    def __iter__(self):
        info = get_worker_info()
        share = -(-10 // info.num_workers)
        for i in range(info.id * share, min(info.id * share + share, 10)):
            if i == 5:
                time.sleep(self.seconds)
            yield info.id, i


class InitialSeed(Dataset):
    """SeedDataset: every sample is the loading process's ``torch.initial_seed()``."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        return torch.initial_seed()


class SeedsAfterBarrier(Dataset):
    """SynchronizedSeedDataset: no sample is returned before ``parties`` samples were asked for (a barrier over
    all producers, so that each of ``parties`` single-slot producers takes exactly one); sample i is the
    loading process's ``torch.initial_seed()``."""

    def __init__(self, size: int, parties: int) -> None:
        self.size, self.parties = size, parties
        self.arrived = _SPAWN.Value("i", 0, lock=True)
        self.gate = _SPAWN.Semaphore(0)

    def __len__(self) -> int:
        return self.size

    def wait_for_all(self) -> None:
        with self.arrived.get_lock():
            self.arrived.value += 1
            if self.arrived.value == self.parties:
                self.gate.release()
        if not self.gate.acquire(timeout=60):  # bounded: a case that deadlocks fails instead of hanging
            raise TimeoutError(f"only {self.arrived.value} of {self.parties} samples reached the barrier")
        self.gate.release()

    def __getitem__(self, index: int):
        self.wait_for_all()
        return torch.initial_seed()


class WorkerValue(SeedsAfterBarrier):
    """TestWorkerInfoDataset: sample i is ``self.value``, which only :func:`check_worker_info` sets (in each
    producer's copy: the trainer's copy never has it)."""

    def __getitem__(self, index: int):
        self.wait_for_all()
        return torch.tensor(self.value)


def check_worker_info(worker_id: int) -> None:
    """_test_worker_info_init_fn: what ``get_worker_info()`` says in a producer's init, checked there; then
    the producer's dataset copy gets ``value = [worker_id, pid]``."""
    info = get_worker_info()
    if info is None or info.id != worker_id or not 0 <= worker_id < info.num_workers:
        raise AssertionError(f"worker_info {info!r} does not match worker_id {worker_id}")
    if info.seed != torch.initial_seed():
        raise AssertionError(f"worker_info.seed {info.seed} != torch.initial_seed() {torch.initial_seed()}")
    if not isinstance(info.dataset, WorkerValue) or hasattr(info.dataset, "value"):
        raise AssertionError(f"worker_info.dataset is not a fresh copy of the dataset: {info.dataset!r}")
    for name in ("id", "num_workers", "seed", "dataset"):
        if f"{name}=" not in repr(info):
            raise AssertionError(f"{name}= missing from {info!r}")
    info.dataset.value = [worker_id, os.getpid()]


def seed_12345(worker_id: int) -> None:
    """init_fn of test_worker_init_fn."""
    torch.manual_seed(12345)


def fail_in_init(worker_id: int) -> None:
    """error_worker_init_fn."""
    raise RuntimeError("Error in worker_init_fn")


def disable_stderr(worker_id: int) -> None:
    """disable_stderr: a producer's fd 2 goes to /dev/null, and no fault handler inherited from the trainer
    (pytest's) prints a dump elsewhere (the segfault cases expect a crash)."""
    faulthandler.disable()
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)


class EmptyTensors(Dataset):
    """EmptyTensorDataset: ``length`` samples, each ``torch.empty(0)``."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return torch.empty(0)


class NumpyOnes(Dataset):
    """test_numpy's dataset: sample i is ``np.ones((2, 3, 4)) * i`` (float64)."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int):
        return np.ones((2, 3, 4)) * index


#: test_numpy_scalars: each numpy scalar type and the tensor type default_collate makes of a batch of them
NUMPY_SCALAR_TENSORS = {
    np.float64: torch.DoubleTensor, np.float32: torch.FloatTensor, np.float16: torch.HalfTensor,
    np.int64: torch.LongTensor, np.int32: torch.IntTensor, np.int16: torch.ShortTensor,
    np.int8: torch.CharTensor, np.uint8: torch.ByteTensor,
}


class NumpyScalars(Dataset):
    """ScalarDataset for every dtype at once: sample i is a tuple of one zero of each numpy scalar type."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        return tuple(kind() for kind in NUMPY_SCALAR_TENSORS)


class Strings(Dataset):
    """StringDataset: sample i is ``("12345"[i], i)``."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int):
        return "12345"[index], index


class Dicts(Dataset):
    """DictDataset: sample i is ``{"a_tensor": 4x2 filled with i, "another_dict": {"a_number": i}}``."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        return {"a_tensor": torch.full((4, 2), float(index)), "another_dict": {"a_number": index}}


Batch = collections.namedtuple("Batch", ["data", "label", "random_tensor"])
Data = collections.namedtuple("Data", ["positive", "negative"])


class NamedTuples(Dataset):
    """NamedTupleDataset: sample i is ``Batch(Data(i, -i), str(i), randn(3))`` (module-level namedtuples)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        return Batch(data=Data(positive=index, negative=-index), label=str(index), random_tensor=torch.randn(3))


class CustomList(list):
    """CustomList."""


class CustomDict(dict):
    """CustomDict."""


class SimpleCustomBatch:
    """SimpleCustomBatch: a batch object that stacks inputs and targets and can pin itself."""

    def __init__(self, samples) -> None:
        inputs, targets = zip(*samples)
        self.inp, self.tgt = torch.stack(inputs, 0), torch.stack(targets, 0)

    def pin_memory(self) -> "SimpleCustomBatch":
        self.inp, self.tgt = self.inp.pin_memory(), self.tgt.pin_memory()
        return self

    def is_pinned(self) -> bool:
        return self.inp.is_pinned() and self.tgt.is_pinned()


def collate_wrapper(samples):
    """collate_wrapper: the batch as a SimpleCustomBatch."""
    return SimpleCustomBatch(samples)


def collate_into_packed_sequence(samples):
    """collate_into_packed_sequence: inputs time-major (T x B), packed with random lengths."""
    data = torch.stack([sample[0] for sample in samples], 1)
    lengths = torch.randint(1, data.size(0), size=(data.size(1),), dtype=torch.int64)
    return torch.nn.utils.rnn.pack_padded_sequence(data, lengths, enforce_sorted=False)


def collate_into_packed_sequence_batch_first(samples):
    """collate_into_packed_sequence_batch_first: inputs B x T, packed batch-first with random lengths."""
    data = torch.stack([sample[0] for sample in samples], 0)
    lengths = torch.randint(1, data.size(1), size=(data.size(0),), dtype=torch.int64)
    return torch.nn.utils.rnn.pack_padded_sequence(data, lengths, batch_first=True, enforce_sorted=False)


def transpose_collate(samples):
    """A collate_fn whose output is not batch-first: ``tuple(zip(*samples))`` (issue 18's example)."""
    return tuple(zip(*samples))


def clone_collate(samples):
    """_clone_collate: the samples themselves, cloned, as a list."""
    return [sample.clone() for sample in samples]


class StartChecked(Dataset):
    """DummyDataset: every sample checks that the copy it is loaded from still has ``start == 0``."""

    def __init__(self) -> None:
        self.data = list(range(10))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        if self.start != 0:
            raise AssertionError(f"the producer's copy has start={self.start}: it was reset")
        return self.data[index]


class Affinity(Dataset):
    """SetAffinityDataset, map-style: sample i is the CPUs the loading thread may run on, sorted."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        return np.array(sorted(os.sched_getaffinity(0)), dtype=np.int64)


def pin_to_last_cpu(worker_id: int) -> None:
    """worker_set_affinity: the producer process runs on the last CPU it may use."""
    os.sched_setaffinity(0, [max(os.sched_getaffinity(0))])


class Conv(Dataset):
    """ConvDataset: a conv1d run once in the trainer (at construction) and again in the producer."""

    def __init__(self) -> None:
        self.x = torch.ones(1, 1, 24000)
        self[0]

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int):
        return torch.nn.functional.conv1d(self.x, torch.ones(1, 1, 2))


class SlowIndex(Dataset):
    """TestSlowIndexDataset: sample i is ``(worker id, i)``; sample ``slow_index`` takes ``seconds``."""

    def __init__(self, end: int, slow_index: int, seconds: float = 1.0) -> None:
        self.end, self.slow_index, self.seconds = end, slow_index, seconds

    def __len__(self) -> int:
        return self.end

    def __getitem__(self, index: int):
        if index == self.slow_index:
            time.sleep(self.seconds)
        return get_worker_info().id, index


class Doubled(Subset):
    """TransformSubset: a Subset whose ``__getitem__`` (and ``__getitems__``) double the value."""

    def __getitem__(self, index: int):
        return self.dataset[self.indices[index]] * 2

    def __getitems__(self, indices):
        return [self[i] for i in indices]


class Summed(Subset):
    """SumSubset: a Subset of pairs whose ``__getitem__`` (and ``__getitems__``) return their sum."""

    def __getitem__(self, index: int):
        a, b = self.dataset[self.indices[index]]
        return a + b

    def __getitems__(self, indices):
        return [self[i] for i in indices]


class IntKeysOnly(Dataset):
    """The CustomDataset of test_splits_indexing_type: refuses any key that is not a Python int."""

    def __init__(self, items) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key):
        if type(key) is not int:
            raise TypeError(f"index {key!r} is a {type(key).__name__}, not an int")
        return self.items[key]


class WorkerQueue(Dataset):
    """TestWorkerQueueDataset: sample i is ``(worker_id, data[i])``, where ``worker_init_fn`` (a bound method of
    this dataset, given as the init) records the worker id on the dataset."""

    def __init__(self, data) -> None:
        self.data = list(data)
        self.worker_id = None

    def worker_init_fn(self, worker_id: int) -> None:
        self.worker_id = worker_id

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        return self.worker_id, self.data[index]


class ExitDataset(Dataset):
    """TestProperExitDataset: sample i is ``tensor([i])``; once ``error_event`` is set, the last producer's
    samples raise RuntimeError("Worker error")."""

    def __init__(self, size: int, error_event=None) -> None:
        self.size, self.error_event = size, error_event

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        info = get_worker_info()
        if self.error_event is not None and self.error_event.is_set() and info.id == info.num_workers - 1:
            raise RuntimeError("Worker error")
        return torch.tensor([index])


def raise_in_loop(length: int, batch_size: int, raising=None) -> None:
    """_test_large_sampler_indices as a child process's target: a loader over EmptyTensors(length), and an
    error raised in the loop at the first batch, with the loader left open (as a training script leaves it).
    ``raising``, an Event, is set just before the error is raised."""
    from ferry import RemoteLoader

    loader = RemoteLoader(dataset=EmptyTensors(length), local_producers=1, batch_size=batch_size, heartbeat=0.2,
                          log_every=None, timeout=60)
    for batch in loader:
        if batch.numel() != 0:
            raise AssertionError(f"expected empty tensors, got {batch.numel()} elements")
        if raising is not None:
            raising.set()
        raise RuntimeError("My Error")


class RandomTensors(Dataset):
    """The RandomDataset of test_fd_limit_exceeded and test_early_exit, map-style: ``length`` samples of
    ``torch.randn(size)``."""

    def __init__(self, length: int, size: tuple[int, ...]) -> None:
        self.length, self.size = length, tuple(size)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return torch.randn(self.size)

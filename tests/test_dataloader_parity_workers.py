"""PyTorch's own DataLoader tests, adapted to Ferry (issue 18): what the workers (Ferry's local producers) do:
``worker_init_fn`` (``producer_init=``), ``get_worker_info()``, seeds, errors in init, the start method and
several loaders at once, from pytorch/pytorch ``test/test_dataloader.py``.

Here the start method matters (a hook or dataset class is pickled, a producer seeds itself and reports its
worker info), so each case runs under fork and spawn. A producer that stands in for one DataLoader worker has
one loading thread and one slot (``producer_threads=1, producer_slots=1``) where the original relies on a
worker loading one batch at a time. docs/porting.md lists every original case and what became of it.
"""

from __future__ import annotations

import multiprocessing
import os
import sys

import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset, get_worker_info

import ferry
from ferry import RemoteLoader

from . import parity_datasets as pd
from .helpers import local_producer_pids, wait_for
from .parity_support import (
    BULK_START_METHODS, COMMON, START_METHODS, WORKERS, keep_for_spawn, local,
)

#: one DataLoader worker: one loading thread, one batch at a time
ONE_AT_A_TIME = {"producer_threads": 1, "producer_slots": 1}

DATASET = TensorDataset(torch.randn(100, 2, 3, 5, generator=torch.Generator().manual_seed(0)),
                        torch.arange(50).repeat(2))


@pytest.fixture(scope="module", autouse=True)
def _spawn_residue() -> None:
    keep_for_spawn({"tensors": DATASET})


@pytest.fixture(params=START_METHODS)
def start_method(request) -> str:
    return request.param


# --- worker_init_fn and get_worker_info ---------------------------------------------------------------------
def test_worker_init_fn(start_method):
    """torch: TestDataLoader.test_worker_init_fn: an init that seeds torch with 12345 runs before any sample. With
    per-sample seeding off: on (the default for a dataset class of your own), each sample is loaded under seeds of
    its own, which replace what the init set (docs/porting.md)."""
    with local(pd.InitialSeed(4), start_method, batch_size=2, producer_init=pd.seed_12345,
               seed_per_sample=False) as loader:
        seeds = [int(s) for batch in loader for s in batch]
    assert seeds == [12345] * 4


def test_error_in_init(start_method, monkeypatch):
    """torch: TestDataLoader.test_error_in_init, its worker_init_fn part: an init that raises makes the loop
    raise a RuntimeError that says "Error in worker_init_fn". sys.stderr writes to fd 2, as in a terminal
    (pytest's capture replaces it; see the next case)."""
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))
    with local(DATASET, start_method, producer_init=pd.fail_in_init) as loader:
        with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
            list(loader)


def test_error_in_init_stderr_elsewhere(monkeypatch, tmp_path):
    """torch: TestDataLoader.test_error_in_init, worker_init_fn part, forked, with the trainer's sys.stderr a
    stream that is not fd 2 (as in Jupyter): the loop's error still says "Error in worker_init_fn"."""
    elsewhere = open(tmp_path / "stderr.txt", "w")
    monkeypatch.setattr(sys, "stderr", elsewhere)
    try:
        with local(DATASET, "fork", producer_init=pd.fail_in_init) as loader:
            with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
                list(loader)
    finally:
        elsewhere.close()


def test_worker_init_fn_forkserver():
    """torch: TestDataLoader.test_worker_init_fn_forkserver, under spawn (the same pickling, without starting a
    forkserver that would outlive the case): an init defined inside a function cannot reach a new
    interpreter, and the loader says so by raising, naming the pickling. (DataLoader warns "Got pickle error"
    and raises at the first batch; Ferry raises when the loader is built.)"""
    def local_init_fn(worker_id):
        torch.manual_seed(12345)

    with pytest.raises(Exception, match="pickle"):
        with local(pd.InitialSeed(4), "spawn", batch_size=2, producer_init=local_init_fn) as loader:
            next(iter(loader))


def test_error_in_init_iterable():
    """torch: TestDataLoader.test_error_in_init, its IterableDataset part: an __iter__ that raises makes the
    loop raise its RuntimeError."""
    class Failing(IterableDataset):
        def __iter__(self):
            raise RuntimeError("Error in __iter__")

    with pytest.raises(RuntimeError, match="Error in __iter__"):
        with RemoteLoader(dataset=Failing(), local_producers=2, **COMMON) as loader:
            list(loader)


def test_get_worker_info(start_method):
    """torch: TestDataLoader.test_get_worker_info: get_worker_info() is None in the trainer; in each producer's
    init it gives the producer's id, the count, its seed and its own copy of the dataset, which the init marks
    with [id, pid]; every batch carries the mark of the producer with that pid; the trainer's dataset is never
    marked. (The original runs this in a spawned child only to survive a hang.)"""
    assert get_worker_info() is None
    dataset = pd.WorkerValue(6, parties=2)
    with local(dataset, start_method, batch_size=2, producer_init=pd.check_worker_info, **ONE_AT_A_TIME) as loader:
        marks = torch.cat(list(loader), 0)
        pids = local_producer_pids(loader)
    assert len(marks) == 6
    for worker_id, pid in marks.tolist():
        assert pids[worker_id] == pid, f"batch marked by producer {worker_id} with pid {pid}, not {pids[worker_id]}"
    assert {w for w, _ in marks.tolist()} == {0, 1}, "both producers served"
    assert get_worker_info() is None
    assert not hasattr(dataset, "value")
    with pytest.raises(AttributeError):
        dataset[0]


# --- seeds --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", BULK_START_METHODS)
def test_worker_seed(method):
    """torch: TestDataLoader.test_worker_seed: 6 workers, 6 samples each held at a barrier until all 6 are
    asked for: 6 different initial seeds. With the default threads and slots: a loader deals its first tasks
    one per producer, as DataLoader hands them to each worker in turn."""
    with local(pd.SeedsAfterBarrier(6, parties=6), method, local_producers=6, batch_size=1) as loader:
        seeds = {int(batch[0]) for batch in loader}
    assert len(seeds) == 6


@pytest.mark.parametrize("method", BULK_START_METHODS)
def test_worker_seed_reproducibility(method):
    """torch: TestDataLoader.test_worker_seed_reproducibility: the same generator gives the same worker seeds."""
    def seeds() -> set[int]:
        with local(pd.SeedsAfterBarrier(6, parties=6), method, local_producers=6, batch_size=1,
                   generator=torch.Generator().manual_seed(42)) as loader:
            return {int(batch) for batch in loader}

    first = seeds()
    assert len(first) == 6 and first == seeds()


# --- timeouts -----------------------------------------------------------------------------------------------
def test_timeout():
    """torch: TestDataLoader.test_timeout: timeout=1 and a first sample that takes longer: the loop raises a
    RuntimeError "timed out after 1 seconds" instead of waiting. (1.5 s here for the original's 3 s.)"""
    with local(pd.SlowFirst(10, 1.5), "fork", batch_size=2, timeout=1) as loader:
        with pytest.raises(RuntimeError, match=r"timed out after \d+ seconds"):
            next(iter(loader))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_ind_worker_queue(method):
    """torch: TestIndividualWorkerQueue.test_ind_worker_queue: worker_init_fn is a bound method of the dataset
    that records the worker id on it; batches come in order, each made by one worker, with the id its init
    recorded on the very copy that serves. (DataLoader's fixed round-robin of batches over workers does not
    apply: Ferry gives each batch to whichever producer has a free slot.) The original's timeout=5 is
    DataLoader's limit on each batch; its workers fork, and a spawned producer's start (a fresh interpreter
    importing torch) can take longer than that on a loaded machine, so the batches are timed once the producers
    are up."""
    dataset, batch_size = pd.WorkerQueue(range(128)), 8
    with local(dataset, method, batch_size=batch_size, timeout=5,
               producer_init=dataset.worker_init_fn) as loader:
        wait_for(lambda: loader.stats()["producers"] == 2, 60, "both producers to start")
        batches = list(loader)
    assert len(batches) == 128 // batch_size
    for i, (worker_ids, samples) in enumerate(batches):
        assert samples.tolist() == list(range(i * batch_size, (i + 1) * batch_size))
        assert len(set(worker_ids.tolist())) == 1 and int(worker_ids[0]) in (0, 1), worker_ids


# --- the start method, and several loaders --------------------------------------------------------------------
def test_multiprocessing_contexts(start_method):
    """torch: TestDataLoaderCUDA.test_multiprocessing_contexts (CPU datasets): CountingDataset(11), 3 workers,
    batches of 3, under each start method: [0..2], [3..5], [6..8], [9, 10]."""
    with local(pd.Items(range(11)), start_method, local_producers=3, batch_size=3) as loader:
        got = list(loader)
    expected = [torch.arange(3), torch.arange(3, 6), torch.arange(6, 9), torch.arange(9, 11)]
    assert len(got) == len(expected) and all(torch.equal(g, e) for g, e in zip(got, expected))


def test_multiprocessing_contexts_objects():
    """torch: TestDataLoaderCUDA.test_multiprocessing_contexts, its context-object part:
    multiprocessing_context=mp.get_context(name) works as the name does."""
    for name in ("fork", "spawn"):
        with local(pd.Items(range(11)), multiprocessing.get_context(name), local_producers=3, batch_size=3) as loader:
            assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]


def test_multiple_dataloaders(start_method):
    """torch: TestDataLoaderCUDA.test_multiple_dataloaders (CPU datasets): a one-worker loader (default start
    method) and a two-worker loader under each start method, their iterators advanced in turn."""
    with local(DATASET, "fork", local_producers=1) as one, local(DATASET, start_method) as two:
        first, second = iter(one), iter(two)
        steps = [next(first), next(first), next(second), next(second), next(first), next(second)]
    expected = [DATASET[i] for i in (0, 1, 0, 1, 2, 2)]
    for (x, y), (ex, ey) in zip(steps, expected):
        assert torch.equal(x[0], ex) and torch.equal(y[0], ey)


# --- producers keep their copy of the dataset (persistent workers) ------------------------------------------
@pytest.mark.parametrize("method", BULK_START_METHODS)
def test_dataset_not_reset(method):
    """torch: TestDataLoaderPersistentWorkers.test_dataset_not_reset, with ``start = 0`` set before the loader
    is built (Ferry's producers take the dataset then): over 10 epochs the producers' copy keeps start=0
    while the trainer's changes."""
    dataset = pd.StartChecked()
    dataset.start = 0
    with local(dataset, method) as loader:
        for epoch in range(10):
            assert sum(len(batch) for batch in loader) == 10
            dataset.start = epoch


def test_dataset_not_reset_start_set_after_build():
    """torch: TestDataLoaderPersistentWorkers.test_dataset_not_reset as written, with ``ferry.DataLoader`` (which takes
    the dataset at the first ``iter()``, as DataLoader): ``start = 0`` is set after the loader is built and before
    the first epoch, and the producers see it; the trainer's later changes do not reach their copy."""
    dataset = pd.StartChecked()
    with ferry.DataLoader(dataset, num_workers=WORKERS, multiprocessing_context="fork", persistent_workers=True,
                          **COMMON) as loader:
        dataset.start = 0
        for epoch in range(2):
            assert sum(len(batch) for batch in loader) == 10
            dataset.start = epoch


def test_growing_dataset():
    """torch: TestDataLoader.test_growing_dataset, with ``ferry.DataLoader``: len() follows a dataset that grew after
    the loader was built, sequential and shuffled (RemoteLoader takes its dataset when built: its len() is fixed)."""
    dataset = [torch.ones(4) for _ in range(4)]
    with ferry.DataLoader(dataset, shuffle=False, num_workers=WORKERS, **COMMON) as sequential, \
            ferry.DataLoader(dataset, shuffle=True, num_workers=WORKERS, **COMMON) as shuffled:
        dataset.append(torch.ones(4))
        assert len(sequential) == 5 and len(shuffled) == 5
        assert sorted(int(b.shape[0]) for b in shuffled) == [1] * 5


# --- what an init may change in its process -----------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="os.sched_setaffinity is not available")
@pytest.mark.parametrize("method", BULK_START_METHODS)
def test_set_affinity_in_worker_init(method):
    """torch: TestSetAffinity.test_set_affinity_in_worker_init (map-style: the original's IterableDataset is
    incidental to it): an init that pins its process to one CPU; every sample is loaded on that CPU only."""
    expected = max(os.sched_getaffinity(0))
    with local(pd.Affinity(), method, batch_size=1, producer_init=pd.pin_to_last_cpu) as loader:
        allowed = [batch.tolist() for batch in loader]
    assert allowed == [[[expected]]] * 4


# --- order ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", BULK_START_METHODS)
def test_in_order_index_ds(method):
    """torch: TestOutOfOrderDataLoader.test_in_order_index_ds: in_order=True and a slow first sample (0.5 s for
    the original's 1 s: nothing here depends on how slow): batches
    still come as 0..9. (The original's worker ids [0, 1, 0, 1, ...] are DataLoader's fixed round-robin, which
    does not apply: Ferry gives each batch to whichever producer has a free slot; the ids are valid ones.)"""
    with local(pd.SlowIndex(10, slow_index=0, seconds=0.5), method, in_order=True, **ONE_AT_A_TIME) as loader:
        outputs = [(int(w), int(i)) for w, i in loader]
    assert [i for _, i in outputs] == list(range(10))
    assert {w for w, _ in outputs} <= {0, 1}


@pytest.mark.parametrize("method", BULK_START_METHODS)
def test_out_of_order_index_ds(method):
    """torch: TestOutOfOrderDataLoader.test_out_of_order_index_ds: in_order=False and a slow sample 0 (1 s, as the
    original: the other producer's first batch must come before it, on a loaded machine too): the other
    batches overtake it (not 0..9; sample 0 is not first), and every sample comes once. (The exact order the
    original expects follows from DataLoader's prefetch_factor=2 per worker, which does not apply.)"""
    with local(pd.SlowIndex(10, slow_index=0, seconds=1.0), method, in_order=False, **ONE_AT_A_TIME) as loader:
        data = [int(i) for _, i in loader]
    assert data != list(range(10)) and data[0] != 0
    assert sorted(data) == list(range(10))


def test_in_order_iterable_ds():
    """torch: TestOutOfOrderDataLoader.test_in_order_iterable_ds: an IterableDataset split by get_worker_info(),
    2 workers, worker 1's first sample slow (1 s): in order, the workers' batches alternate all the same."""
    with RemoteLoader(dataset=pd.SlowHalf(), local_producers=2, in_order=True, **COMMON) as loader:
        outputs = [(int(w), int(i)) for w, i in loader]
    assert [w for w, _ in outputs] == [0, 1] * 5
    assert [i for _, i in outputs] == [0, 5, 1, 6, 2, 7, 3, 8, 4, 9]


def test_out_of_order_iterable_ds():
    """torch: TestOutOfOrderDataLoader.test_out_of_order_iterable_ds: the same, with in_order=False: worker 0's
    five batches all come while worker 1's first is slow, then worker 1's."""
    with RemoteLoader(dataset=pd.SlowHalf(), local_producers=2, in_order=False, **COMMON) as loader:
        outputs = [(int(w), int(i)) for w, i in loader]
    assert [w for w, _ in outputs] == [0] * 5 + [1] * 5
    assert [i for _, i in outputs] == list(range(10))

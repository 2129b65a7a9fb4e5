"""DataLoader's attributes and meanings (issue 18, part 4): what a training script written for DataLoader reads and
relies on means the same with RemoteLoader. One test (or more) per row of the issue's table, each of which
failed before its fix:

* a user's ``sampler.set_epoch(e)`` (torchvision calls it, also after ``--resume``) is the epoch planned; a
  conflict with ``loader.set_epoch`` or ``load_state_dict`` is an error naming both;
* ``timeout=`` is DataLoader's limit on each batch (a RuntimeError past it); ``no_producer_timeout`` keeps
  Ferry's own meaning;
* ``loader.dataset``, ``sampler``, ``batch_sampler``, ``collate_fn``, ``generator``, ``batch_size``, ``drop_last``
  are readable and cannot be assigned;
* ``shuffle=True, generator=g`` gives DataLoader's order, epoch after epoch;
* ``mp_context`` takes a ``multiprocessing`` context object as well as a name, and is refused without local
  producers;
* more local producers than usable CPUs warns, as DataLoader does.

Real producer processes (forked, one spawned) and real sockets; the CPU count alone is mocked in its unit test.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

import ferry
from ferry import ConfigError, ConfigTypeError, NoProducersError, RemoteLoader
from ferry.common.constants import DEFAULT_TIMEOUT_S
from ferry.common.plan import GeneratorOrder, build_plan
from ferry.consumer.planning import SamplerEpoch

from . import parity_datasets as pd
from .helpers import wait_for

#: what every loader here shares: fast heartbeats, no progress lines, forked producers
QUIET = {"heartbeat": 0.2, "log_every": None, "mp_context": "fork"}

#: set to 1 by a test, in this process only: a forked producer inherits the change, a spawned one imports this
#: module afresh and sees 0
FORKED_MARK = 0


class StartMethodProbe:
    """Every sample is ``FORKED_MARK`` as the loading process sees it: 1 forked, 0 spawned."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        return FORKED_MARK


def flat(loader) -> list[int]:
    """One epoch of a loader over ``Items(range(n))``, its samples in the order they came."""
    return [int(i) for batch in loader for i in batch]


def distributed_order(n: int, epoch: int, seed: int) -> list[int]:
    sampler = DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def dataloader_orders(n: int, epochs: int, seed: int) -> list[list[int]]:
    """``DataLoader(shuffle=True, generator=Generator().manual_seed(seed))``'s samples, epoch by epoch."""
    loader = DataLoader(pd.Items(range(n)), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    return [[int(i) for batch in loader for i in batch] for _ in range(epochs)]


# --- a user's sampler.set_epoch -----------------------------------------------------------------------------
def test_the_epoch_a_distributed_sampler_was_given_is_the_epoch_planned_also_after_a_resume():
    """torchvision's loop after ``--resume`` (start_epoch 5): ``train_sampler.set_epoch(epoch)`` before each
    epoch. The loader's own counter starts at 0; the sampler's epoch wins, and the loader follows it."""
    dataset = pd.Items(range(20))
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3)
    with RemoteLoader(dataset=dataset, local_producers=1, sampler=sampler, batch_size=4, **QUIET) as loader:
        for epoch in (5, 6):
            sampler.set_epoch(epoch)
            assert loader.epoch == epoch
            assert flat(loader) == distributed_order(20, epoch, seed=3), f"epoch {epoch}"
        assert loader.state_dict()["epoch"] == 7
        # a script that never calls set_epoch itself: the loader still gives its sampler each epoch in turn
        assert flat(loader) == distributed_order(20, 7, seed=3) and sampler.epoch == 7


def test_a_sampler_epoch_given_before_the_loader_was_built_counts():
    dataset = pd.Items(range(12))
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=1)
    sampler.set_epoch(4)
    with RemoteLoader(dataset=dataset, local_producers=1, sampler=sampler, batch_size=4, **QUIET) as loader:
        assert loader.epoch == 4 and flat(loader) == distributed_order(12, 4, seed=1)


def test_a_sampler_epoch_that_conflicts_with_the_loaders_is_an_error_naming_both(endpoint):
    """No producer is needed: the conflict is found before anything is planned."""
    sampler = DistributedSampler(range(12), num_replicas=1, rank=0, shuffle=True, seed=1)
    with RemoteLoader(endpoint=endpoint, sampler=sampler, batch_size=4, heartbeat=0.2) as loader:
        sampler.set_epoch(5)
        with pytest.raises(ConfigError, match=r"sampler\.set_epoch\(5\).*loader\.set_epoch\(3\)"):
            loader.set_epoch(3)  # the sampler was given another epoch first: refused at once
        loader.set_epoch(5)  # the same epoch on both is no conflict
        assert loader.epoch == 5
    sampler = DistributedSampler(range(12), num_replicas=1, rank=0, shuffle=True, seed=1)
    with RemoteLoader(endpoint=endpoint, sampler=sampler, batch_size=4, heartbeat=0.2) as loader:
        loader.set_epoch(3)
        sampler.set_epoch(5)  # the other order: found when the next epoch is planned
        with pytest.raises(ConfigError, match=r"sampler\.set_epoch\(5\).*loader\.set_epoch\(3\)"):
            iter(loader)
    sampler = DistributedSampler(range(12), num_replicas=1, rank=0, shuffle=True, seed=1)
    with RemoteLoader(endpoint=endpoint, sampler=sampler, batch_size=4, heartbeat=0.2) as loader:
        state = json.loads(json.dumps(dict(loader.state_dict(), epoch=2, batches_delivered=1)))
        loader.load_state_dict(state)
        sampler.set_epoch(5)
        with pytest.raises(ConfigError, match=r"sampler\.set_epoch\(5\).*load_state_dict.*epoch 2"):
            iter(loader)


def test_the_epoch_is_read_from_a_batch_samplers_own_sampler_and_only_a_change_counts():
    """A unit: which epoch counts as the script's own (consumer/planning.py: SamplerEpoch)."""
    inner = DistributedSampler(range(8), num_replicas=1, rank=0, shuffle=True, seed=0)
    epochs = SamplerEpoch(None, BatchSampler(inner, 2, False))
    assert epochs.given() is None, "DistributedSampler's own start (0) is no epoch given"
    inner.set_epoch(3)
    assert epochs.given() == 3
    epochs.planned(3)  # the loader planned it (and gave it to the sampler)
    assert epochs.given() is None
    inner.set_epoch(4)
    assert epochs.given() == 4
    unreadable = SamplerEpoch(SequentialSampler(range(8)), None)  # no epoch to read: nothing can be given
    assert unreadable.given() is None


# --- timeout ------------------------------------------------------------------------------------------------
def test_timeout_is_a_limit_on_each_batch_then_a_runtime_error():
    """DataLoader's test_timeout: timeout=1 and a 3 s batch (here 0.5 s and 1.5 s): a RuntimeError naming the
    limit, as DataLoader's "DataLoader timed out after 1 seconds". The batch is not lost: once it is staged,
    the next call returns it, and the epoch goes on in order."""
    one_at_a_time = {"producer_threads": 1, "producer_slots": 1}
    with RemoteLoader(dataset=pd.SlowFirst(6, 1.5), local_producers=1, batch_size=2, timeout=0.5, **one_at_a_time,
                      **QUIET) as loader:
        assert loader.timeout == 0.5 and loader.no_producer_timeout == DEFAULT_TIMEOUT_S
        it = iter(loader)
        began = time.monotonic()
        with pytest.raises(RuntimeError, match=r"^RemoteLoader timed out after 0.5 seconds") as info:
            next(it)
        assert isinstance(info.value, ferry.BatchTimeoutError) and "batch 0 of epoch 0" in str(info.value)
        assert time.monotonic() - began >= 0.5
        wait_for(lambda: loader.stats()["buffered"] >= 1, 30, "the slow batch to arrive")
        assert [int(i) for i in next(it)] == [0, 1]
        assert [int(i) for batch in it for i in batch] == [2, 3, 4, 5]


def test_timeout_zero_is_no_limit_and_a_slow_batch_returns_normally():
    with RemoteLoader(dataset=pd.SlowFirst(4, 1.0), local_producers=1, batch_size=2, timeout=0,
                      producer_threads=1, producer_slots=1, **QUIET) as loader:
        assert loader.timeout == 0
        assert flat(loader) == [0, 1, 2, 3]


def test_timeout_counts_even_while_no_producer_is_alive_and_no_producer_timeout_keeps_its_meaning(endpoint):
    """With no producer at all the shorter of the two limits ends the wait, each with its own error. (A dataset
    object says what remote producers must serve, so ``iter()`` plans at once, without waiting for a producer.)"""
    dataset = pd.Items(range(8))
    with RemoteLoader(endpoint=endpoint, dataset=dataset, batch_size=2, heartbeat=0.2, timeout=0.3) as loader:
        with pytest.raises(ferry.BatchTimeoutError, match="timed out after 0.3 seconds"):
            next(iter(loader))
    with RemoteLoader(endpoint=endpoint, dataset=dataset, batch_size=2, heartbeat=0.2, timeout=30,
                      no_producer_timeout=0.3) as loader:
        with pytest.raises(NoProducersError, match=r"no_producer_timeout=0.3"):
            next(iter(loader))


# --- attributes ---------------------------------------------------------------------------------------------
def collate_tens(samples):
    return torch.tensor(samples) * 10


def test_dataloader_attributes_are_readable_and_cannot_be_assigned():
    """torchvision's evaluate() reads ``data_loader.dataset``; DataLoader refuses to assign these (ValueError)."""
    dataset, generator = pd.Items(range(12)), torch.Generator()
    sampler = SequentialSampler(dataset)
    with RemoteLoader(dataset=dataset, local_producers=1, batch_size=3, sampler=sampler, drop_last=True,
                      collate_fn=collate_tens, generator=generator, **QUIET) as loader:
        assert loader.dataset is dataset and loader.sampler is sampler and loader.batch_sampler is None
        assert loader.collate_fn is collate_tens and loader.generator is generator
        assert loader.batch_size == 3 and loader.drop_last is True
        for name in ("dataset", "batch_size", "sampler", "batch_sampler", "drop_last", "collate_fn", "generator"):
            with pytest.raises(ValueError, match=rf"RemoteLoader\.{name} cannot be changed"):
                setattr(loader, name, {})
        assert [b.tolist() for b in loader] == [[0, 10, 20], [30, 40, 50], [60, 70, 80], [90, 100, 110]]
    batches = [[0, 1], [2]]
    with RemoteLoader(dataset="synthetic", dataset_args={"length": 4, "shape": [2]}, local_producers=1,
                      batch_sampler=batches, **QUIET) as loader:
        assert loader.dataset == "synthetic" and loader.batch_sampler is batches and loader.batch_size is None
        assert loader.collate_fn is None and loader.generator is None and loader.sampler is None


# --- shuffle with a generator -------------------------------------------------------------------------------
def test_shuffle_with_a_generator_gives_dataloaders_order_epoch_after_epoch():
    # DataLoader draws the same numbers from its generator whatever num_workers is (each iteration: its workers'
    # base seed, then RandomSampler's randperm), so num_workers=0 stands for all
    expected = dataloader_orders(22, epochs=3, seed=7)
    generator = torch.Generator().manual_seed(7)
    with RemoteLoader(dataset=pd.Items(range(22)), local_producers=2, batch_size=4, shuffle=True,
                      generator=generator, **QUIET) as loader:
        assert [flat(loader) for _ in range(3)] == expected
        # an epoch reached by set_epoch is the same epoch
        loader.set_epoch(1)
        assert flat(loader) == expected[1]
        first = iter(loader)  # epoch 2: two batches, then save
        taken = [int(i) for _ in range(2) for i in next(first)]
        state = json.loads(json.dumps(loader.state_dict()))
    assert taken == expected[2][:8]
    # the loader drew one number from the generator (DataLoader's first draw), no more, however many epochs
    reference = torch.Generator().manual_seed(7)
    torch.empty((), dtype=torch.int64).random_(generator=reference)
    assert torch.equal(generator.get_state(), reference.get_state())
    # a resume, in a new loader with a generator in the same state: the rest of epoch 2
    with RemoteLoader(dataset=pd.Items(range(22)), local_producers=1, batch_size=4, shuffle=True,
                      generator=torch.Generator().manual_seed(7), **QUIET) as resumed:
        resumed.load_state_dict(state)
        assert flat(resumed) == expected[2][8:]


def test_generator_order_on_several_ranks_is_dataloaders_permutation_split_as_distributed_sampler_splits():
    """A unit (common/plan.py: GeneratorOrder): rank r of 2 gets DistributedSampler's share of the permutation
    DataLoader draws, padded to an even split; an epoch replayed afresh equals the one reached in turn."""
    expected = dataloader_orders(11, epochs=3, seed=5)
    order = GeneratorOrder(torch.Generator().manual_seed(5).get_state())
    assert order.permutation(2, 11).tolist() == expected[2]  # a jump: epochs 0 and 1 replayed
    for epoch in range(3):
        padded = expected[epoch] + expected[epoch][:1]  # 11 samples over 2 ranks: 6 each
        for rank in range(2):
            plan = build_plan(epoch=epoch, dataset_len=11, batch_size=4, shuffle=True, seed=0, drop_last=False,
                              rank=rank, world_size=2, order=order.permutation(epoch, 11))
            assert [i for s in range(len(plan)) for i in plan.batch(s)] == padded[rank::2]


# --- mp_context ---------------------------------------------------------------------------------------------
def test_mp_context_takes_a_context_object_and_its_start_method_is_used(monkeypatch):
    monkeypatch.setattr(f"{__name__}.FORKED_MARK", 1)
    for method, mark in (("fork", 1), ("spawn", 0)):
        context = multiprocessing.get_context(method)
        with RemoteLoader(dataset=StartMethodProbe(), local_producers=1, batch_size=2, heartbeat=0.2,
                          log_every=None, mp_context=context) as loader:
            assert loader.local.mp_context is context
            assert [int(i) for batch in loader for i in batch] == [mark, mark], method


def test_mp_context_that_is_neither_a_name_nor_a_context_or_without_local_producers_is_refused(endpoint):
    with pytest.raises(ConfigTypeError, match=r"mp_context must be a start method name .* or a multiprocessing "
                                              r"context, got <object"):
        RemoteLoader(dataset=pd.Items(range(4)), local_producers=1, mp_context=object())
    with pytest.raises(ConfigError, match=r"mp_context must be one of"):
        RemoteLoader(dataset=pd.Items(range(4)), local_producers=1, mp_context="bad")
    for options in ({"local_producers": 0}, {"endpoint": endpoint}):
        for context in ("spawn", multiprocessing.get_context("spawn")):
            with pytest.raises(ConfigError, match=r"mp_context applies to local producers"):
                RemoteLoader(dataset=pd.Items(range(4)), mp_context=context, **options)


# --- more producers than CPUs -------------------------------------------------------------------------------
def test_more_local_producers_than_usable_cpus_warns_as_dataloader_does(monkeypatch):
    """The CPUs this process may use are mocked to one: two producers are then one too many (not 1000)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    with pytest.warns(UserWarning, match=r"will start 2 local producer processes.*1 CPU.*excessive") as caught:
        RemoteLoader(dataset=pd.Items(range(4)), local_producers=2, **QUIET).close()
    assert caught[0].filename == __file__, "the warning names the script's line that built the loader"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        RemoteLoader(dataset=pd.Items(range(4)), local_producers=2, **QUIET).close()
    assert not [w for w in quiet if "excessive" in str(w.message)]

"""Acceptance 1: RemoteLoader yields exactly DataLoader(DistributedSampler) batches, over real producers.

Producer groups are started once per module, *before* any consumer, and serve one consumer after another
on the same endpoint: that also proves that running producers move on to a new consumer by themselves.
"""

import itertools

import pytest

from ferry import RemoteLoader
from tests.datasets import DictDataset, PairDataset

from .helpers import ProducerProcess, assert_tree_equal, free_port, reference_batches, wait_for

DATASETS = {
    "pair": ("tests.datasets:PairDataset", {"length": 50}, PairDataset(length=50)),
    "dict": ("tests.datasets:DictDataset", {"length": 38}, DictDataset(length=38)),
}


@pytest.fixture(scope="module")
def groups():
    started: dict[tuple[str, int], tuple[str, list[ProducerProcess]]] = {}

    def get(name: str, count: int) -> str:
        if (name, count) not in started:
            endpoint = f"tcp://127.0.0.1:{free_port()}"
            spec, args, _ = DATASETS[name]
            started[(name, count)] = (endpoint, [ProducerProcess(endpoint, spec, args) for _ in range(count)])
        return started[(name, count)][0]

    yield get
    for _, processes in started.values():
        for process in processes:
            process.close()


@pytest.mark.parametrize("name", ["pair", "dict"])
@pytest.mark.parametrize("world_size, producers, drop_last", list(itertools.product([1, 2], [1, 3], [False, True])))
def test_batches_equal_dataloader_with_distributed_sampler(groups, name, world_size, producers, drop_last):
    endpoint = groups(name, producers)
    dataset = DATASETS[name][2]
    batch_size = 8 if name == "pair" else 5  # divides neither length, nor any rank's share
    for rank in range(world_size):
        with RemoteLoader(endpoint=endpoint, batch_size=batch_size, shuffle=True, seed=17, drop_last=drop_last,
                          rank=rank, world_size=world_size, heartbeat=0.2, timeout=30) as loader:
            wait_for(lambda: loader.stats()["producers"] == producers, 20, f"{producers} producers to join")
            for epoch in (0, 1):
                loader.set_epoch(epoch)
                expected = reference_batches(dataset, batch_size=batch_size, drop_last=drop_last,
                                             world_size=world_size, rank=rank, shuffle=True, seed=17, epoch=epoch)
                got = list(loader)
                assert len(loader) == len(expected)
                assert len(got) == len(expected), f"rank {rank} epoch {epoch}"
                for seq, (g, e) in enumerate(zip(got, expected)):
                    assert_tree_equal(g, e, f"rank {rank} epoch {epoch} batch {seq}")
            stats = loader.stats()
            served = [p for p in stats["per_producer"].values() if p["batches"] > 0]
            assert len(served) == producers, f"every producer should get work: {stats['per_producer']}"
            assert stats["invalid_messages"] == 0 and stats["duplicates"] == 0


def test_epochs_differ_and_advance_without_set_epoch(groups):
    endpoint = groups("pair", 1)
    with RemoteLoader(endpoint=endpoint, batch_size=10, shuffle=True, seed=3, heartbeat=0.2, timeout=30) as loader:
        first = [b[1].tolist() for b in loader]
        second = [b[1].tolist() for b in loader]
    dataset = DATASETS["pair"][2]
    for epoch, got in enumerate([first, second]):
        expected = reference_batches(dataset, batch_size=10, drop_last=False, world_size=1, rank=0, shuffle=True,
                                     seed=3, epoch=epoch)
        assert got == [e[1].tolist() for e in expected]
    assert first != second


def test_shuffle_false_is_sequential(groups):
    endpoint = groups("pair", 3)
    with RemoteLoader(endpoint=endpoint, batch_size=8, shuffle=False, heartbeat=0.2, timeout=30) as loader:
        labels = [b[1].tolist() for b in loader]
    assert labels == [list(range(i, min(i + 8, 50))) for i in range(0, 50, 8)]


def test_user_batch_sampler_is_honoured(groups):
    endpoint = groups("pair", 3)
    batches = [[49, 0, 3], [7], [2, 2, 2, 2], [10, 11]]
    with RemoteLoader(endpoint=endpoint, batch_sampler=batches, heartbeat=0.2, timeout=30) as loader:
        assert len(loader) == 4
        got = list(loader)
    dataset = DATASETS["pair"][2]
    for g, indices in zip(got, batches):
        assert g[1].tolist() == indices
        assert (g[0].numpy() == [dataset[i][0] for i in indices]).all()


def test_user_sampler_is_batched(groups):
    from torch.utils.data import SubsetRandomSampler
    import torch

    endpoint = groups("pair", 1)
    sampler = SubsetRandomSampler(list(range(0, 50, 3)), generator=torch.Generator().manual_seed(5))
    order = list(SubsetRandomSampler(list(range(0, 50, 3)), generator=torch.Generator().manual_seed(5)))
    with RemoteLoader(endpoint=endpoint, sampler=sampler, batch_size=4, heartbeat=0.2, timeout=30) as loader:
        got = [b[1].tolist() for b in loader]
    assert got == [order[i:i + 4] for i in range(0, len(order), 4)]


def test_out_of_order_mode_delivers_every_batch_once(groups):
    endpoint = groups("pair", 3)
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, in_order=False, heartbeat=0.2,
                      timeout=30) as loader:
        got = sorted(tuple(b[1].tolist()) for b in loader)
    expected = reference_batches(DATASETS["pair"][2], batch_size=4, drop_last=False, world_size=1, rank=0,
                                 shuffle=True, seed=0, epoch=0)
    assert got == sorted(tuple(e[1].tolist()) for e in expected)

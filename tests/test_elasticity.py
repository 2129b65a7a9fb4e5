"""Acceptance 3: start order does not matter, and a producer joining mid-epoch gets work."""

import pytest

from ferry import RemoteLoader

from .helpers import wait_for


def labels(loader):
    return [b[1].tolist() for b in loader]


def test_producer_started_before_consumer(endpoint, spawn):
    producer = spawn(endpoint, "tests.datasets:PairDataset", {"length": 30})
    wait_for(lambda: "serving tests.datasets:PairDataset" in producer.output(), 20, "the producer's banner")
    with RemoteLoader(endpoint=endpoint, batch_size=7, heartbeat=0.2, timeout=30) as loader:
        assert labels(loader) == [list(range(i, min(i + 7, 30))) for i in range(0, 30, 7)]


def test_producer_started_after_consumer(endpoint, spawn):
    with RemoteLoader(endpoint=endpoint, batch_size=7, heartbeat=0.2, timeout=30) as loader:
        spawn(endpoint, "tests.datasets:PairDataset", {"length": 30})
        assert len(loader) == 5  # waits for the first HELLO to learn the length
        assert labels(loader) == [list(range(i, min(i + 7, 30))) for i in range(0, 30, 7)]


def test_producer_joining_mid_epoch_gets_work(endpoint, spawn):
    args = {"length": 160, "delay": 0.01}
    first = spawn(endpoint, "tests.datasets:PidDataset", args, threads=1, slots=1)
    served_by: list[int] = []
    got: list[list[int]] = []
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=1, heartbeat=0.2, timeout=30) as loader:
        second = None
        for x, index, pid in loader:
            got.append(index.tolist())
            served_by.append(int(pid[0]))
            if len(got) == 3:
                second = spawn(endpoint, "tests.datasets:PidDataset", args, threads=1, slots=1)
        assert second is not None
    assert set(served_by[:3]) == {first.pid}
    assert served_by.count(second.pid) > 0, "the producer that joined mid-epoch got no work"
    from tests.datasets import PairDataset
    from .helpers import reference_batches

    expected = reference_batches(PairDataset(160), batch_size=4, drop_last=False, world_size=1, rank=0,
                                 shuffle=True, seed=1, epoch=0)
    assert got == [e[1].tolist() for e in expected]


@pytest.mark.parametrize("count", [2])
def test_one_producer_serves_two_consumers(spawn, count):
    from .helpers import free_port

    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(count)]
    spawn(endpoints, "tests.datasets:PairDataset", {"length": 20})
    loaders = [RemoteLoader(endpoint=e, batch_size=5, rank=r, world_size=count, heartbeat=0.2, timeout=30)
               for r, e in enumerate(endpoints)]
    try:
        seen = [i for loader in loaders for b in loader for i in b[1].tolist()]
    finally:
        for loader in loaders:
            loader.close()
    assert sorted(seen) == list(range(20))

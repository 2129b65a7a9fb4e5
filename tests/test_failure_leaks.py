"""Nothing leaks on the failure paths either: after NoProducersError, a failed bind, a failover, a loop that
raises, and producers that cannot start, no thread, fd, child process or slab mapping is left."""

import contextlib
import gc
import os
import signal
import socket

import pytest

from ferry import RemoteLoader
from ferry.common.errors import ConfigError, NoProducersError, ProducerStartupError
from ferry.common.datasets import SyntheticDataset

from .helpers import FullLeakCheck, assert_tree_equal, producer_pids, reference_batches, slab_mapped, wait_for

needs_shm = pytest.mark.usefixtures("needs_shared_memory")


def test_no_producers_error_leaves_nothing(endpoint):
    check = FullLeakCheck()
    with pytest.raises(NoProducersError):
        with RemoteLoader(endpoint=endpoint, batch_size=2, dataset_len=10, no_producer_timeout=0.3) as loader:
            next(iter(loader))
    check.assert_clean()


@contextlib.contextmanager
def _port_taken(endpoint: str):
    """Another socket listens on the endpoint's port for the duration: a loader cannot bind it."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])))
        holder.listen(1)
        yield
    finally:
        holder.close()


def test_a_failed_bind_leaves_nothing(endpoint):
    with _port_taken(endpoint):
        check = FullLeakCheck()
        with pytest.raises(ConfigError, match="cannot bind"):
            RemoteLoader(endpoint=endpoint, batch_size=2, timeout=5)
        check.assert_clean()


@needs_shm
def test_a_failed_bind_in_local_mode_stops_the_producers_and_frees_the_slab(endpoint):
    """The local producers and the slab exist before the bind: a failed bind must take them down too."""
    with _port_taken(endpoint):
        check = FullLeakCheck()
        with pytest.raises(ConfigError, match="cannot bind"):
            RemoteLoader(endpoint=endpoint, dataset="synthetic", dataset_args={"length": 8}, local_producers=2,
                         batch_size=2, timeout=5)
        check.assert_clean()


def test_producers_that_cannot_start_leave_nothing():
    check = FullLeakCheck()
    with pytest.raises(ProducerStartupError, match="exited"):
        with RemoteLoader(dataset="tests.no_such_module:Nothing", local_producers=2, batch_size=2,
                          heartbeat=0.1, timeout=30) as loader:
            next(iter(loader))
    check.assert_clean()


@needs_shm
def test_a_failover_in_local_mode_leaves_nothing():
    args = {"length": 64, "shape": [8, 8], "delay": 0.01}
    dataset = SyntheticDataset(**args)
    expected = reference_batches(dataset, batch_size=4, drop_last=False, world_size=1, rank=0, shuffle=False,
                                 seed=0, epoch=0)
    check = FullLeakCheck()
    with RemoteLoader(dataset="synthetic", dataset_args=args, local_producers=2, batch_size=4, heartbeat=0.1,
                      liveness=3, timeout=30) as loader:
        wait_for(lambda: loader.stats()["producers"] == 2, 20, "2 producers")
        assert slab_mapped() > check.slab_mappings
        got = []
        for seq, batch in enumerate(loader):
            got.append(batch)
            if seq == 2:
                busy = wait_for(lambda: [pid for name, pid in producer_pids(loader).items()
                                         if loader.stats()["per_producer"][name]["in_flight"]], 10, "a busy producer")
                os.kill(busy[0], signal.SIGKILL)
        for seq, (g, e) in enumerate(zip(got, expected)):
            assert_tree_equal(g, e, f"batch {seq}")
        assert len(got) == len(expected) and loader.stats()["reissued"] >= 1
        del got, batch, g
    check.assert_clean()


@needs_shm
def test_a_loop_that_raises_holding_a_batch_keeps_its_memory_until_it_drops_it():
    """Unmapping the slab under a tensor the loop still holds would crash; the mapping goes with the batch."""
    check = FullLeakCheck()
    kept = None
    with pytest.raises(KeyError, match="boom"):
        with RemoteLoader(dataset="synthetic", dataset_args={"length": 40, "shape": [4, 4]}, local_producers=2,
                          batch_size=4, heartbeat=0.1, timeout=30) as loader:
            for i, batch in enumerate(loader):
                if i == 2:
                    kept = batch
                    raise KeyError("boom")
    assert loader.closed and loader.stats()["shared_batches"] >= 1
    del loader, batch  # a closed loader may still hold batches it staged and never yielded: drop it too
    gc.collect()
    expected = SyntheticDataset(length=40, shape=[4, 4])
    assert kept[0].numpy().tolist() == [expected[i][0].tolist() for i in range(8, 12)]  # still readable
    assert slab_mapped() > check.slab_mappings, "the slab was unmapped under a batch the loop still holds"
    del kept
    check.assert_clean()


def test_a_closed_loader_still_referenced_holds_no_batch_and_no_slab():
    """close() drops the batches staged or buffered and never yielded: a loader object that lives on (an
    attribute of a trainer, say) must not keep their memory, or the slab, mapped."""
    check = FullLeakCheck()
    loader = RemoteLoader(dataset="synthetic", dataset_args={"length": 64, "shape": [64, 64]}, local_producers=2,
                          batch_size=4, buffer_batches=6, heartbeat=0.1, timeout=30)
    it = iter(loader)
    next(it)
    wait_for(lambda: loader.stats()["buffered"] >= 3, 30, "batches staged and buffered ahead of the loop")
    loader.close()
    del it
    gc.collect()
    assert slab_mapped() == check.slab_mappings, "a closed loader still maps the slab (batches kept alive)"
    check.assert_clean()
    assert loader.closed  # the object itself is still here

"""Acceptance 4: after close(), nothing Ferry opened is left: threads, fds, child processes."""

import gc
import os

import pytest

from ferry import RemoteLoader
from tests.datasets import PairDataset

from .helpers import LeakCheck, local_folder, local_producer_pids, wait_for


def test_remote_mode_leaves_nothing(endpoint, spawn):
    spawn(endpoint, "tests.datasets:PairDataset", {"length": 40})
    check = LeakCheck()
    loader = RemoteLoader(endpoint=endpoint, batch_size=8, heartbeat=0.2, timeout=30)
    assert len(list(loader)) == 5
    assert any(t.name == "ferry-io" for t in __import__("threading").enumerate())
    loader.close()
    loader.close()  # idempotent
    assert loader.closed
    check.assert_clean()


@pytest.mark.parametrize("dataset", ["synthetic", PairDataset(length=40)], ids=["spec", "object"])
def test_local_mode_leaves_no_producer_even_when_the_loop_raises(dataset):
    check = LeakCheck()
    pids = []
    with pytest.raises(KeyError, match="boom"):
        with RemoteLoader(dataset=dataset, dataset_args={"length": 40} if dataset == "synthetic" else None,
                          local_producers=2, batch_size=4, heartbeat=0.2, timeout=30) as loader:
            pids = local_producer_pids(loader)
            for i, _ in enumerate(loader):
                if i == 2:
                    raise KeyError("boom")
    assert len(pids) == 2
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"producer {pid} outlived its loader"
    check.assert_clean()


def test_garbage_collected_loader_is_closed_by_its_finalizer(endpoint):
    check = LeakCheck()
    loader = RemoteLoader(endpoint=endpoint, batch_size=2, timeout=5)
    folder = None
    del loader
    gc.collect()
    check.assert_clean()
    assert folder is None


def test_close_without_iterating_and_use_after_close(endpoint):
    check = LeakCheck()
    loader = RemoteLoader(endpoint=endpoint, batch_size=2, timeout=5)
    loader.close()
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)
    check.assert_clean()


def test_local_folder_is_removed(tmp_path):
    with RemoteLoader(dataset="synthetic", dataset_args={"length": 8, "shape": [2]}, local_producers=1,
                      batch_size=4, heartbeat=0.2, timeout=30) as loader:
        folder = local_folder(loader)
        assert os.path.isdir(folder)
        assert len(list(loader)) == 2
    wait_for(lambda: not os.path.exists(folder), 5, "the ipc folder to be removed")

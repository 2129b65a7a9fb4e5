"""The producer's fast path: samples read straight into reused batch buffers, with DataLoader's results."""

import os

import numpy as np
import pytest
import zmq

from ferry.common.datasets import NpyFolderDataset
from ferry.common.errors import RemoteSampleError
from ferry import RemoteLoader
from ferry.producer.io.buffers import BufferPool

from .helpers import assert_tree_equal, host_pool, reference_batches


@pytest.fixture
def npy_root(tmp_path):
    rng = np.random.default_rng(0)
    for label in ("cats", "dogs"):
        os.makedirs(tmp_path / label)
        for i in range(13):
            np.save(tmp_path / label / f"{i:03d}.npy", rng.standard_normal((3, 8, 8), dtype=np.float32))
    return tmp_path


def test_npy_folder_fast_path_equals_dataloader(npy_root):
    dataset = NpyFolderDataset(str(npy_root))
    assert dataset.array_layout() == ((3, 8, 8), np.dtype(np.float32))
    with RemoteLoader(dataset="npy-folder", dataset_args={"root": str(npy_root)}, local_producers=2, batch_size=4,
                      shuffle=True, seed=4, heartbeat=0.2, timeout=30) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            got = list(loader)
            expected = reference_batches(dataset, batch_size=4, drop_last=False, world_size=1, rank=0, shuffle=True,
                                         seed=4, epoch=epoch)
            assert len(got) == len(expected) == 7
            for g, e in zip(got, expected):
                assert_tree_equal(g, e)


def test_truncated_and_misshapen_files_name_the_path(npy_root):
    bad = npy_root / "cats" / "005.npy"
    bad.write_bytes(bad.read_bytes()[:-10])
    other = npy_root / "dogs" / "002.npy"
    np.save(other, np.zeros((3, 8, 9), np.float32))
    with RemoteLoader(dataset="npy-folder", dataset_args={"root": str(npy_root)}, local_producers=1, batch_size=26,
                      heartbeat=0.2, timeout=30) as loader:
        with pytest.raises(RemoteSampleError) as info:
            next(iter(loader))
    assert info.value.index == 5 and str(bad) in info.value.message and "truncated" in info.value.message
    with RemoteLoader(dataset="npy-folder", dataset_args={"root": str(npy_root)}, local_producers=1, batch_size=26,
                      on_error="skip", heartbeat=0.2, timeout=30) as loader:
        x, y = next(iter(loader))
        assert x.shape == (24, 3, 8, 8) and loader.stats()["skipped_samples"] == 2
    assert y.tolist() == [0] * 12 + [1] * 12


def test_pool_reuses_a_buffer_only_after_its_send_completed():
    class Tracker:
        done = False

        def wait(self, timeout):
            raise zmq.NotDone

    pool = BufferPool(limit=2)
    a = pool.acquire((4, 4), np.float32)
    tracker = Tracker()
    pool.release(a, tracker)
    b = pool.acquire((4, 4), np.float32)
    assert b is not a  # `a` is still being sent
    tracker.done = True
    assert pool.acquire((4, 4), np.float32) is a
    pool.release(b)
    assert pool.acquire((4, 4), np.float32) is b
    c = pool.acquire((4, 4), np.float32)  # beyond the limit with everything out: a one-off buffer
    assert c is not a and c is not b
    pool.release(c)  # one-offs are not pooled
    assert pool.acquire((4, 4), np.float32) is not c


def test_chunked_batches_land_in_reused_host_buffers_released_by_the_loop(monkeypatch):
    """Batches bigger than the frame bound the loader announces (over the socket) are assembled into pooled
    buffers that return as soon as the loop drops them: no garbage collection needed (no reference cycle
    holds a batch)."""
    from ferry.common.constants import MIN_FRAME_BYTES

    # the loader announces the smallest bound a producer accepts, so that three frames are 8.5 MiB, not 48.5
    monkeypatch.setattr("ferry.consumer.core.greeting.DEFAULT_FRAME_BYTES", MIN_FRAME_BYTES)
    mib = 2 * MIN_FRAME_BYTES / (1 << 20) + 0.5  # three frames per batch
    with RemoteLoader(dataset="synthetic", dataset_args={"length": 12, "shape": [int(mib * (1 << 20))],
                                                         "dtype": "uint8"},
                      local_producers=1, batch_size=1, heartbeat=0.2, timeout=30, shared_memory=False) as loader:
        seen = []
        for index, (x, y) in enumerate(loader):  # sequential: batch k is sample k
            expected = (np.arange(x.shape[1], dtype=np.int64) % 251 + index) % 251
            assert np.array_equal(x[0].numpy(), expected.astype(np.uint8))
            seen.append(x.data_ptr())
            del x
        host = host_pool(loader)
        assert host.reused >= 6, f"pooled buffers were not reused: {host.reused}"
        assert len(set(seen)) < len(seen)

"""Skips are exact: under on_error="skip" a batch that does not collate loses only its odd samples out, and
stats()["skipped_samples"] counts every sample that did not arrive. Without skip, the error names the odd
sample and its file."""

import queue

import numpy as np
import pytest

from ferry import RemoteLoader
from ferry.common import protocol
from ferry.common.errors import RemoteSampleError
from ferry.common.waker import Waker
from ferry.producer.loading.batcher import Batcher, Job
from ferry.producer.loading.samples import sample_file


class Misshapen:
    """24 samples ``(float32[2, 3] filled with i, i)``; the ones in ``bad`` are float32[3, 3]."""

    def __init__(self, bad=(17,), length=24):
        self.bad = set(bad)
        self.length = length
        self.paths = [f"/data/tile-{i:03d}.npy" for i in range(length)]

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return np.full((3 if i in self.bad else 2, 3), i, np.float32), i


class Uncollatable:
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return None, i


@pytest.mark.parametrize("bad", [(17,), (1,), (0,), (9, 12)],
                         ids=["after-the-layout", "in-the-first-batch", "teaches-the-layout", "two"])
def test_skip_drops_only_the_odd_samples_and_counts_them(bad):
    with RemoteLoader(dataset=Misshapen(bad), local_producers=1, batch_size=8, on_error="skip", heartbeat=0.2,
                      timeout=60) as loader:
        for _ in range(2):  # the second epoch runs on the layout the first one taught
            before = loader.stats()["skipped_samples"]
            labels = []
            for x, y in loader:
                assert x.shape[1:] == (2, 3)
                assert (x == y.view(-1, 1, 1).float()).all()
                labels += y.tolist()
            assert sorted(labels) == [i for i in range(24) if i not in bad]
            assert loader.stats()["skipped_samples"] - before == len(bad)


def test_without_skip_the_error_names_the_odd_sample_and_its_file():
    with RemoteLoader(dataset=Misshapen(), local_producers=1, batch_size=8, heartbeat=0.2, timeout=60) as loader:
        it = iter(loader)
        next(it), next(it)
        with pytest.raises(RemoteSampleError) as info:
            next(it)
    assert info.value.index == 17
    assert "/data/tile-017.npy" in info.value.message
    assert "float32[3, 3]" in info.value.message and "float32[2, 3]" in info.value.message


def test_a_batch_lost_whole_under_skip_counts_every_sample():
    with RemoteLoader(dataset=Uncollatable(), local_producers=1, batch_size=4, on_error="skip", heartbeat=0.2,
                      timeout=60) as loader:
        assert list(loader) == []
        assert loader.stats()["skipped_samples"] == 12


def test_the_batcher_reports_one_record_per_dropped_sample():
    done = queue.SimpleQueue()
    waker = Waker()
    batcher = Batcher(Misshapen(bad=(2, 5)), threads=2, batch_workers=1, done=done, waker=waker)
    try:
        batcher.submit(Job(0, 1, 0, 0, 0, list(range(8)), "skip"))
        header = protocol.parse_header(done.get(timeout=30).frames[0])
        assert header["type"] == protocol.BATCH
        assert [e["index"] for e in header["errors"]] == [2, 5]
        batcher.submit(Job(0, 1, 1, 0, 1, list(range(8)), "raise"))
        header = protocol.parse_header(done.get(timeout=30).frames[0])
        assert header["type"] == protocol.FAIL and [e["index"] for e in header["errors"]] == [2, 5]
    finally:
        batcher.close()
        waker.close()


def test_sample_files_come_from_the_dataset_where_it_says():
    class ImageFolderLike:
        samples = [("/a/0.png", 0), ("/a/1.png", 1)]

    class Files:
        files = ["/b/0.npy"]

    class Root:
        path = "/only/a/root"

    assert sample_file(ImageFolderLike(), 1) == "/a/1.png"
    assert sample_file(Files(), 0) == "/b/0.npy"
    assert sample_file(Files(), 3) is None
    assert sample_file(Root(), 0) is None

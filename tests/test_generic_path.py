"""The general path (a user's own Dataset): each sample's arrays go straight into their row of the batch's
destination, and the batches equal DataLoader's / default_collate's exactly, with fallbacks."""

import collections
import os
import queue

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from ferry import RemoteLoader
from ferry.common import protocol
from ferry.common.codec import decode_tree
from ferry.common.shm import SlotWriter, populate
from ferry.common.waker import Waker
from ferry.producer.loading.batcher import Batcher, Job
from ferry.producer.loading.collate import RowLayout, collate

from .helpers import assert_tree_equal, reference_batches
from .test_collate import to_torch


Point = collections.namedtuple("Point", "xy label name")


class UserNpy:
    """Written as users write one: np.load in __getitem__, (array, label) out."""

    def __init__(self, root, n=20, shape=(3, 5, 7), dtype="float32"):
        rng = np.random.default_rng(1)
        self.paths = []
        for i in range(n):
            path = os.path.join(root, f"{i:03d}.npy")
            np.save(path, rng.integers(0, 250, size=shape).astype(dtype))
            self.paths.append(path)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return np.load(self.paths[i]), i % 3


class Nested:
    """Dict samples with two arrays, a torch tensor, numpy and Python scalars and a string."""

    def __len__(self):
        return 18

    def __getitem__(self, i):
        return {"image": np.full((2, 3), i, np.uint8), "pair": (np.arange(4, dtype=np.int16) * i, float(i) / 2),
                "t": torch.full((3,), i, dtype=torch.float64), "flag": bool(i % 2), "k": np.int32(i),
                "name": f"s{i}", "zero_d": np.array(i * 1.5)}


class ShapePerBatch:
    """Consistent shapes within each batch of 4 (unshuffled), different between batches: every batch that
    follows a differently shaped one defeats the learned layout and must still collate correctly."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return np.full((1 + (i // 4) % 2, 3), i, np.float32), i


def batcher_for(dataset, batch_workers=1):
    done = queue.SimpleQueue()
    waker = Waker()
    return Batcher(dataset, threads=2, batch_workers=batch_workers, done=done, waker=waker), done, waker


def run_job(batcher, done, indices, seq=0, slot=None, on_error="raise"):
    batcher.submit(Job(0, 1, seq, 0, seq, list(indices), on_error, slot=slot))
    return done.get(timeout=30)


def decoded(outcome, region=None):
    header = protocol.parse_header(outcome.frames[0])
    assert header["type"] == protocol.BATCH, header
    return decode_tree(header["tree"], [bytearray(f) for f in outcome.frames[1:]], region=region), header


@pytest.mark.parametrize("make", [
    lambda: [(np.ones((2, 3), np.float32) * i, i) for i in range(4)],
    lambda: [Nested()[i] for i in range(5)],
    lambda: [[np.arange(3, dtype=np.uint8) + i, (np.float64(i), "x")] for i in range(3)],
    lambda: [np.array(i, np.int64) for i in range(4)],
    lambda: [Point(np.full(2, i, np.float32), i, "p") for i in range(3)],
    lambda: [(torch.full((2,), i, dtype=torch.bfloat16), i) for i in range(3)],
])
def test_row_layout_assembles_what_default_collate_makes(make):
    samples = make()
    layout = RowLayout.learn(samples[0])
    if layout is None:  # bfloat16: collate's marked bits, left to collate
        assert isinstance(samples[0][0], torch.Tensor) and samples[0][0].dtype == torch.bfloat16
        return
    dests = layout.destinations(len(samples), lambda n: np.empty(n, np.uint8))
    rows = [layout.write(s, dests, row) for row, s in enumerate(samples)]
    batch = layout.assemble(rows, dests)
    assert_tree_equal(to_torch(batch), default_collate(samples))
    assert_tree_equal(to_torch(batch), to_torch(collate(samples)))


def test_a_sample_that_does_not_fit_is_not_written():
    layout = RowLayout.learn((np.zeros(3, np.float32), 1))
    dests = layout.destinations(2, lambda n: np.full(n, 7, np.uint8))
    for odd in [(np.ones(4, np.float32), 1), (np.ones(3, np.float64), 1), (np.ones(3, np.float32), 1.0),
                [np.ones(3, np.float32), 1], (np.ones(3, np.float32), 1, 2)]:
        assert layout.write(odd, dests, 0) is None
    assert (dests[0].view(np.uint8) == 7).all()
    assert RowLayout.learn((None, 1)) is None and RowLayout.learn((1, "x")) is None


def test_batcher_writes_rows_into_a_reused_pooled_buffer(tmp_path):
    dataset = UserNpy(str(tmp_path), n=12)
    batcher, done, waker = batcher_for(dataset)
    try:
        buffers = []
        for seq, indices in enumerate([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [3, 1, 4, 1]]):
            outcome = run_job(batcher, done, indices, seq)
            batch, _ = decoded(outcome)
            assert_tree_equal(to_torch(batch), default_collate([dataset[i] for i in indices]))
            # even the first batch: its first sample teaches the layout, then the rest go into rows
            images = np.frombuffer(outcome.frames[1], np.uint8)
            pooled = outcome.buffer
            assert pooled is not None and images.ctypes.data == pooled.ctypes.data, "not written in place"
            buffers.append(id(pooled))
            batcher.pool.release(outcome.buffer)
        assert len(set(buffers)) == 1, "a fresh batch buffer per batch"
    finally:
        batcher.close()
        waker.close()


def test_batcher_writes_rows_into_the_shared_memory_slot(tmp_path):
    dataset = UserNpy(str(tmp_path), n=8, dtype="uint8")
    batcher, done, waker = batcher_for(dataset)
    region = np.zeros(1 << 16, np.uint8)
    try:
        outcome = run_job(batcher, done, [7, 6, 5, 4], 1, slot=SlotWriter(region))
        batch, header = decoded(outcome, region=region)
        assert "m" in header["tree"]["v"][0], "the images did not go into the slot"
        assert outcome.buffer is None
        assert_tree_equal(to_torch(batch), default_collate([dataset[i] for i in [7, 6, 5, 4]]))
    finally:
        batcher.close()
        waker.close()


@pytest.mark.parametrize("kernel_call", [True, False], ids=["madvise", "touch"])
def test_populate_faults_slab_pages_in_without_changing_them(monkeypatch, kernel_call):
    import resource

    from ferry.common import shm

    monkeypatch.setattr(shm, "_populate_write", kernel_call)
    slab = shm.Slab(2, 4 << 20)
    try:
        mapping = shm.SlabMapping(slab.path)  # a producer's own mapping: its pages fault on first write
        region = mapping.writer((0, 4 << 20)).region
        region[:3] = [1, 2, 3]
        populate(region[1:])
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        region[4096:] = 7  # 1023 pages (reading them would fault them in too: check the contents after)
        assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults < 256
        assert region[:3].tolist() == [1, 2, 3] and not region[3:4096].any()
        later = shm.SlabMapping(slab.path).writer((4 << 20, 4 << 20)).region
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        later[...] = 7
        assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults >= 512, "the control took no faults"
    finally:
        slab.close()


@pytest.mark.parametrize("shared_memory", [True, False])
def test_user_dataset_batches_equal_dataloader_over_epochs(tmp_path, shared_memory):
    dataset = UserNpy(str(tmp_path), n=22)
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, shuffle=True, seed=3, heartbeat=0.2,
                      timeout=60, shared_memory=shared_memory) as loader:
        for epoch in range(3):  # the first batches teach the layout; the later ones take the row path
            loader.set_epoch(epoch)
            got = list(loader)
            expected = reference_batches(dataset, batch_size=4, drop_last=False, world_size=1, rank=0,
                                         shuffle=True, seed=3, epoch=epoch)
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                assert_tree_equal(g, e)
        assert (loader.stats()["shared_batches"] > 0) == shared_memory


class Points:
    """Namedtuple samples: the batch is the same namedtuple, as default_collate makes it."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return Point(np.full(2, i, np.float32), i, f"p{i}")


@pytest.mark.parametrize("dataset", [Nested(), ShapePerBatch(), Points()], ids=["nested", "shape-per-batch", "namedtuple"])
def test_structured_and_changing_samples_equal_dataloader(dataset):
    with RemoteLoader(dataset=dataset, local_producers=1, batch_size=4, heartbeat=0.2, timeout=60) as loader:
        for _ in range(2):
            got = list(loader)
            expected = list(DataLoader(dataset, batch_size=4))
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                assert_tree_equal(g, e)


class RacesOnce:
    """Raises CPython 3.11's spurious AST SystemError on the first load of each sample (as np.load in
    threads sometimes does), then loads fine."""

    def __init__(self):
        self.seen = set()

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i not in self.seen:
            self.seen.add(i)
            raise SystemError("AST constructor recursion depth mismatch (before=36, after=32)")
        return np.full(2, i, np.float32), i


def test_a_load_that_hits_cpythons_ast_race_is_run_again():
    batcher, done, waker = batcher_for(RacesOnce())
    try:
        batch, _ = decoded(run_job(batcher, done, range(8)))
        assert batch[1].tolist() == list(range(8))
    finally:
        batcher.close()
        waker.close()


class PlainSynthetic:
    """SyntheticDataset's samples through ``__getitem__`` only (no read_into): the general path."""

    def __init__(self, inner):
        self.inner = inner
        self.num_classes = inner.num_classes

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner.sample_array(i), i % self.num_classes

    def sample_array(self, i):
        return self.inner.sample_array(i)


def test_general_path_buffers_are_reused_only_after_libzmq_is_done_with_them(endpoint):
    """tests/test_producer_buffers.py's slow-reader check, on rows written by the general path."""
    from ferry.common.datasets import SyntheticDataset

    from . import test_producer_buffers as slow
    from .helpers import pooled_buffer_ids

    dataset = PlainSynthetic(SyntheticDataset(length=64, shape=[1 << 20], dtype="uint8"))
    checked, acquired, pool = slow.serve_slowly_watching_the_pool(endpoint, dataset)
    assert checked == slow.TASKS
    owned = pooled_buffer_ids(pool)
    assert len(acquired) == slow.TASKS, "a batch that did not take the rows path"
    assert sum(1 for i in acquired if i in owned) - len(owned) >= 1, "no pooled buffer was reused"


class _FailingCompressor:
    """A compressor whose every batch fails, as a codec error or a MemoryError would."""

    def apply(self, *args):
        raise RuntimeError("compression failed")

    def close(self):
        pass


def test_a_batch_that_fails_after_its_pooled_buffer_was_taken_gives_it_back():
    """Encoding or compressing can raise after a batch took its pooled buffer (rows written): the FAIL goes out
    and the buffer is back in the pool, or the pool would shrink by one buffer per such failure."""
    done, waker = queue.SimpleQueue(), Waker()
    batcher = Batcher(ShapePerBatch(), threads=2, batch_workers=1, done=done, waker=waker,
                      compressor=_FailingCompressor())
    try:
        for seq in range(3):  # the first batch teaches the layout; the later ones write rows into pooled buffers
            batcher.submit(Job(0, 1, seq, 0, seq, [0, 1, 2, 3], "raise", compress="lz4"))
            outcome = done.get(timeout=30)
            assert outcome.failed and outcome.buffer is None
            assert "compression failed" in protocol.parse_header(outcome.frames[0])["errors"][0]["message"]
        pool = batcher.pool
        assert pool._count and sum(len(free) for free in pool._free.values()) == sum(pool._count.values())
    finally:
        batcher.close()
        waker.close()

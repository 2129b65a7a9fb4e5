"""Local producers hand batches over through the consumer's shared-memory slab (ferry.common.shm): exact batches,
slots that come back as soon as the loop drops a batch, a socket fallback when every slot is held, and no
slot lost for good when a producer dies holding one."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from ferry.common import protocol, shm
from ferry.common.codec import decode_tree, encode_tree
from ferry.common.datasets import SyntheticDataset
from ferry.common.errors import ProtocolError
from ferry import RemoteLoader
from tests.datasets import DictDataset

from .helpers import LeakCheck, assert_epoch_matches, assert_tree_equal, reference_batches, wait_for

pytestmark = pytest.mark.usefixtures("needs_shared_memory")


def slab_state(loader: RemoteLoader) -> dict:
    return loader.stats()["shared_memory"]


@pytest.mark.parametrize("kind", ["fast path (spec)", "collated (object)"])
def test_local_batches_travel_through_shared_memory_and_equal_dataloader(kind):
    check = LeakCheck()
    if kind.startswith("fast"):
        args = {"length": 45, "shape": [3, 17, 5], "dtype": "uint8"}
        dataset, source = SyntheticDataset(**args), dict(dataset="synthetic", dataset_args=args)
    else:
        dataset = DictDataset(length=45)
        source = dict(dataset=dataset)
    with RemoteLoader(**source, local_producers=2, batch_size=4, shuffle=True, seed=3, heartbeat=0.2,
                      timeout=30) as loader:
        count = 0
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            count += assert_epoch_matches(loader, dataset, epoch=epoch, batch_size=4, seed=3)
        stats = loader.stats()
        assert stats["shared_batches"] == stats["received"] == count, stats
        state = slab_state(loader)
        # every slot is back once the loop has dropped its batches: no reference cycle holds one
        assert state["free"] == state["slots"] and state["lost"] == 0, state
    check.assert_clean()


def test_a_loop_that_keeps_every_batch_gets_the_rest_over_the_socket():
    args = {"length": 120, "shape": [64], "dtype": "float32"}
    dataset = SyntheticDataset(**args)
    with RemoteLoader(dataset="synthetic", dataset_args=args, local_producers=1, batch_size=2, buffer_batches=4,
                      heartbeat=0.2, timeout=30) as loader:
        kept = list(loader)  # 60 batches held at once, more than the slab's slots
        slots = slab_state(loader)["slots"]
        assert len(kept) == 60 > slots
        expected = reference_batches(dataset, batch_size=2, drop_last=False, world_size=1, rank=0, shuffle=False,
                                     seed=0, epoch=0)
        for seq, (g, e) in enumerate(zip(kept, expected)):
            assert_tree_equal(g, e, f"batch {seq}")
        shared = loader.stats()["shared_batches"]
        assert slots - 4 <= shared < 60, shared  # the held slots ran out; the others came as frames
        del kept, g
        assert slab_state(loader)["free"] == slots


def test_shared_memory_can_be_turned_off():
    with RemoteLoader(dataset="synthetic", dataset_args={"length": 8, "shape": [4]}, local_producers=1,
                      batch_size=4, heartbeat=0.2, timeout=30, shared_memory=False) as loader:
        assert len(list(loader)) == 2
        assert loader.stats()["shared_memory"] is None and loader.stats()["shared_batches"] == 0


def test_a_producer_killed_while_writing_into_a_slot_loses_no_batch_and_no_slot():
    args = {"length": 96, "shape": [8, 8], "delay": 0.02}
    dataset = SyntheticDataset(**args)
    with RemoteLoader(dataset="synthetic", dataset_args=args, local_producers=2, batch_size=4, shuffle=True,
                      heartbeat=0.1, liveness=3, timeout=30) as loader:
        wait_for(lambda: loader.stats()["producers"] == 2, 20, "2 producers")
        victim = loader._local.pids[0]
        it = iter(loader)
        got = [next(it)]
        wait_for(lambda: any(p["in_flight"] > 0 for name, p in loader.stats()["per_producer"].items()
                             if name.endswith(f":{victim}")), 10, "the victim to hold a task")
        os.kill(victim, signal.SIGKILL)
        got += list(it)
        expected = reference_batches(dataset, batch_size=4, drop_last=False, world_size=1, rank=0, shuffle=True,
                                     seed=0, epoch=0)
        assert len(got) == len(expected)
        for seq, (g, e) in enumerate(zip(got, expected)):
            assert_tree_equal(g, e, f"batch {seq}")
        assert loader.stats()["reissued"] >= 1
        del got, g
        # the dead producer's slots come back once its process is gone (a zombie cannot write any more)
        wait_for(lambda: slab_state(loader)["lost"] == 0 and slab_state(loader)["free"] == slab_state(loader)["slots"],
                 10, "the dead producer's slots to be reclaimed")


def test_process_exists_tells_a_zombie_from_a_live_process():
    assert shm.process_exists(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: not shm.process_exists(child.pid), 10, "the child to exit (a zombie until reaped)")
    child.wait(10)
    assert not shm.process_exists(child.pid)


# --- units: the slab, the slot writer, the codec's "m" leaves, the protocol fields ---------------------
def test_codec_places_leaves_in_a_slot_and_decodes_them_as_views():
    slab = shm.Slab(slots=2, slot_bytes=1 << 16)
    try:
        offset, nbytes = slot = slab.take()
        mapping = shm.SlabMapping(slab.path)  # the producer's view of the same memory
        writer = mapping.writer(slot)
        images = writer.reserve(6 * 4 * 4).view(np.float32).reshape(6, 4)  # written in place, as the fast path does
        images[...] = np.arange(24, dtype=np.float32).reshape(6, 4)
        tree = {"x": images, "y": np.arange(6, dtype=np.int64), "big": np.ones(1 << 16, np.uint8), "s": "k"}
        spec, frames = encode_tree(tree, slot=writer)
        assert "m" in spec["v"][0] and spec["v"][0]["m"] == 0  # referenced where it lies, not copied
        assert "m" in spec["v"][1]  # copied into the slot behind it
        assert "f" in spec["v"][2] and len(frames) == 1  # does not fit: a frame
        region = slab.region(slot)
        decoded = decode_tree(spec, [bytes(f) for f in frames], region=region)
        for key in ("x", "y", "big"):
            assert np.array_equal(decoded[key], tree[key])
        assert decoded["x"].__array_interface__["data"][0] == region.__array_interface__["data"][0]
        assert slab.free == 1
        del region, decoded
        assert slab.free == 2  # the slot is back once the last view is gone
    finally:
        slab.close()


@pytest.mark.parametrize("node, why", [
    ({"t": "a", "d": "<f4", "s": [4], "m": 0}, "none"),
    ({"t": "a", "d": "<f4", "s": [4], "m": 2}, "offset"),
    ({"t": "a", "d": "<f4", "s": [4], "m": -4}, "offset"),
    ({"t": "a", "d": "<f4", "s": [64], "m": 4}, "overruns"),
    ({"t": "a", "d": "<f4", "s": [4], "m": True}, "offset"),
])
def test_slot_leaves_are_validated(node, why):
    region = np.zeros(256, np.uint8) if why != "none" else None
    with pytest.raises(ProtocolError, match=why if why != "none" else "has none"):
        decode_tree(node, [], region=region)


def test_a_slot_outside_the_slab_is_refused_by_the_producer_side():
    slab = shm.Slab(slots=2, slot_bytes=4096)
    try:
        mapping = shm.SlabMapping(slab.path)
        for bad in [(0, 3 * 4096), (8192, 4096), (1, 64)]:
            with pytest.raises(ValueError, match="outside"):
                mapping.writer(bad)
        assert mapping.writer((4096, 4096)).reserve(4097) is None
    finally:
        slab.close()


def test_protocol_checks_the_optional_fields():
    base = dict(session=1, task=1, epoch=0, seq=0, indices=[0], on_error="raise")
    assert protocol.parse_header(protocol.pack(protocol.TASK, **base, slot=[4096, 64]))["slot"] == [4096, 64]
    for bad in ([1], [1, 0], ["a", 1], [-1, 4], "x"):
        with pytest.raises(ProtocolError, match="slot"):
            protocol.parse_header(protocol.pack(protocol.TASK, **base, slot=bad))
    hello = dict(producer="p", nonce=1, host="h", pid=1, slots=2, dataset={"spec": "s", "len": 1, "fingerprint": "f"})
    with pytest.raises(ProtocolError, match="shm"):
        protocol.parse_header(protocol.pack(protocol.HELLO, **hello, shm=5))

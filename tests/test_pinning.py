"""Registering host memory with CUDA (ferry.consumer.staging.pinning) and the CUDA stager's use of it, on the CPU.

No GPU here: the CUDA runtime is replaced by a stand-in that keeps the same books CUDA would (it refuses an
overlapping or unknown range, and notes whether memory was still mapped when it was unregistered), and the
side stream by one whose events complete when the test says so. The slabs, pools, arrays and the stager
are the real ones. What a real GPU must show on top (bit-identical batches, no slot reused under a copy)
is in tests/test_cuda.py."""

from __future__ import annotations

import contextlib
import gc
import logging
import mmap
import threading
import weakref

import numpy as np
import pytest
import torch

from ferry.common import shm
from ferry.common.codec import Chunked
from ferry.consumer.core import Delivery
from ferry.consumer.staging.pinning import HOST_REGISTER_PORTABLE, HostRegistry, page_aligned_buffer, page_span
from ferry.consumer.staging.cuda import CudaStager
from ferry.consumer.staging.hostpool import HostPool
from ferry.consumer.staging.stagers import staging_loop
from ferry.consumer.staging.tensors import CpuStager

PAGE = mmap.PAGESIZE
needs_shm = pytest.mark.usefixtures("needs_shared_memory")


def is_mapped(address: int) -> bool:
    with open("/proc/self/maps") as f:
        for line in f:
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            if low <= address < high:
                return True
    return False


class FakeCudart:
    """Keeps CUDA's books: registrations may not overlap, unknown pointers are refused (713, as
    cudaErrorHostMemoryNotRegistered), and every call is logged with whether the memory was mapped."""

    cudaError = int

    def __init__(self, register_code: int = 0) -> None:
        self.register_code = register_code
        self.probe = lambda: None  # a test's own check, noted with each unregister
        self.live: dict[int, int] = {}
        self.calls: list[tuple] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append(("register", ptr, size, flags))
        if self.register_code:
            return self.register_code
        for start, length in self.live.items():
            if start < ptr + size and ptr < start + length:
                return 712  # cudaErrorHostMemoryAlreadyRegistered
        self.live[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr, is_mapped(ptr), self.probe()))
        if self.live.pop(ptr, None) is None:
            return 713
        return 0

    def cudaGetErrorString(self, code: int) -> str:
        return f"fake error {code}"

    def unregistered(self) -> list[tuple]:
        return [c for c in self.calls if c[0] == "unregister"]


class FakeEvent:
    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


class FakeStream:
    """The stager's side stream: copies on the CPU are done at once, but an event completes only when the
    test sets it (as a slow host-to-device copy would)."""

    def __init__(self) -> None:
        self.events: list[FakeEvent] = []

    def scope(self):
        return contextlib.nullcontext()

    def record(self) -> FakeEvent:
        self.events.append(FakeEvent())
        return self.events[-1]


def stager_for(slab=None, cudart=None) -> tuple[CudaStager, FakeCudart, FakeStream]:
    cudart = cudart if cudart is not None else FakeCudart()
    stream = FakeStream()
    stager = CudaStager(torch.device("cpu"), slab=slab, registry=HostRegistry(cudart, clear_error=lambda: None),
                        stream=stream, pin=lambda t: t)
    return stager, cudart, stream


# --- HostRegistry's books --------------------------------------------------------------------------------
def test_page_span_covers_whole_pages():
    assert page_span(PAGE, 1) == (PAGE, PAGE)
    assert page_span(PAGE + 10, PAGE) == (PAGE, 2 * PAGE)
    assert page_span(2 * PAGE, 2 * PAGE) == (2 * PAGE, 2 * PAGE)
    buffer = page_aligned_buffer(PAGE + 1)
    assert buffer.ctypes.data % PAGE == 0 and len(buffer) == PAGE + 1
    assert buffer.base.nbytes >= PAGE * 2 + (buffer.ctypes.data - buffer.base.ctypes.data)  # the last page is its own


def test_a_disabled_registry_registers_nothing():
    registry = HostRegistry(None)
    assert not registry.enabled and registry.register(PAGE, PAGE) is False
    assert not registry.covers(PAGE, 1) and registry.registered_bytes == 0
    registry.unregister_all()
    assert HostRegistry.for_device(None).enabled is False
    assert HostRegistry.for_device(torch.device("cpu")).enabled is False
    if not torch.cuda.is_available():
        assert HostRegistry.for_device(torch.device("cuda")).enabled is False


def test_register_is_idempotent_per_range_and_portable():
    cudart = FakeCudart()
    registry = HostRegistry(cudart, clear_error=lambda: None)
    assert registry.register(4 * PAGE, 2 * PAGE) is True
    assert registry.register(4 * PAGE, 2 * PAGE) is True
    assert registry.register(4 * PAGE, PAGE) is True  # already covered
    assert cudart.calls == [("register", 4 * PAGE, 2 * PAGE, HOST_REGISTER_PORTABLE)] and registry.calls == 1
    assert registry.covers(4 * PAGE, 2 * PAGE) and registry.covers(5 * PAGE, 10)
    assert not registry.covers(5 * PAGE, PAGE + 1) and not registry.covers(3 * PAGE, 2)
    assert registry.ranges() == {4 * PAGE: 2 * PAGE} and registry.registered_bytes == 2 * PAGE
    assert "enabled [1 ranges, " in repr(registry)


def test_a_longer_range_at_the_same_start_extends_it_as_one_registration():
    cudart = FakeCudart()
    registry = HostRegistry(cudart, clear_error=lambda: None)
    registry.register(4 * PAGE, PAGE)
    assert registry.register(4 * PAGE, 3 * PAGE) is True
    assert [c[:3] for c in cudart.calls] == [("register", 4 * PAGE, PAGE), ("unregister", 4 * PAGE, False),
                                             ("register", 4 * PAGE, 3 * PAGE)]
    assert registry.ranges() == {4 * PAGE: 3 * PAGE} and cudart.live == {4 * PAGE: 3 * PAGE}
    assert registry.covers(6 * PAGE, PAGE)  # one registration covers a copy across the old end


def test_overlapping_and_empty_ranges_are_refused():
    registry = HostRegistry(FakeCudart(), clear_error=lambda: None)
    registry.register(4 * PAGE, 2 * PAGE)
    with pytest.raises(ValueError, match="overlaps the registered range"):
        registry.register(5 * PAGE, 2 * PAGE)
    with pytest.raises(ValueError, match="overlaps"):
        registry.register(3 * PAGE, 2 * PAGE)
    assert registry.register(6 * PAGE, PAGE) is True  # adjacent is fine: a separate range
    assert not registry.covers(5 * PAGE, 2 * PAGE)  # ...but no copy may span both
    with pytest.raises(ValueError, match="cannot register 0 bytes"):
        registry.register(8 * PAGE, 0)


def test_a_refused_registration_is_handled_logged_once_and_not_retried(caplog):
    cudart = FakeCudart(register_code=2)
    cleared: list[int] = []
    registry = HostRegistry(cudart, clear_error=lambda: cleared.append(1))
    with caplog.at_level(logging.WARNING, logger="ferry.consumer"):
        assert registry.register(4 * PAGE, PAGE) is False
        assert registry.register(4 * PAGE, PAGE) is False  # not tried again
        assert registry.register(8 * PAGE, PAGE) is False  # another range is tried, the same error not logged again
    assert len([c for c in cudart.calls if c[0] == "register"]) == 2
    assert registry.failures == 2 and len(cleared) == 2  # the thread's CUDA error cleared after each
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "CUDA error 2 (fake error 2)" in messages[0] and "pinned pool" in messages[0]
    assert not registry.covers(4 * PAGE, 1) and registry.ranges() == {}


def test_the_thread_error_clearer_looks_only_at_a_loaded_runtime():
    from ferry.consumer.staging.pinning import _ThreadLastError

    clearer = _ThreadLastError()
    if not torch.cuda.is_available():
        assert clearer._get_last_error is None  # no libcudart in this process: nothing loaded, nothing to clear
    clearer()


def test_a_failed_unregister_is_logged_and_the_range_forgotten(caplog):
    cudart = FakeCudart()
    registry = HostRegistry(cudart, clear_error=lambda: None)
    registry.register(4 * PAGE, PAGE)
    cudart.live.clear()  # CUDA lost it: unregister answers 713
    with caplog.at_level(logging.WARNING, logger="ferry.consumer"):
        registry.unregister_all()
    assert "cudaHostUnregister" in caplog.text and "713" in caplog.text
    assert registry.ranges() == {} and registry.failures == 1


def test_unregister_within_and_unregister_all():
    cudart = FakeCudart()
    registry = HostRegistry(cudart, clear_error=lambda: None)
    for start in (4, 8, 12):
        registry.register(start * PAGE, 2 * PAGE)
    registry.unregister_within(7 * PAGE, 6 * PAGE)  # holds [8, 10) only: [12, 14) runs past its end
    assert registry.ranges() == {4 * PAGE: 2 * PAGE, 12 * PAGE: 2 * PAGE}
    registry.unregister_all()
    assert registry.ranges() == {} and cudart.live == {}
    calls = len(cudart.calls)
    registry.unregister_all()  # idempotent
    assert len(cudart.calls) == calls


# --- the receive pool ------------------------------------------------------------------------------------
def test_the_receive_pool_registers_each_pooled_buffer_once():
    cudart = FakeCudart()
    registry = HostRegistry(cudart, clear_error=lambda: None)
    pool = HostPool(limit=1, registry=registry)
    leaf = Chunked(np.dtype(np.int32), (3, 700), [np.arange(1050, dtype=np.int32).tobytes()] * 2)
    first = pool.adopt(leaf)
    assert first.ctypes.data % PAGE == 0 and registry.covers(first.ctypes.data, first.nbytes)
    assert np.array_equal(first.reshape(-1), np.tile(np.arange(1050, dtype=np.int32), 2))
    spare = pool.adopt(leaf)  # over the limit: a one-off buffer, not registered
    assert not registry.covers(spare.ctypes.data, spare.nbytes)
    address = first.ctypes.data
    del first
    gc.collect()
    again = pool.adopt(leaf)
    assert again.ctypes.data == address and pool.reused == 1
    assert len([c for c in cudart.calls if c[0] == "register"]) == 1  # registered once, reused since


def test_the_receive_pool_locks_no_more_than_limit_buffers_of_the_largest_size_when_sizes_vary():
    """Leaves whose size changes every batch (padded to the longest sequence) must not lock a new buffer per
    size for ever: the free buffers of the least recently used sizes are unregistered to make room."""
    cudart = FakeCudart()
    registry = HostRegistry(cudart, clear_error=lambda: None)
    pool = HostPool(limit=2, registry=registry)
    largest = 0
    for step in range(50):
        n = (3 + step % 17) * PAGE + 8 * step  # 17 sizes, over and over, and each new
        largest = max(largest, n)
        leaf = Chunked(np.dtype(np.uint8), (n,), [bytes(n)])
        held = pool.adopt(leaf)  # the loop holds one batch at a time
        assert pool.locked_bytes <= 2 * largest, (step, pool.locked_bytes)
        assert registry.registered_bytes <= 2 * largest + 2 * PAGE * 2
        assert not held.any()
        del held  # its buffer goes back at once: a finalizer on the array, no cycle for a collection to find
    assert len(cudart.unregistered()) > 0  # room was made by unregistering
    assert len(pool._recent) <= 2 * 17  # sizes with nothing left are forgotten
    same = Chunked(np.dtype(np.uint8), (4 * PAGE,), [bytes(4 * PAGE)])
    first = pool.adopt(same)
    address = first.ctypes.data
    del first
    gc.collect()
    assert pool.adopt(same).ctypes.data == address  # a steady size is still reused


# --- the CUDA stager's bookkeeping, with a real slab -------------------------------------------------------
@pytest.fixture
def slab():
    slab = shm.Slab(slots=3, slot_bytes=8 * PAGE)
    yield slab
    slab.close()


def batch_in(slab: shm.Slab, slot, ends: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Leaves in ``slot``, each ending at one of ``ends`` (bytes from the slot's start), as the codec decodes
    them: views of the slot's region."""
    region = slab.region(slot)
    leaves, start = [], 0
    for end in ends:
        leaf = region[start:end]
        leaf[...] = np.arange(len(leaf), dtype=np.uint64).astype(np.uint8)
        leaves.append(leaf)
        start = -(-end // shm.SLOT_ALIGN) * shm.SLOT_ALIGN
    return region, leaves


@needs_shm
def test_the_used_part_of_a_slot_is_registered_once_and_extended_when_a_batch_uses_more(slab):
    stager, cudart, stream = stager_for(slab)
    slot = slab.take()
    slot_address = slab.address + slot[0]
    region, leaves = batch_in(slab, slot, [PAGE + 100, 2 * PAGE + 10])
    delivery = Delivery(run=0, seq=0, tree={"x": leaves[1], "y": leaves[0], "n": 3})
    stager.stage(delivery)
    assert stager.registry.ranges() == {slot_address: 3 * PAGE}  # from the slot's start to the furthest leaf's page
    assert stager.direct == 2 and stager.through_pool == 0
    assert torch.equal(delivery.tree["y"], torch.from_numpy(leaves[0].copy())) and delivery.tree["n"] == 3
    stream.events[-1].done = True
    del region, leaves, delivery
    stager.reclaim()
    assert slab.free == 3

    again = slab.take()
    assert again == slot
    region, leaves = batch_in(slab, slot, [PAGE])  # less: already covered
    stager.stage(Delivery(run=0, seq=1, tree=[leaves[0]]))
    assert len(cudart.calls) == 1
    stream.events[-1].done = True
    del region, leaves
    stager.reclaim()

    region, leaves = batch_in(slab, slab.take(), [5 * PAGE - 1])  # more: one registration over the lot
    stager.stage(Delivery(run=0, seq=2, tree=[leaves[0]]))
    assert [c[:3] for c in cudart.calls[1:]] == [("unregister", slot_address, True), ("register", slot_address, 5 * PAGE)]
    other = slab.take()
    _, more = batch_in(slab, other, [64])
    stager.stage(Delivery(run=0, seq=3, tree=[more[0]]))
    assert stager.registry.ranges() == {slot_address: 5 * PAGE, slab.address + other[0]: PAGE}
    del region, leaves, more, _
    stager.close()


@needs_shm
def test_a_slot_goes_back_only_once_the_copy_from_it_completed(slab):
    stager, _, stream = stager_for(slab)
    slot = slab.take()
    region, leaves = batch_in(slab, slot, [3 * PAGE])
    delivery = Delivery(run=0, seq=0, tree=[leaves[0]])
    stager.stage(delivery)
    del region, leaves, delivery  # the io thread and the loop hold nothing of the slot any more
    gc.collect()
    stager.reclaim()
    assert slab.free == 2 and stager.held == 1, "the slot came back while its copy was in flight"
    assert slot not in [slab.take(), slab.take()] and slab.take() is None
    stream.events[0].done = True
    stager.reclaim()
    assert stager.held == 0 and slab.free == 1 and slab.take() == slot
    stager.close()


@needs_shm
def test_close_waits_for_copies_and_unregisters_before_anything_is_unmapped():
    gc.collect()
    slab = shm.Slab(slots=2, slot_bytes=8 * PAGE)
    stager, cudart, stream = stager_for(slab)
    region, leaves = batch_in(slab, slab.take(), [2 * PAGE])
    stager.stage(Delivery(run=0, seq=0, tree=[leaves[0]]))
    address = slab.address
    del region, leaves
    slab.close()  # the loader closes the slab last; here the copy still holds the slot's view
    assert is_mapped(address)
    stager.close()
    assert stream.events[0].done, "close must wait for the copies in flight"
    assert [c[:3] for c in cudart.unregistered()] == [("unregister", address, True)], "unregistered after the memory was unmapped"
    gc.collect()
    assert not is_mapped(address) and cudart.live == {}


@needs_shm
def test_a_slab_unmapped_before_the_stager_closes_is_unregistered_first():
    gc.collect()
    slab = shm.Slab(slots=2, slot_bytes=8 * PAGE)
    stager, cudart, stream = stager_for(slab)
    region, leaves = batch_in(slab, slab.take(), [PAGE])
    stager.stage(Delivery(run=0, seq=0, tree=[leaves[0]]))
    stream.events[0].done = True
    address = slab.address
    del region, leaves
    stager.reclaim()
    slab.close()
    gc.collect()  # the last view is gone: the mapping's hooks run, then munmap
    assert not is_mapped(address)
    assert [c[:3] for c in cudart.unregistered()] == [("unregister", address, True)] and cudart.live == {}
    stager.close()
    assert len(cudart.unregistered()) == 1


@needs_shm
def test_when_cuda_refuses_to_register_the_slot_the_batch_goes_through_the_pinned_pool(slab, caplog):
    stager, cudart, stream = stager_for(slab, FakeCudart(register_code=2))
    slot = slab.take()
    region, leaves = batch_in(slab, slot, [PAGE + 5])
    expected = leaves[0].copy()
    delivery = Delivery(run=0, seq=0, tree=[leaves[0]])
    with caplog.at_level(logging.WARNING, logger="ferry.consumer"):
        stager.stage(delivery)
    assert stager.direct == 0 and stager.through_pool == 1 and "cudaHostRegister" in caplog.text
    leaves[0][...] = 0  # the slot may be reused at once: the copy was taken into the pinned buffer
    assert np.array_equal(delivery.tree[0].numpy(), expected)
    del region, leaves
    gc.collect()
    assert slab.free == 3 and stager.held == 0
    stager.close()


class LazyLeaf:
    """Duck-types Chunked, as a lazily decompressed leaf does: no ``chunks``, only ``assemble_into``."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.dtype, self.shape, self.nbytes, self.bfloat16 = values.dtype, values.shape, values.nbytes, False

    def assemble_into(self, out: np.ndarray) -> np.ndarray:
        flat = out[: self.nbytes]
        flat[...] = self.values.reshape(-1).view(np.uint8)
        return flat.view(self.dtype).reshape(self.shape)


def test_assembled_leaves_are_copied_from_a_registered_pool_buffer_held_until_the_copy_completed():
    stager, cudart, stream = stager_for()
    values = np.arange(40 * PAGE, dtype=np.float32).reshape(40, PAGE)  # large enough for malloc to mmap it
    frame = np.arange(10, dtype=np.int64)  # a plain frame: through the pinned pool
    delivery = Delivery(run=0, seq=0, tree={"x": LazyLeaf(values), "c": Chunked(np.dtype(np.int64), (10,),
                                                                                [frame.tobytes()]), "f": frame})
    stager.stage(delivery)
    assert torch.equal(delivery.tree["x"], torch.from_numpy(values))
    assert torch.equal(delivery.tree["c"], torch.from_numpy(frame)) and torch.equal(delivery.tree["f"], torch.from_numpy(frame))
    assert stager.direct == 2 and stager.through_pool == 1
    second = Delivery(run=0, seq=1, tree=[LazyLeaf(values)])
    stager.stage(second)
    assert stager.host.reused == 0, "a pool buffer was handed out again while its copy was in flight"
    for event in stream.events:
        event.done = True
    stager.reclaim()
    stager.stage(Delivery(run=0, seq=2, tree=[LazyLeaf(values)]))
    assert stager.host.reused == 1
    registered = len([c for c in cudart.calls if c[0] == "register"])
    assert registered == 3  # two buffers for x (one per batch in flight) and one for c; none since
    stager.reclaim()
    stager._holds[-1][0].done = True
    stager.reclaim()
    pooled = [weakref.ref(b.base) for buffers in stager.host._free.values() for b in buffers]
    assert len(pooled) == 3
    cudart.probe = lambda: all(ref() is not None for ref in pooled)
    stager.close()
    assert cudart.live == {} and stager.registry.ranges() == {}
    assert [c[3] for c in cudart.unregistered()] == [True] * 3, "a pool buffer was freed before it was unregistered"
    assert all(ref() is None for ref in pooled)  # and freed after


def test_the_cpu_stager_assembles_any_leaf_with_assemble_into():
    values = np.arange(12, dtype=np.int16).reshape(3, 4)
    delivery = Delivery(run=0, seq=0, tree=[LazyLeaf(values)])
    CpuStager(pin_memory=False).stage(delivery)
    assert torch.equal(delivery.tree[0], torch.from_numpy(values))


def test_the_staging_loop_reclaims_between_batches():
    stop = threading.Event()

    class Idle:
        reclaims = 0

        def stage(self, delivery):  # pragma: no cover - nothing arrives
            raise AssertionError("nothing was put")

        def reclaim(self):
            self.reclaims += 1
            if self.reclaims == 2:
                stop.set()

        def close(self):
            pass

    import queue

    stager = Idle()
    thread = threading.Thread(target=staging_loop, args=(queue.Queue(), queue.Queue(), stop, stager, []), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and stager.reclaims == 2

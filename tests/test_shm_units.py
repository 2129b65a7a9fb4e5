"""The shared-memory slab's bookkeeping, in isolation: slot sizes, which slot is free when, the lease that
holds a slot while any view of it lives, the producer side's checks, and where leaves land in a slot."""

import errno
import gc
import mmap
import os
import subprocess
import sys

import numpy as np
import pytest

from ferry.common import shm

from .helpers import wait_for

pytestmark = pytest.mark.usefixtures("needs_shared_memory")  # decided by tests/needs.py, not shm.available()
PAGE = mmap.PAGESIZE


@pytest.fixture
def slab():
    slab = shm.Slab(slots=3, slot_bytes=PAGE)
    yield slab
    slab.close()


def fd_target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        return ""


def slab_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("ferry-slab" in line for line in f)


def test_shared_memory_is_available_here():
    assert shm.available() is True


@pytest.mark.parametrize("missing", ["memfd_create", "/proc"])
def test_shared_memory_needs_both_memfd_and_proc(monkeypatch, missing):
    if missing == "memfd_create":
        monkeypatch.delattr(shm.os, "memfd_create")
    else:
        monkeypatch.setattr(shm.os.path, "isdir", lambda path: False)
    assert shm.available() is False


@pytest.mark.parametrize("asked, given", [(1, PAGE), (PAGE, PAGE), (PAGE + 1, 2 * PAGE),
                                         (shm.MAX_SLOT_BYTES + 1, shm.MAX_SLOT_BYTES)])
def test_slots_are_whole_pages_and_capped(asked, given):
    slab = shm.Slab(slots=2, slot_bytes=asked)
    try:
        assert slab.slot_bytes == given and slab.slots == 2
        assert os.fstat(slab._fd).st_size == 2 * given
    finally:
        slab.close()


def test_slots_are_taken_in_order_until_none_is_free(slab):
    assert slab.free == 3
    assert [slab.take() for _ in range(3)] == [(0, PAGE), (PAGE, PAGE), (2 * PAGE, PAGE)]
    assert slab.take() is None and slab.free == 0


def integers(slot) -> bool:
    return all(type(x) is int for x in slot)  # an offset goes into a TASK: a float would not be a valid one


def test_a_slot_given_back_is_free_again_and_taken_next(slab):
    first, second = slab.take(), slab.take()
    assert integers(first) and integers(second)
    slab.give_back(second)
    assert slab.free == 2
    again = slab.take()
    assert again == second and integers(again)
    slab.give_back(first)
    assert slab.take() == first


def test_a_slot_stays_taken_while_any_view_of_it_lives(slab):
    slot = slab.take()
    region = slab.region(slot)
    assert region.dtype == np.uint8 and region.shape == (PAGE,)
    view = region[100:200].view(np.int32)
    del region
    gc.collect()
    assert slab.free == 2  # a view of the slot is still alive
    del view
    gc.collect()
    assert slab.free == 3
    taken = [slab.take() for _ in range(3)]
    assert slot in taken and all(integers(t) for t in taken)  # the lease gave back a whole slot number


def test_regions_are_the_slots_of_one_shared_file(slab):
    a, b = slab.take(), slab.take()
    region_a, region_b = slab.region(a), slab.region(b)
    region_b[:4] = [1, 2, 3, 4]
    producer_side = shm.SlabMapping(slab.path)
    assert producer_side.size == 3 * PAGE
    producer_side.writer(a).region[:3] = [7, 8, 9]
    assert region_a[:3].tolist() == [7, 8, 9]  # what the producer writes is what the consumer reads
    assert producer_side.writer(b).region[:4].tolist() == [1, 2, 3, 4]  # at the slot's own offset


def test_the_token_is_random_and_the_path_names_this_process():
    one, two = shm.Slab(1, PAGE), shm.Slab(1, PAGE)
    try:
        assert len(one.token) == 16 and one.token != two.token
        assert one.path == f"/proc/{os.getpid()}/fd/{one._fd}"
    finally:
        one.close()
        two.close()


def test_slot_span_locates_a_range_inside_one_slot(slab):
    base, size = slab.address, PAGE
    assert slab.size == 3 * size
    assert slab.slot_span(base, 1) == (base, 1)
    assert slab.slot_span(base + size + 100, 50) == (base + size, 150)
    assert slab.slot_span(base + 2 * size, size) == (base + 2 * size, size)  # a whole slot, the last one
    for address, nbytes in [(base + size - 10, 20), (base - 1, 2), (base + 3 * size - 1, 2), (base, 0),
                            (base + 3 * size, 1)]:
        assert slab.slot_span(address, nbytes) is None, (address - base, nbytes)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the finalizer reports the hook's error
def test_unmap_hooks_run_before_the_memory_goes_even_when_one_fails():
    gc.collect()
    slab = shm.Slab(2, PAGE)
    seen = []

    def hook(address, size):
        seen.append((address, size, slab_mappings()))
        raise RuntimeError("a hook that fails")

    slab.before_unmap(hook)
    slab.before_unmap(lambda address, size: seen.append("second"))  # never reached: the first one raised
    address, mapped = slab.address, slab_mappings()
    view = slab.region(slab.take())
    slab.close()
    assert seen == []  # a batch view still lives
    del view
    gc.collect()  # the finalizer reports the hook's error and goes on
    assert seen == [(address, 2 * PAGE, mapped)]  # called with the mapping still in place
    assert slab_mappings() == mapped - 1  # and unmapped all the same


def test_close_closes_the_file_once_and_the_mapping_goes_with_the_last_view():
    gc.collect()  # mappings that earlier tests left to the collector go now, not during this test
    before = slab_mappings()
    slab = shm.Slab(2, PAGE)
    fd = slab._fd
    assert fd_target(fd) == "/memfd:ferry-slab (deleted)"  # the name leak checks look for in /proc/self/maps
    view = slab.region(slab.take())
    slab.close()
    slab.close()  # idempotent: the second call closes nothing, least of all a standard stream
    assert "ferry-slab" not in fd_target(fd)
    for standard in (0, 1, 2):
        os.fstat(standard)
    with pytest.raises(AssertionError, match="closed"):
        slab.region((0, PAGE))
    view[:] = 1  # the training loop's batch is still readable and writable after close
    assert slab_mappings() == before + 1
    del view
    gc.collect()
    assert slab_mappings() == before


def test_a_failed_mapping_says_why():
    with pytest.raises(OSError, match=f"mmap of {PAGE} bytes failed") as caught:
        shm.map_file(-1, PAGE)
    assert caught.value.errno == errno.EBADF


@pytest.mark.parametrize("slot", [(-64, 64), (0, 0), (64, 3 * PAGE), (3 * PAGE, 1), (32, 64)])
def test_the_producer_refuses_a_slot_outside_the_slab_or_misaligned(slab, slot):
    producer_side = shm.SlabMapping(slab.path)
    with pytest.raises(ValueError, match="outside the shared slab"):
        producer_side.writer(slot)


def test_the_producer_accepts_a_slot_that_ends_at_the_slab_end(slab):
    producer_side = shm.SlabMapping(slab.path)
    writer = producer_side.writer((2 * PAGE, PAGE))
    assert len(writer.region) == PAGE and writer.used == 0
    assert len(producer_side.writer((0, 1)).region) == 1  # the smallest slot there is


def region_writer(nbytes: int = 256) -> shm.SlotWriter:
    return shm.SlotWriter(np.zeros(nbytes, np.uint8))


def test_reserve_aligns_every_leaf_and_refuses_what_does_not_fit():
    writer = region_writer(256)
    first = writer.reserve(1)
    assert len(first) == 1 and writer.used == 1
    second = writer.reserve(10)
    assert second.ctypes.data - writer.region.ctypes.data == shm.SLOT_ALIGN and writer.used == 74
    assert writer.reserve(256 - 128 + 1) is None and writer.used == 74  # refused: nothing changes
    last = writer.reserve(256 - 128)  # exactly to the end
    assert len(last) == 128 and writer.used == 256


def test_offset_of_finds_arrays_inside_the_slot_only():
    writer = region_writer(256)
    assert writer.offset_of(writer.region[64:128]) == 64
    assert writer.offset_of(writer.region[192:256]) == 192  # ends at the end: inside
    assert writer.offset_of(np.zeros(8, np.uint8)) is None
    bigger = np.zeros(512, np.uint8)
    assert shm.SlotWriter(bigger[:256]).offset_of(bigger[128:384]) is None  # starts inside, runs past the end
    assert shm.SlotWriter(bigger[256:]).offset_of(bigger[128:200]) is None  # before the start


def test_place_copies_an_outside_array_and_only_references_one_already_there():
    writer = region_writer(256)
    values = np.arange(4, dtype=np.int32)
    assert writer.place(values) == 0
    assert writer.region[:16].view(np.int32).tolist() == [0, 1, 2, 3]
    assert writer.place(np.ones(2, np.int64)) == 64 and writer.used == 80
    inside = writer.region[64:80]
    assert writer.place(inside) == 64 and writer.used == 80  # no second copy
    assert writer.place(np.zeros(200, np.uint8)) is None and writer.used == 80


def test_a_zombie_whose_name_holds_a_parenthesis_counts_as_exited():
    """/proc/PID/stat puts the process name in parentheses, and a name may hold ')' itself: the state is
    the field after the LAST ')'. A lost producer's slots must come back once it is a zombie."""
    child = subprocess.Popen([sys.executable, "-c", "open('/proc/self/comm', 'w').write('odd) (name')"])
    try:
        def zombie() -> bool:
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                stat = f.read()
            return b"odd) (name" in stat and stat.rsplit(b")", 1)[1].split()[0] == b"Z"

        wait_for(zombie, 30, "the child to exit and stay a zombie (it is not reaped yet)")
        assert shm.process_exists(child.pid) is False
    finally:
        child.wait(30)

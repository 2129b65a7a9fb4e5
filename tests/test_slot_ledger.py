"""The consumer's slot ledger (ferry.consumer.core.slots.SlotLedger), in isolation over a real slab: which task
holds which slot, and slots of lost producers held back until their process has exited."""

import subprocess
import sys

import pytest

from ferry.common import shm
from ferry.consumer.core.slots import SlotLedger

pytestmark = pytest.mark.usefixtures("needs_shared_memory")


@pytest.fixture
def slab():
    slab = shm.Slab(slots=3, slot_bytes=4096)
    yield slab
    slab.close()


def test_lent_slots_are_distinct_and_run_out(slab):
    ledger = SlotLedger(slab)
    slots = [ledger.lend(task, holder="p") for task in (1, 2, 3)]
    assert len(set(slots)) == 3 and all(s is not None for s in slots)
    assert ledger.lend(4, holder="p") is None  # none free: the task goes over the socket
    assert ledger.held == 3 and slab.free == 0


def test_a_slot_given_back_is_free_at_once_and_only_by_its_holder_when_one_is_named(slab):
    ledger = SlotLedger(slab)
    ledger.lend(1, holder=("p", 1))
    ledger.give_back(1, holder=("p", 2))  # another incarnation of the producer: it may still be writing
    assert slab.free == 2 and ledger.held == 1
    ledger.give_back(1, holder=("p", 1))
    assert slab.free == 3 and ledger.held == 0
    ledger.give_back(1)  # twice, or a task that never had a slot: nothing happens
    ledger.give_back(99)
    assert slab.free == 3


def test_a_taken_region_frees_its_slot_once_the_last_view_is_gone(slab):
    ledger = SlotLedger(slab)
    offset, nbytes = ledger.lend(1, holder="p")
    region = ledger.take_region(1)
    assert len(region) == nbytes and ledger.held == 0
    view = region[10:20]
    del region
    assert slab.free == 2
    del view
    assert slab.free == 3
    assert ledger.take_region(1) is None  # no longer tracked


def test_a_lost_producers_slots_come_back_only_once_its_process_has_exited(slab):
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        ledger = SlotLedger(slab)
        for task in (1, 2):
            ledger.lend(task, holder="p")
        ledger.set_aside([1, 2, 3], pid=child.pid)  # task 3 never had a slot
        assert ledger.lost == 2 and ledger.held == 0 and slab.free == 1 and ledger.holders() == {child.pid}
        ledger.reclaim(exited={pid for pid in ledger.holders() if not shm.process_exists(pid)})
        assert ledger.lost == 2 and slab.free == 1  # it may still be writing into them
        ledger.give_back(1)
        assert slab.free == 1  # set aside: no longer the task's to give back
    finally:
        child.stdin.close()
        child.wait(10)
    ledger.reclaim(exited={pid for pid in ledger.holders() if not shm.process_exists(pid)})
    assert ledger.lost == 0 and slab.free == 3 and ledger.holders() == set()


def test_reclaim_keeps_the_slots_of_the_lost_producers_still_running(slab):
    ledger = SlotLedger(slab)
    ledger.lend(1, holder="a")
    ledger.lend(2, holder="b")
    ledger.set_aside([1], pid=11)
    ledger.set_aside([2], pid=12)
    ledger.reclaim(exited={12})
    assert ledger.lost == 1 and slab.free == 2 and ledger.holders() == {11}
    ledger.reclaim(exited={11, 99})
    assert ledger.lost == 0 and slab.free == 3


def test_without_a_slab_the_ledger_lends_nothing():
    ledger = SlotLedger(None)
    assert ledger.lend(1, holder="p") is None
    assert ledger.take_region(1) is None
    ledger.give_back(1)
    ledger.set_aside([1], pid=1)
    ledger.reclaim(exited={1})
    assert ledger.lost == 0 and ledger.held == 0


"""Slot affinity: the consumer lends a producer a slot it was lent last, when one is free, so that no producer
pays the page faults of mapping a slot another producer wrote (ferry.consumer.core.slots.SlotLedger.lend). The logic on
a real slab without sockets, then real local producers: the batches are what they were without it."""

import pytest

from ferry import RemoteLoader
from ferry.common import shm
from ferry.consumer.core.slots import SlotLedger
from tests.datasets import DictDataset

from .helpers import LeakCheck, assert_epoch_matches

pytestmark = pytest.mark.usefixtures("needs_shared_memory")


@pytest.fixture
def slab():
    slab = shm.Slab(slots=4, slot_bytes=4096)
    yield slab
    slab.close()


def test_take_preferring_takes_the_most_recently_freed_preferred_slot_else_the_most_recently_freed(slab):
    taken = [slab.take() for _ in range(4)]
    for slot in taken:  # freed in order 0, 1, 2, 3: slot 3 is the most recently freed
        slab.give_back(slot)
    assert slab.take_preferring(lambda index: index in (0, 1)) == taken[1]
    assert slab.take_preferring(lambda index: False) == taken[3]
    assert slab.take_preferring(lambda index: index == 0) == taken[0]
    assert slab.take_preferring(lambda index: True) == taken[2]
    assert slab.take_preferring(lambda index: True) is None and slab.free == 0


def test_a_producer_gets_back_the_slot_it_had_even_when_another_was_freed_since(slab):
    ledger = SlotLedger(slab)
    a, b = ("a", 1), ("b", 1)
    a_slot = ledger.lend(1, a)
    b_slot = ledger.lend(2, b)
    ledger.give_back(1)
    ledger.give_back(2)  # b's slot is the most recently freed: plain LIFO would hand it to a
    assert ledger.lend(3, a) == a_slot
    assert ledger.lend(4, b) == b_slot


def test_a_producer_without_a_free_slot_of_its_own_takes_the_most_recently_freed(slab):
    ledger = SlotLedger(slab)
    a, b, c = ("a", 1), ("b", 1), ("c", 1)
    ledger.lend(1, a)
    b_slot = ledger.lend(2, b)
    ledger.give_back(2)
    assert ledger.lend(3, c) == b_slot  # pages already made, rather than a never-written slot
    assert ledger.lend(4, b) not in (b_slot, None)  # c holds it now: b takes another
    ledger.give_back(3)
    assert ledger.lend(5, c) == b_slot  # and it is c's from now on


def test_no_slab_lends_nothing():
    assert SlotLedger(None).lend(1, ("a", 1)) is None


def test_batches_over_three_epochs_with_two_producers_are_unchanged_and_every_slot_comes_back():
    check = LeakCheck()
    dataset = DictDataset(length=40)
    with RemoteLoader(dataset=dataset, local_producers=2, batch_size=4, shuffle=True, seed=5, heartbeat=0.2,
                      buffer_batches=4, timeout=30) as loader:
        count = sum(assert_epoch_matches(loader, dataset, epoch=epoch, batch_size=4, seed=5) for epoch in range(3))
        stats = loader.stats()
        assert stats["shared_batches"] == stats["received"] == count, stats
        state = stats["shared_memory"]
        assert state["free"] == state["slots"] and state["lost"] == 0, state
    check.assert_clean()

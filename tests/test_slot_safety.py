"""Shared-memory slot safety: a producer that is declared lost may still be running and still writing into
the slot its task named. That slot must not be handed to anyone else until the process has exited, or the
lost producer would write into a batch the training loop is reading.

The test stops a local producer (SIGSTOP) in the middle of a task that has a slot, so that the loader
declares it lost while the process lives. The loop keeps every batch of the epoch, so that the slab runs out
of slots; no held batch may lie in the lost slot, and each stays equal to torch's reference while later ones
arrive. The loop then drops them and keeps every batch of the next epoch: a slot handed back too early now
holds one of those. The stopped producer is let go (SIGCONT) and finishes writing its old task into its old
slot: every batch the loop holds must still equal the reference. Finally SIGKILL: the slot comes back.
"""

import os
import signal
import time

import pytest

from ferry import RemoteLoader
from ferry.common.datasets import SyntheticDataset

from .helpers import (
    REPO, LeakCheck, assert_tree_equal, lost_slots, producer_pids, reference_batches, slab_base_address, wait_for,
)
from .progress_datasets import started_by

pytestmark = pytest.mark.usefixtures("needs_shared_memory")

ARGS = {"length": 32, "shape": [16, 16], "dtype": "float32", "delay": 0.03}
BATCH = 4


def _stop_a_producer_holding_a_slot(loader: RemoteLoader, log: str, it, held: list) -> int:
    """SIGSTOP a producer in the middle of a task (a sample started, its row not yet written), until the
    loader declares it lost with a slot. Its pid. Takes batches from ``it`` into ``held`` while it tries."""
    for _attempt in range(8):
        held.append(next(it))  # a credit back: a task goes out
        pids = list(producer_pids(loader).values())
        started = {pid: started_by(log, pid) for pid in pids}
        deadline = time.monotonic() + 2.0
        victim = None
        while victim is None and time.monotonic() < deadline:  # a sample starts: its task is in flight
            victim = next((pid for pid in pids if started_by(log, pid) > started[pid]), None)
            time.sleep(0.001)
        if victim is None:
            continue  # every task in the window had started all its samples: take a batch, try again
        os.kill(victim, signal.SIGSTOP)  # within its sample's delay: that row is written only after SIGCONT
        before = loader.stats()["shared_memory"]["lost"]
        wait_for(lambda: victim not in producer_pids(loader).values(), 20, f"stopped producer {victim} to be lost")
        if loader.stats()["shared_memory"]["lost"] > before:
            return victim
        # its task had no slot after all: let it go and try again
        os.kill(victim, signal.SIGCONT)
        wait_for(lambda: victim in producer_pids(loader).values(), 20, f"producer {victim} to come back")
    raise AssertionError("could not stop a producer while it held a slot in 8 attempts")


def _assert_outside(loader: RemoteLoader, held: list, slots: list[tuple[int, int]]) -> None:
    base = slab_base_address(loader)
    for seq, (x, _y) in enumerate(held):
        start = x.data_ptr()
        for offset, nbytes in slots:
            assert not base + offset <= start < base + offset + nbytes, (
                f"batch {seq} lies in slot {offset} of a lost producer whose process still runs")


def test_a_lost_producer_s_slot_is_not_reused_while_its_process_lives(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    log = str(tmp_path / "started.log")
    check = LeakCheck()
    dataset = SyntheticDataset(**ARGS)
    expected = reference_batches(dataset, batch_size=BATCH, drop_last=False, world_size=1, rank=0, shuffle=True,
                                 seed=5, epoch=0)
    victim = None
    try:
        with RemoteLoader(dataset="tests.progress_datasets:TellingDataset", dataset_args={**ARGS, "log": log}, local_producers=2, producer_threads=1,
                          producer_slots=2, batch_size=BATCH, shuffle=True, seed=5, buffer_batches=2,
                          heartbeat=0.1, liveness=3, task_timeout=60, timeout=30) as loader:
            wait_for(lambda: loader.stats()["producers"] == 2, 20, "2 producers")
            it = iter(loader)
            held: list = []
            victim = _stop_a_producer_holding_a_slot(loader, log, it, held)
            state = loader.stats()["shared_memory"]
            assert state["lost"] >= 1, state
            given_up = lost_slots(loader)
            assert len(given_up) == state["lost"]

            # later batches flow (from the other producer) while the loop keeps every one: the slab runs dry
            for batch in it:
                held.append(batch)
                _assert_outside(loader, held, given_up)
                for seq, kept in enumerate(held):  # every batch held so far is still intact
                    assert_tree_equal(kept, expected[seq], f"batch {seq} while batch {len(held) - 1} arrived")
            del batch
            assert len(held) == len(expected)
            state = loader.stats()["shared_memory"]
            assert state["lost"] >= 1 and lost_slots(loader) == given_up, (
                f"a live (stopped) producer's slots were handed back: {state}")
            assert state["free"] == 0, f"the loop holds every batch, so every usable slot is taken: {state}"

            # the loop drops them: every slot comes back but the stopped producer's
            del held, kept
            wait_for(lambda: loader.stats()["shared_memory"]["free"] == state["slots"] - state["lost"], 10,
                     "the dropped batches' slots to be free")
            # a new epoch, every batch kept again: each slot that can be handed out now holds one of them
            loader.set_epoch(1)
            second = reference_batches(dataset, batch_size=BATCH, drop_last=False, world_size=1, rank=0,
                                       shuffle=True, seed=5, epoch=1)
            held = []
            for batch in loader:
                held.append(batch)
                _assert_outside(loader, held, given_up)
            del batch
            for seq, kept in enumerate(held):
                assert_tree_equal(kept, second[seq], f"epoch 1 batch {seq}")
            assert lost_slots(loader) == given_up, "slots handed back while their producer still runs"

            # let it go: it finishes its old tasks, writing into its old slots, drops them, says HELLO again
            os.kill(victim, signal.SIGCONT)
            wait_for(lambda: victim in producer_pids(loader).values(), 20, "the resumed producer to be back")
            # its one sample thread reads in FIFO order: once it has delivered a batch of a new task, every
            # write of its old tasks is done
            loader.set_epoch(2)
            third = reference_batches(dataset, batch_size=BATCH, drop_last=False, world_size=1, rank=0,
                                      shuffle=True, seed=5, epoch=2)
            for seq, batch in enumerate(loader):
                assert_tree_equal(batch, third[seq], f"epoch 2 batch {seq}")
            del batch
            name = next(n for n, pid in producer_pids(loader).items() if pid == victim)
            assert loader.stats()["per_producer"][name]["batches"] >= 1, "the resumed producer served no batch"
            for seq, kept in enumerate(held):
                assert_tree_equal(kept, second[seq], f"epoch 1 batch {seq} after the lost producer resumed")
            assert lost_slots(loader) == given_up, "slots handed back while their producer still runs"

            # once its process is gone, its slots are reclaimed
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: loader.stats()["shared_memory"]["lost"] == 0, 20, "the dead producer's slots back")
            del held, kept
            wait_for(lambda: loader.stats()["shared_memory"]["free"] == loader.stats()["shared_memory"]["slots"],
                     10, "every slot free once the loop dropped its batches")
    finally:
        if victim is not None:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
    check.assert_clean()


"""An iteration abandoned halfway is restarted from its beginning by the next ``iter()`` (README), with
nothing of the old one left: no stray batch, no credit or in-flight task that is not accounted for."""

import pytest

from ferry import RemoteLoader
from tests.datasets import PairDataset

from .helpers import assert_tree_equal, reference_batches, wait_for


@pytest.mark.parametrize("break_after", [0, 3])
def test_an_abandoned_iteration_restarts_from_its_beginning(endpoint, spawn, break_after):
    length, batch_size, capacity = 60, 4, 4
    dataset = PairDataset(length=length)
    # slow samples: tasks are still in flight and batches still buffered when the loop walks away
    for _ in range(2):
        spawn(endpoint, "tests.datasets:PairDataset", {"length": length, "delay": 0.01}, threads=2, slots=2)
    with RemoteLoader(endpoint=endpoint, batch_size=batch_size, shuffle=True, seed=7, buffer_batches=capacity,
                      heartbeat=0.2, timeout=30, log_every=None) as loader:
        loader.set_epoch(2)
        expected = reference_batches(dataset, batch_size=batch_size, drop_last=False, world_size=1, rank=0,
                                     shuffle=True, seed=7, epoch=2)
        first = iter(loader)
        for seq in range(break_after):
            assert_tree_equal(next(first), expected[seq], f"first pass batch {seq}")
        wait_for(lambda: (lambda s: s["in_flight"] > 0 and s["buffered"] > 0)(loader.stats()), 10,
                 "work both in flight and buffered at the moment the loop walks away", interval=0.001)

        second = iter(loader)  # the same epoch, from its first batch
        got = list(second)
        assert len(got) == len(expected)
        for seq, (g, e) in enumerate(zip(got, expected)):
            assert_tree_equal(g, e, f"restarted batch {seq}")
        with pytest.raises(RuntimeError, match="abandoned"):
            next(first)
        # the old run's late batches were dropped, and the credits came back: nothing held, nothing in flight
        wait_for(lambda: loader.stats()["in_flight"] == 0 and loader.stats()["buffered"] == 0, 10,
                 "credits and in-flight tasks back to zero")
        stats = loader.stats()
        assert stats["batches"] == break_after + len(expected), stats
        assert loader.epoch == 3  # the completed pass advanced the epoch; the abandoned one did not

        # and the next epoch is whole too
        expected = reference_batches(dataset, batch_size=batch_size, drop_last=False, world_size=1, rank=0,
                                     shuffle=True, seed=7, epoch=3)
        got = list(loader)
        assert len(got) == len(expected)
        for seq, (g, e) in enumerate(zip(got, expected)):
            assert_tree_equal(g, e, f"epoch 3 batch {seq}")
        wait_for(lambda: loader.stats()["in_flight"] == 0 and loader.stats()["buffered"] == 0, 10,
                 "credits back to zero after the next epoch")


def test_a_shuffled_epoch_left_early_and_started_again_is_said_once_and_not_with_set_epoch(caplog):
    """A loop of a fixed number of steps per epoch: DataLoader draws a new order at each iter(); here the
    abandoned epoch starts again in the same order, so a loop that never calls set_epoch would see the same
    batches every time. That is said once; set_epoch before each epoch (the documented way) says nothing."""
    import logging

    def steps(loader, epochs: int, set_epoch: bool) -> list[list[int]]:
        firsts = []
        for epoch in range(epochs):
            if set_epoch:
                loader.set_epoch(epoch)
            for step, (_, y) in enumerate(loader):
                if step == 0:
                    firsts.append(y.tolist())
                if step == 2:
                    break
        return firsts

    def told() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "was left after" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="ferry.consumer"):
        with RemoteLoader(dataset=PairDataset(length=64), local_producers=1, batch_size=4, shuffle=True, seed=3,
                          timeout=30) as loader:
            firsts = steps(loader, 3, set_epoch=False)
        assert firsts[0] == firsts[1] == firsts[2]  # the behaviour itself, as README states it
        assert len(told()) == 1 and "epoch 0 was left after 3 batches" in told()[0], told()
        assert "loader.set_epoch(epoch)" in told()[0]
        caplog.clear()
        with RemoteLoader(dataset=PairDataset(length=64), local_producers=1, batch_size=4, shuffle=True, seed=3,
                          timeout=30) as loader:
            firsts = steps(loader, 3, set_epoch=True)
        assert len({str(f) for f in firsts}) == 3  # a new order each epoch
        assert told() == []

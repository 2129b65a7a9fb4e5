"""Producer loss: SIGKILL mid-epoch, and orderly leave (BYE), lose nothing and duplicate nothing."""

import os
import random

from ferry import RemoteLoader
from tests.datasets import PairDataset

from .helpers import assert_tree_equal, reference_batches, wait_for


def test_kill_9_two_of_three_producers_mid_epoch(endpoint, spawn):
    seed = int(os.environ.get("FERRY_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    args = {"length": 840, "delay": 0.002}
    producers = [spawn(endpoint, "tests.datasets:PairDataset", args, threads=2, slots=2) for _ in range(3)]
    first_kill = rng.randrange(20, 80)
    second_kill = rng.randrange(100, 160)
    victims = rng.sample(producers, 2)
    got = []
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=5, heartbeat=0.2, liveness=5,
                      timeout=30) as loader:
        wait_for(lambda: loader.stats()["producers"] == 3, 20, "3 producers")
        for i, batch in enumerate(loader):
            got.append(batch)
            if i == first_kill:
                victims[0].kill()
            elif i == second_kill:
                victims[1].kill()
        stats = loader.stats()
    expected = reference_batches(PairDataset(840), batch_size=4, drop_last=False, world_size=1, rank=0,
                                 shuffle=True, seed=5, epoch=0)
    assert len(expected) >= 200
    assert len(got) == len(expected), f"seed {seed}"
    for seq, (g, e) in enumerate(zip(got, expected)):
        assert_tree_equal(g, e, f"batch {seq} (seed {seed})")
    assert stats["reissued"] >= 2, f"re-issues expected after two kills: {stats} (seed {seed})"
    assert stats["producers"] == 1


def test_bye_reissues_at_once_without_waiting_for_liveness(endpoint, spawn):
    args = {"length": 200, "delay": 0.05}  # slow samples: tasks are in flight when it leaves
    leaver = spawn(endpoint, "tests.datasets:PairDataset", args, threads=1, slots=2)
    stayer = spawn(endpoint, "tests.datasets:PairDataset", args, threads=4, slots=2)
    # liveness of 10 minutes: only the BYE can make these tasks move in time
    with RemoteLoader(endpoint=endpoint, batch_size=2, heartbeat=1.0, liveness=600, timeout=60) as loader:
        wait_for(lambda: loader.stats()["producers"] == 2, 20, "2 producers")
        labels = []
        for i, (_, y) in enumerate(loader):
            labels.extend(y.tolist())
            if i == 3:
                wait_for(lambda: any(p["in_flight"] for name, p in loader.stats()["per_producer"].items()
                                     if name.endswith(f":{leaver.pid}")), 10, "the leaver to hold a task")
                assert leaver.terminate() == 0
        assert loader.stats()["reissued"] >= 1
    assert labels == list(range(200))
    assert stayer.proc.poll() is None

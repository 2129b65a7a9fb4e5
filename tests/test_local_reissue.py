"""A local producer's death, seen through its process sentinel, re-issues its tasks at once: not after the
liveness window (here 40 s, so only the sentinel can move them in time). Real processes."""

from __future__ import annotations

import os
import signal
import time

from ferry import RemoteLoader
from tests.datasets import PairDataset

from .helpers import wait_for


def test_a_killed_local_producers_tasks_are_reissued_at_once(caplog):
    with RemoteLoader(dataset=PairDataset(length=80, delay=0.05), local_producers=2, producer_threads=1,
                      producer_slots=2, batch_size=2, heartbeat=1.0, liveness=40, timeout=60) as loader:
        labels = []
        began = None
        for i, (_, y) in enumerate(loader):
            labels.extend(y.tolist())
            if i == 3:
                victim = loader._local.pids[0]
                wait_for(lambda: any(p["in_flight"] for name, p in loader.stats()["per_producer"].items()
                                     if name.endswith(f":{victim}")), 10, "the victim to hold a task")
                began = time.monotonic()
                os.kill(victim, signal.SIGKILL)
        assert time.monotonic() - began < 20  # the liveness window alone would take 40 s
        assert loader.stats()["reissued"] >= 1
    assert labels == list(range(80))
    assert any("killed by SIGKILL" in r.getMessage() and "lost" in r.getMessage() for r in caplog.records)

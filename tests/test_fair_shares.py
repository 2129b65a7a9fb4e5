"""Fair shares of one producer pool (producer/fairshare.py) with real processes: 4 producers serve 3 consumers
whose demand exceeds the pool (each keeps every producer's slots busy, its training loop takes batches as fast as
they come). The samples sleep, so that 2 cores measure producer time rather than the CPU: each batch costs a
producer the same time, and a consumer's share of the batches is its share of the pool's time."""

from __future__ import annotations

import threading
import time

import pytest

from ferry import RemoteLoader
from tests.helpers import free_port, wait_for

PRODUCERS, SLOTS, BATCH, DELAY = 4, 2, 4, 0.1  # each producer: 2 batches at once, 0.1 s each: 20 batches/s
DATASET = {"length": 1_000_000, "shape": [2], "dtype": "float32", "delay": DELAY}


class Job:
    """One consumer in its own thread, counting the batches its training loop takes."""

    def __init__(self, weight: float) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.loader = RemoteLoader(endpoint=self.endpoint, dataset="synthetic", dataset_args=DATASET,
                                   batch_size=BATCH, buffer_batches=4 * PRODUCERS * SLOTS, weight=weight,
                                   heartbeat=0.2, timeout=60, log_every=None)
        self.batches = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"job-{weight}")
        self.failure: BaseException | None = None

    def _run(self) -> None:
        try:
            for _ in self.loader:
                self.batches += 1
                if self.stop.is_set():
                    break
        except BaseException as exc:  # seen by the test, never lost in a thread
            self.failure = exc

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.loader.close()
        assert not self.thread.is_alive() and self.failure is None, self.failure


def measured_shares(spawn, weights: list[float], batches: int) -> list[float]:
    """Each job's share of the ``batches`` the pool delivered once every job was served by every producer."""
    jobs = [Job(w) for w in weights]
    try:
        for _ in range(PRODUCERS):
            spawn([job.endpoint for job in jobs], "", threads=SLOTS * BATCH, slots=SLOTS)
        for job in jobs:
            job.thread.start()
        wait_for(lambda: all(job.loader.stats()["producers"] == PRODUCERS and job.batches >= 10 for job in jobs),
                 60, "every producer serving every job")
        start = [job.batches for job in jobs]
        began = time.monotonic()
        wait_for(lambda: sum(job.batches for job in jobs) - sum(start) >= batches, 120, f"{batches} batches")
        counts = [job.batches - s for job, s in zip(jobs, start)]
        rate = sum(counts) / (time.monotonic() - began)
        print(f"weights {weights}: batches {counts}, {rate:.1f} batches/s (the pool's most: "
              f"{PRODUCERS * SLOTS / DELAY:.0f})")
        return [c / sum(counts) for c in counts]
    finally:
        for job in jobs:
            job.close()


def test_weights_1_1_2_get_a_quarter_a_quarter_and_a_half_of_the_pool_within_10_percent(spawn):
    shares = measured_shares(spawn, [1.0, 1.0, 2.0], batches=800)
    for share, expected in zip(shares, (0.25, 0.25, 0.5)):
        assert share == pytest.approx(expected, rel=0.10), shares


def test_equal_weights_share_the_pool_fairly_jain_index_at_least_095(spawn):
    shares = measured_shares(spawn, [1.0, 1.0, 1.0], batches=600)
    jain = sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares))
    assert jain >= 0.95, shares

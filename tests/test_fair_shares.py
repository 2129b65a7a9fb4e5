"""Fair shares of one producer pool (producer/core/fairshare.py) with real processes: 4 producers serve 3 consumers
whose demand exceeds the pool (each keeps every producer's slots busy, its training loop takes batches as fast as
they come). The samples sleep, so that 2 cores measure producer time rather than the CPU: each batch costs a
producer the same time, and a consumer's share of the batches is its share of the pool's time."""

from __future__ import annotations

import pytest

from tests.helpers import wait_for
from tests.pool_jobs import DELAY, PRODUCERS, SLOTS, Job, spawn_pool, window


def measured_shares(spawn, weights: list[float], batches: int) -> list[float]:
    """Each job's share of the ``batches`` the pool delivered once every job was served by every producer."""
    jobs = [Job(w) for w in weights]
    try:
        spawn_pool(spawn, jobs)
        for job in jobs:
            job.start()
        wait_for(lambda: all(job.loader.stats()["producers"] == PRODUCERS and job.batches >= 10 for job in jobs),
                 60, "every producer serving every job")
        counts, seconds = window(jobs, batches)
        print(f"weights {weights}: batches {counts}, {sum(counts) / seconds:.1f} batches/s (the pool's most: "
              f"{PRODUCERS * SLOTS / DELAY:.0f})")
        return [c / sum(counts) for c in counts]
    finally:
        for job in jobs:
            job.close()


@pytest.mark.slow  # a measurement of shares: 10 s each (.ci/run runs -m slow)
def test_weights_1_1_2_get_a_quarter_a_quarter_and_a_half_of_the_pool_within_10_percent(spawn):
    shares = measured_shares(spawn, [1.0, 1.0, 2.0], batches=800)
    for share, expected in zip(shares, (0.25, 0.25, 0.5)):
        assert share == pytest.approx(expected, rel=0.10), shares


@pytest.mark.slow  # a measurement of shares: 10 s each (.ci/run runs -m slow)
def test_equal_weights_share_the_pool_fairly_jain_index_at_least_095(spawn):
    shares = measured_shares(spawn, [1.0, 1.0, 1.0], batches=600)
    jain = sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares))
    assert jain >= 0.95, shares


@pytest.mark.slow  # a measurement of shares: 10 s (.ci/run runs -m slow)
def test_a_weight_asking_for_more_than_half_of_each_producer_gets_it_from_the_tasks_it_holds_ahead(spawn):
    # 3:1 on 2-slot producers: the heavy job needs a worker again the moment one of its batches ends. With its
    # slots only, each of its completions left a credit's round trip during which the worker went to the other
    # job (measured 55.7 : 44.3 with FERRY_AHEAD=0); the tasks it holds ahead are waiting in its queue instead.
    shares = measured_shares(spawn, [3.0, 1.0], batches=800)
    for share, expected in zip(shares, (0.75, 0.25)):
        assert share == pytest.approx(expected, rel=0.10), shares

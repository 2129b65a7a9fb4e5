"""The demand gauge (consumer/figures/demand.py): how many producers of the current speed the loop needs.

The unit tests feed it samples of a known regime; the process-level test (marked ``slow``: about 30 s) measures
it for real against sleeping producers and a sleeping training step, across a change of the step."""

from __future__ import annotations

import time

import pytest

from tests import needs

from ferry import RemoteLoader
from ferry.consumer.figures.demand import HOLD, DemandGauge, DemandSample

from .helpers import free_port


def regime(gauge: DemandGauge, *, seconds: float, start: DemandSample | None, want: float, delivered: float,
           busy: float, cpu_per_batch: float | None = None, waiting: bool | None = None) -> DemandSample:
    """Samples once a second of a regime: the loop takes ``delivered`` batches/s and would take ``want``/s if it
    never waited; ``busy`` producers have every slot in use. Returns the last sample."""
    s = start or DemandSample(at=0.0, batches=0, wait_s=0.0, active_s=0.0, received=0, busy_s=0.0, consumer_cpu_s=0.0)
    for _ in range(int(seconds)):
        working = delivered / want  # seconds of each second the loop works; the rest it waits
        cpu = None if cpu_per_batch is None else s.consumer_cpu_s + delivered * cpu_per_batch
        s = DemandSample(at=s.at + 1, batches=s.batches + int(delivered), wait_s=s.wait_s + (1 - working),
                         active_s=s.active_s + 1, received=s.received + int(delivered), busy_s=s.busy_s + busy,
                         consumer_cpu_s=cpu)
        gauge.add(s)
    return s


def test_a_starved_loop_needs_producers_in_proportion_to_what_it_wants():
    gauge = DemandGauge()
    assert gauge.value is None  # nothing known before a window
    # one producer, always busy, delivers 20 batches/s; the loop would take 100/s
    regime(gauge, seconds=12, start=None, want=100, delivered=20, busy=1.0)
    assert gauge.value == 5 and gauge.raw == pytest.approx(5.0)


def test_producers_waiting_for_credits_count_for_what_they_could_deliver():
    gauge = DemandGauge()
    # four producers, each busy a quarter of the time (the loop keeps up and the window is full): 80/s of capacity,
    # the loop wants 20/s
    regime(gauge, seconds=12, start=None, want=20, delivered=20, busy=1.0)
    assert gauge.value == 1


def test_the_consumer_s_own_limit_caps_the_demand():
    gauge = DemandGauge()
    # producers of 10 batches/s each; the loop would take 100/s, but the consumer's threads spend 25 ms of CPU a
    # batch: 40/s at most, so more than 4 producers would only queue
    regime(gauge, seconds=12, start=None, want=100, delivered=10, busy=1.0, cpu_per_batch=0.025)
    assert gauge.value == 4


def test_a_change_is_followed_within_the_window_and_a_pause_changes_nothing():
    gauge = DemandGauge()
    last = regime(gauge, seconds=12, start=None, want=100, delivered=20, busy=1.0)
    assert gauge.value == 5
    paused = DemandSample(at=last.at + 30, batches=last.batches, wait_s=last.wait_s, active_s=last.active_s,
                          received=last.received, busy_s=last.busy_s, consumer_cpu_s=0.0)
    gauge.add(paused)  # the loop did not run for 30 s (an evaluation): no batches, no estimate
    assert gauge.value == 5
    changed_at = paused.at
    s = paused
    for _ in range(15):  # the step slows down: the loop now wants 30/s of the same producers
        s = regime(gauge, seconds=1, start=s, want=30, delivered=20, busy=1.0)
        if gauge.value == 2:
            break
    assert gauge.value == 2 and s.at - changed_at <= 15


def test_noise_around_a_boundary_does_not_flap():
    gauge = DemandGauge()
    s = regime(gauge, seconds=10, start=None, want=60, delivered=20, busy=1.0)  # exactly 3
    assert gauge.value == 3
    published = []
    for i in range(20):  # 2.9 .. 3.1 producers' worth, alternating
        s = regime(gauge, seconds=1, start=s, want=58 if i % 2 else 62, delivered=20, busy=1.0)
        published.append(gauge.value)
    assert set(published) <= {3, 4} and sum(a != b for a, b in zip(published, published[1:])) <= 1, published
    assert HOLD >= 2


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_gauge_is_right_within_one_producer_within_15_s_of_a_change(endpoint, spawn):
    """One producer delivering about 25 batches/s (40 ms a sample, one thread, one slot); the step first takes
    10 ms (the loop wants about 100/s: 4 producers), then 100 ms (10/s: 1 producer)."""
    needs.module("prometheus_client", "metrics")
    from .test_metrics import scrape, value

    spawn(endpoint, "synthetic", {"length": 100000, "shape": [4], "delay": 0.04}, threads=1, slots=1)
    port = free_port()
    with RemoteLoader(endpoint=endpoint, batch_size=1, heartbeat=0.2, timeout=30, log_every=None,
                      metrics_port=port) as loader:
        batches = iter(loader)

        def run(step_s: float, expected: int, within_s: float) -> float:
            began = time.monotonic()
            deadline = began + within_s
            while time.monotonic() < deadline:
                next(batches)
                time.sleep(step_s)
                needed = loader.stats()["producers_needed"]
                if needed is not None and abs(needed - expected) <= 1 and time.monotonic() - began > 5:
                    return time.monotonic() - began
            raise AssertionError(f"producers_needed {loader.stats()['producers_needed']}, expected {expected} +-1 "
                                 f"within {within_s} s")

        run(0.01, 4, 20)
        took = run(0.1, 1, 15)
        assert took <= 15
        stats, text = loader.stats(), scrape(port)
        assert stats["producers"] == 1 and 0 <= stats["producers_needed"] <= 2
        # what engines scale on, under the names docs/deployment.md gives
        assert value(text, "ferry_producers_connected") == 1 and 0 <= value(text, "ferry_producers_needed") <= 2
        assert 0 <= value(text, "ferry_stall_fraction") <= 1

"""Acceptance 2: with a slow training loop, buffered + in flight never exceeds buffer_batches."""

import threading
import time

from ferry import RemoteLoader


def test_slow_loop_never_exceeds_capacity(endpoint, spawn):
    spawn(endpoint, "tests.datasets:PairDataset", {"length": 240, "shape": [64, 64]}, threads=2, slots=3)
    spawn(endpoint, "tests.datasets:PairDataset", {"length": 240, "shape": [64, 64]}, threads=2, slots=3)
    capacity = 4
    samples: list[tuple[int, int]] = []
    stop = threading.Event()
    with RemoteLoader(endpoint=endpoint, batch_size=4, buffer_batches=capacity, heartbeat=0.2, timeout=30) as loader:

        def sample() -> None:
            while not stop.is_set():
                s = loader.stats()
                samples.append((s["buffered"], s["in_flight"]))
                time.sleep(0.001)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            count = 0
            for _ in loader:
                time.sleep(0.02)  # a training step far slower than loading
                count += 1
        finally:
            stop.set()
            sampler.join(10)
    assert count == 60
    assert len(samples) > 200
    totals = [b + f for b, f in samples]
    assert max(totals) <= capacity, f"bound broken: max buffered + in flight = {max(totals)}"
    # the loop is slow, so the buffer must actually be full most of the time: the bound is exercised
    assert sum(1 for t in totals if t == capacity) > len(totals) // 2
    assert max(b for b, _ in samples) == capacity

"""Acceptance 2: with a slow training loop, buffered + in flight never exceeds buffer_batches.

Checked from the producers' side, not from ``stats()`` (whose counters are the ones that enforce the bound):
each real producer process serves its own figures on a metrics port, and every task it has taken is either
still pending there or counted in ``batches_sent``. A task the consumer issued and the loop has not yet got
is either in flight or buffered, so at every moment

    sum over producers (batches_sent + pending) - batches the loop took <= buffer_batches

The producers' side may lag (a task on the wire, a batch between its worker and its socket), never lead: it
can miss an excess for a moment, never invent one. A batch counts as taken from the moment the loop asks for
it, since the loader frees its credit inside ``next()``.
"""

import re
import threading
import time
import urllib.request

from ferry import RemoteLoader

from . import needs
from .helpers import free_port, wait_for

FIGURE = re.compile(r"^ferry_producer_(batches_sent_total|pending) ([0-9.e+]+)$", re.M)


def taken_by_producers(port: int) -> int:
    """batches_sent + pending of the producer serving metrics on ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        figures = dict(FIGURE.findall(reply.read().decode()))
    return int(float(figures["batches_sent_total"])) + int(float(figures["pending"]))


def test_slow_loop_never_exceeds_capacity(endpoint, spawn):
    needs.module("prometheus_client", "metrics")  # the producers' metrics port
    ports = [free_port(), free_port()]
    for port in ports:
        spawn(endpoint, "tests.datasets:PairDataset", {"length": 240, "shape": [64, 64]}, threads=2, slots=3,
              extra=["--metrics-port", str(port)])
    capacity = 4
    asked = 0  # batches the loop asked for (taken, or being taken)
    held: list[int] = []  # the producers' count of tasks taken, less the loop's, at each sample
    stop = threading.Event()
    with RemoteLoader(endpoint=endpoint, batch_size=4, buffer_batches=capacity, heartbeat=0.2, timeout=30,
                      log_every=None) as loader:
        wait_for(lambda: loader.stats()["producers"] == 2, 20, "2 producers")

        def sample() -> None:
            while not stop.is_set():
                producers = sum(taken_by_producers(port) for port in ports)
                held.append(producers - asked)  # the loop's count read last: it can only have grown

        sampler = threading.Thread(target=sample, name="producer-side-sampler")
        sampler.start()
        try:
            it = iter(loader)
            for count in range(1, 61):
                asked = count
                next(it)
                time.sleep(0.02)  # a training step far slower than loading
            asked = 61
            assert next(it, None) is None, "more than the epoch's 60 batches"
        finally:
            stop.set()
            sampler.join(10)
    assert len(held) >= 20, f"only {len(held)} samples of the producers' figures"
    assert max(held) <= capacity, f"bound broken: the producers took {max(held)} tasks the loop had not got"
    # the loop is slow, so the window must actually be full: the bound is exercised, not just respected
    assert max(held) == capacity, f"the window never filled (max {max(held)} of {capacity})"
    assert sum(1 for h in held if h == capacity) >= len(held) // 3, f"the window was seldom full: {held}"

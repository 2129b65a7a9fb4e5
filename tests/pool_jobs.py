"""Jobs sharing one producer pool, for the tests of its shares and isolation: each a RemoteLoader in a thread of
its own that counts the batches its training loop takes, and may pause (a paused evaluation)."""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

from ferry import RemoteLoader
from tests import needs
from tests.helpers import free_port, wait_for

PRODUCERS, SLOTS, BATCH, DELAY = 4, 2, 4, 0.1  # each producer: 2 batches at once, 0.1 s each: 20 batches/s
DATASET = {"length": 1_000_000, "shape": [2], "dtype": "float32", "delay": DELAY}


class Job:
    """One consumer in a thread of its own. ``pause_after``: its loop stops taking batches after that many, until
    :meth:`resume` (bounded by ``pause_timeout``)."""

    def __init__(self, weight: float = 1.0, *, pause_after: int | None = None, buffer_batches: int | None = None,
                 **loader: Any) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        options = dict(dataset="synthetic", dataset_args=DATASET, batch_size=BATCH, heartbeat=0.2, timeout=60,
                       log_every=None)
        options.update(loader)
        self.loader = RemoteLoader(endpoint=self.endpoint, weight=weight,
                                   buffer_batches=buffer_batches or 4 * PRODUCERS * SLOTS, **options)
        self.batches = 0
        self.first_at: float | None = None  # when its loop took its first batch
        self.pause_after = pause_after
        self.paused = threading.Event()
        self._resume = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"job-{weight}")
        self.failure: BaseException | None = None

    def start(self) -> "Job":
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            for _ in self.loader:
                self.batches += 1
                if self.first_at is None:
                    self.first_at = time.monotonic()
                if self.batches == self.pause_after:
                    self.paused.set()
                    self._resume.wait(120)
                if self.stop.is_set():
                    break
        except BaseException as exc:  # seen by the test, never lost in a thread
            self.failure = exc

    def resume(self) -> None:
        self._resume.set()

    def close(self) -> None:
        self.stop.set()
        self._resume.set()
        if self.thread.ident is not None:  # started (a test skipped before it starts closes it too)
            self.thread.join(30)
        self.loader.close()
        assert not self.thread.is_alive() and self.failure is None, self.failure


def spawn_pool(spawn, jobs: list[Job], count: int = PRODUCERS, metrics: bool = False) -> list[Any]:
    """``count`` producers without a dataset of their own, each connected to every job; with ``metrics`` each
    serves its figures on a port of its own (``producer.metrics_port``), which needs the metrics extra: without it
    the test is skipped, saying so (failed under CI=true)."""
    if metrics:
        needs.module("prometheus_client", "metrics")
    producers = []
    for _ in range(count):
        port = free_port() if metrics else None
        producer = spawn([job.endpoint for job in jobs], "", threads=SLOTS * BATCH, slots=SLOTS,
                         extra=["--metrics-port", str(port)] if port else [])
        producer.metrics_port = port
        producers.append(producer)
    return producers


def window(jobs: list[Job], batches: int, timeout: float = 120.0) -> tuple[list[int], float]:
    """Each job's batches while the jobs together take ``batches`` more, and the seconds that took."""
    start, began = [job.batches for job in jobs], time.monotonic()
    wait_for(lambda: sum(job.batches for job in jobs) - sum(start) >= batches, timeout, f"{batches} batches")
    return [job.batches - s for job, s in zip(jobs, start)], time.monotonic() - began


def job_figures(port: int) -> dict[str, dict[str, float]]:
    """A producer's per-job figures from its metrics endpoint: job endpoint -> {figure: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    jobs: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("ferry_producer_job_"):
            continue
        for sample in family.samples:
            field = family.name[len("ferry_producer_job_"):]
            jobs.setdefault(sample.labels["job"], {})[field] = sample.value
    return jobs

"""Issue 32: a stoppable ``serve()`` and a loader that hears of a producer's death from whoever supervises it.

``serve(config, dataset, stop=ServeHandle())`` runs on any thread (an engine's actor method does) and stops when
the handle is set, by the path SIGTERM takes: BYE (its tasks go back to the loader without an attempt charged),
drain, return 0. ``RemoteLoader.producer_gone(name)`` loses a producer at once: its tasks are issued again within
a second, where its heartbeat would take the liveness window. Real producers, real sockets.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from ferry import RemoteLoader
from ferry.producer import ProducerConfig, ServeHandle, serve

from .datasets import PairDataset
from .helpers import kept_process_state, LeakCheck, assert_epoch_matches, wait_for, warm_zero_copy


@pytest.fixture(autouse=True)
def _process_state():
    """serve() runs on threads of this process here: what it sets for its process is put back after each test."""
    with kept_process_state():
        yield


SEED = 5


class Serving:
    """``serve`` on a thread of this process, as an actor runs it; ``code`` once it returned."""

    def __init__(self, endpoint: str, dataset: PairDataset, handle: ServeHandle) -> None:
        self.code: int | None = None
        config = ProducerConfig(endpoints=(endpoint,), threads=2, slots=2, heartbeat=0.2, dataset_label="pairs")
        self.thread = threading.Thread(target=self._run, args=(config, dataset, handle), name="test-serve")
        self.thread.start()

    def _run(self, config: ProducerConfig, dataset: PairDataset, handle: ServeHandle) -> None:
        self.code = serve(config, dataset, stop=handle)


def test_a_handle_stops_serve_on_its_thread_by_the_drain_path_and_leaves_the_process_signals_alone(endpoint):
    warm_zero_copy()
    before = LeakCheck()
    handlers = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    dataset = PairDataset(length=48, delay=0.02)
    first, second = ServeHandle(), ServeHandle()
    rest: list[Serving] = []
    # max_attempts=1: a task charged one attempt is poison, so an exact epoch shows the stop charged none
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=SEED, heartbeat=0.2, max_attempts=1,
                      timeout=60, log_every=None) as loader:
        assert first.figures() is None
        serving = Serving(endpoint, dataset, first)
        wait_for(lambda: loader.stats()["producers"] == 1, 30, "the producer on a thread to join")
        figures = wait_for(first.figures, 5, "the running producer's figures")
        assert "pool_demand" in figures and "batches_sent" in figures, figures

        def stop_at(seq: int) -> None:
            if seq == 3:
                assert loader.stats()["in_flight"] >= 1
                stopped = time.monotonic()
                first.set()
                serving.thread.join(10)
                assert not serving.thread.is_alive() and serving.code == 0, serving.code
                assert time.monotonic() - stopped < 5.0  # BYE, then at most the 3 s drain
                wait_for(lambda: loader.stats()["producers"] == 0, 10, "the loader to see the BYE")
                rest.append(Serving(endpoint, dataset, second))  # the rest of the epoch
        assert_epoch_matches(loader, dataset, epoch=0, batch_size=4, seed=SEED, each=stop_at)
        assert loader.stats()["reissued"] >= 1  # the stopped producer's tasks went back
        second.set()
        rest[0].thread.join(10)
        assert rest[0].code == 0
    assert first.figures() is None and first.is_set()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
    before.assert_clean()


def test_a_handle_set_before_serve_built_its_producer_stops_it_as_soon_as_it_is_built(endpoint):
    handle = ServeHandle()
    handle.set()
    config = ProducerConfig(endpoints=(endpoint,), threads=1, heartbeat=0.2, dataset_label="pairs")
    started = time.monotonic()
    assert serve(config, PairDataset(length=8), stop=handle) == 0
    assert time.monotonic() - started < 5.0


def test_producer_gone_loses_a_frozen_producer_at_once_instead_of_after_its_liveness_window(endpoint, spawn):
    dataset = PairDataset(length=40, delay=0.05)
    # liveness 100 × 0.2 s: the heartbeat alone would take 20 s to give up on the frozen producer
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=SEED, heartbeat=0.2, liveness=100,
                      timeout=60, log_every=None) as loader:
        frozen = spawn(endpoint, "tests.datasets:PairDataset", {"length": 40, "delay": 0.05}, threads=2, slots=2)
        name = wait_for(lambda: next(iter(loader.stats()["per_producer"]), None), 30, "the producer to join")

        def freeze_at(seq: int) -> None:
            if seq != 2:
                return
            wait_for(lambda: loader.stats()["per_producer"][name]["in_flight"] >= 1, 10, "a task at the producer")
            os.kill(frozen.pid, signal.SIGSTOP)  # alive, holding its tasks, silent
            before = loader.stats()["reissued"]
            loader.producer_gone("elsewhere:1", "a name no producer has")  # changes nothing
            told = time.monotonic()
            loader.producer_gone(name, "its supervisor saw it die")
            wait_for(lambda: loader.stats()["reissued"] > before, 5, "its tasks to be issued again")
            took = time.monotonic() - told
            assert took < 1.0, f"re-issued {took:.2f} s after producer_gone"
            assert loader.stats()["producers"] == 0
            spawn(endpoint, "tests.datasets:PairDataset", {"length": 40, "delay": 0.05}, threads=2, slots=2)
        try:
            assert_epoch_matches(loader, dataset, epoch=0, batch_size=4, seed=SEED, each=freeze_at)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)

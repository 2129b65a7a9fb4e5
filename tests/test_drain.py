"""Issue 19, part 5: SIGTERM drains a producer within an engine's grace period. It says BYE at once (its consumer
re-issues the tasks it held, charging no attempt), waits at most ``--drain-timeout`` for the samples it is loading,
then exits 0 without them: well inside Docker's 10 s, even with samples that would take a minute."""

from __future__ import annotations

import os
import signal
import time

from ferry import RemoteLoader

from .helpers import wait_for

SLOW_S = 60.0  # one sample of the slow producer: far past any grace period


def test_sigterm_with_slow_samples_in_flight_exits_0_within_the_grace_period_and_hands_the_tasks_back(endpoint,
                                                                                                       spawn,
                                                                                                       tmp_path):
    loading = str(tmp_path / "loading")
    slow = spawn(endpoint, "tests.engine_datasets:SlowPairs", {"length": 8, "delay": SLOW_S, "loading": loading},
                 threads=2, slots=2)
    # max_attempts=1: a task charged a single attempt is poison, so an epoch that completes shows none was charged
    with RemoteLoader(endpoint=endpoint, batch_size=2, heartbeat=0.2, max_attempts=1, timeout=60,
                      log_every=None) as loader:
        batches = iter(loader)
        wait_for(lambda: os.path.exists(loading), 30, "the slow producer to load a sample")
        assert loader.stats()["producers"] == 1 and loader.stats()["in_flight"] >= 1
        signalled = time.monotonic()
        slow.proc.send_signal(signal.SIGTERM)
        code = slow.proc.wait(10)  # Docker's default grace period; SIGKILL would come next
        took = time.monotonic() - signalled
        assert code == 0, slow.output()
        assert took < 6.0, f"exit took {took:.1f} s after SIGTERM (drain timeout 3 s)"
        assert "batches were still loading 3 s after the stop (--drain-timeout); exiting without them" in slow.output()
        wait_for(lambda: loader.stats()["producers"] == 0, 10, "the consumer to see the BYE")
        spawn(endpoint, "tests.engine_datasets:SlowPairs", {"length": 8, "delay": 0.0}, threads=2)
        labels = [y.tolist() for _, y in batches]
        assert sorted(label for batch in labels for label in batch) == list(range(8))
        assert loader.stats()["reissued"] >= 2


def test_a_producer_whose_samples_finish_within_the_drain_timeout_exits_without_abandoning_them(endpoint, spawn,
                                                                                                   tmp_path):
    loading = str(tmp_path / "loading")
    producer = spawn(endpoint, "tests.engine_datasets:SlowPairs", {"length": 8, "delay": 0.5, "loading": loading},
                     threads=2, extra=["--drain-timeout", "5"])
    with RemoteLoader(endpoint=endpoint, batch_size=2, heartbeat=0.2, timeout=60, log_every=None) as loader:
        batches = iter(loader)  # noqa: F841 (held: the run stays started)
        wait_for(lambda: os.path.exists(loading), 30, "the producer to load a sample")
        signalled = time.monotonic()
        assert producer.terminate() == 0
        took = time.monotonic() - signalled
    assert took < 5.0, f"exit took {took:.1f} s"
    assert "still loading" not in producer.output() and "stopped after" in producer.output()


def test_a_local_producer_stopped_by_its_loader_waits_for_no_slow_sample():
    """close() while a 10 s sample loads: the local producer says BYE (its tasks are the loader's again) and ends
    after LOCAL_DRAIN_TIMEOUT_S. Before, its drain waited 3 s and multiprocessing then joined the loading thread at
    exit, until the loader killed it JOIN_TIMEOUT_S (5 s) into close(); a Ctrl-C waited as long."""
    import os
    import time as clock

    from ferry import RemoteLoader
    from ferry.common.constants import LOCAL_DRAIN_TIMEOUT_S
    from tests.poison_datasets import SlowSampleDataset

    loader = RemoteLoader(dataset=SlowSampleDataset(length=40, slow=range(2, 40), sleep=10), local_producers=1,
                          batch_size=2, producer_threads=1, timeout=60)
    try:
        it = iter(loader)
        next(it)  # samples 0 and 1; the producer is loading sample 2 now
        pid = loader._local.pids[0]
        began = clock.monotonic()
    finally:
        loader.close()
    took = clock.monotonic() - began
    assert took < LOCAL_DRAIN_TIMEOUT_S + 2.0, f"close() took {took:.2f} s: it waited for the loading thread"
    assert not os.path.exists(f"/proc/{pid}")  # reaped by close(), not left to a later kill

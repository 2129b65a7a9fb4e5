"""An orderly leave (BYE, a producer's SIGTERM) costs its tasks no attempt (issue 17): a rolling restart of
the producers never poisons a batch, even with ``max_attempts=1``, where one charged loss would.

Real producer processes serve a slow dataset, so each holds tasks when it is told to stop. Three times in a
row, the oldest producer is SIGTERMed while it holds a task, and a fresh one is started in its place.
"""

from __future__ import annotations

from ferry import RemoteLoader

from .helpers import ProducerProcess, wait_for

LENGTH, BATCH = 80, 4  # 20 batches: the last restart leaves 9, 0.7 s of work at least
ARGS = {"length": LENGTH, "delay": 0.02}  # 80 ms a batch on one thread: tasks are held while it works
RESTART_AT = (2, 6, 10)  # batches after which the oldest producer is restarted


def _holds_a_task(loader: RemoteLoader, producer: ProducerProcess) -> bool:
    return any(figures["in_flight"] for name, figures in loader.stats()["per_producer"].items()
               if name.endswith(f":{producer.pid}"))


def test_a_rolling_restart_with_max_attempts_1_delivers_the_whole_epoch(endpoint, spawn):
    start = lambda: spawn(endpoint, "tests.datasets:PairDataset", ARGS, threads=1, slots=2)  # noqa: E731
    running = [start(), start()]
    labels: list[int] = []
    # a liveness of 10 s: on a loaded machine a producer slow to ping is not lost (that would cost an attempt);
    # only the BYEs move tasks here
    with RemoteLoader(endpoint=endpoint, batch_size=BATCH, max_attempts=1, heartbeat=0.2, liveness=50, timeout=30,
                      log_every=None) as loader:
        wait_for(lambda: loader.stats()["producers"] == 2, 20, "2 producers")
        for i, (_, y) in enumerate(loader):  # a PoisonTaskError here: the BYE cost an attempt
            labels.extend(y.tolist())
            if i in RESTART_AT:
                oldest = running.pop(0)
                wait_for(lambda: _holds_a_task(loader, oldest), 10, f"producer {oldest.pid} to hold a task")
                assert oldest.terminate() == 0, oldest.output()  # SIGTERM: it says BYE and exits 0
                running.append(start())
        stats = loader.stats()
    assert labels == list(range(LENGTH))
    assert stats["reissued"] >= len(RESTART_AT), f"each leaver's tasks must have been re-issued: {stats}"

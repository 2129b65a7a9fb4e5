"""A training loop that stops reading for many liveness windows keeps its producers' TCP connections.

Both sides give up a connection whose data goes unacknowledged for the liveness window (common/deadlinks.py). A
stalled training loop must not look like that: the io thread reads every batch the credits allow, so TCP
acknowledges them, however long the loop does not call next(). Batches of 16 MB, the loader's window of them
(128 MB) more than the kernel's socket buffers hold, and a 0.3 s window, stalled for 10 of them.
"""

import time

from ferry import RemoteLoader

from .helpers import wait_for

HEARTBEAT_S, LIVENESS = 0.1, 3
STALL_S = 10 * HEARTBEAT_S * LIVENESS
BATCH_BYTES = 4 * 1024 * 1024 * 4  # 4 samples of float32 (1024, 1024)


def test_a_stalled_training_loop_keeps_its_producers_connections(endpoint, spawn):
    producer = spawn(endpoint, "tests.datasets:PairDataset", {"length": 64, "shape": [1024, 1024]}, threads=2, slots=2,
                     heartbeat=HEARTBEAT_S, extra=["--liveness", str(LIVENESS)])
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=HEARTBEAT_S, liveness=LIVENESS, buffer_batches=8,
                      timeout=60) as loader:
        batches = iter(loader)
        assert next(batches)[0].nbytes == BATCH_BYTES
        wait_for(lambda: loader.stats()["buffered"] >= 4, 30, "the loader's buffer to fill while the loop waits")
        time.sleep(STALL_S)  # the stall itself: the loop reads nothing
        stalled = loader.stats()
        rest = sum(1 for _ in batches)
        stats = loader.stats()
    assert rest == 15, f"{rest + 1} batches of 16"
    assert (stalled["producers"], stats["producers_seen"], stats["reissued"]) == (1, 1, 0), (
        f"the producer was lost or rejoined across the stall: {stalled['producers']} live during it, "
        f"{stats['producers_seen']} admissions, {stats['reissued']} tasks re-issued")
    log = producer.output()
    assert log.count("serving consumer at") == 1 and "silent for" not in log and "rebuild" not in log, log

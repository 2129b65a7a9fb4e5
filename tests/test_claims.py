"""One test for each README claim that had none: CURVE keys read again at the next handshake, a resume
saved with in_order=False refused, a batch larger than max_batch_bytes refused, and stall_fraction equal to
the share of its time the loop spent waiting, in the regime a known load time and step time make."""

import shutil
import subprocess
import sys
import threading
import time

import pytest

from ferry import BatchTooLarge, RemoteLoader
from ferry.common.errors import ConfigError

from .helpers import REPO, producer_env, wait_for


# --- CURVE: "Add a producer later by copying its .key into the authorized folder: it is read again at the
# next handshake." -------------------------------------------------------------------------------------
def _keys(folder, producer: str) -> None:
    out = subprocess.run([sys.executable, "-m", "ferry", "keys", str(folder), "--producer", producer],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr


def _curve_producer(spawn, endpoint, tmp_path):
    return spawn(endpoint, "tests.datasets:PidDataset", {"length": 40},
                 extra=["--curve-key", str(tmp_path / "later" / "late.key_secret"), "--curve-server-key",
                        str(tmp_path / "keys" / "server.key")])


def _curve_loader(endpoint, tmp_path, timeout=30.0) -> RemoteLoader:
    k = tmp_path / "keys"
    return RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, timeout=timeout, log_every=None,
                        curve_secret_key=str(k / "server.key_secret"), curve_authorized_keys=str(k / "authorized"))


def test_curve_reads_the_authorized_keys_again_at_the_next_handshake(endpoint, spawn, tmp_path, caplog):
    _keys(tmp_path / "keys", "first")
    _keys(tmp_path / "later", "late")
    with _curve_loader(endpoint, tmp_path) as loader:
        denied = _curve_producer(spawn, endpoint, tmp_path)  # the running trainer has read the folder: denied
        wait_for(lambda: any("DENIED" in r.getMessage() for r in caplog.records), 20, "the late key to be denied")
        denied.close()
        assert loader.stats()["producers_seen"] == 0
        shutil.copy(tmp_path / "later" / "late.key", tmp_path / "keys" / "authorized" / "late.key")
        late = _curve_producer(spawn, endpoint, tmp_path)  # same key, next handshake: let in, no trainer restart
        pids = {int(p[0]) for _, _, p in loader}
        assert loader.stats()["producers_seen"] == 1
    assert pids == {late.pid}


def test_a_denied_producer_gets_in_once_its_key_is_authorized(endpoint, spawn, tmp_path, caplog):
    """libzmq never retries a denied CURVE handshake; the producer rebuilds its socket after a back-off
    (Connection.auth_denied), so a key authorized while it runs gets in without a restart."""
    _keys(tmp_path / "keys", "first")
    _keys(tmp_path / "later", "late")
    with _curve_loader(endpoint, tmp_path, timeout=15.0) as loader:
        late = _curve_producer(spawn, endpoint, tmp_path)
        wait_for(lambda: any("DENIED" in r.getMessage() for r in caplog.records), 20, "the late key to be denied")
        shutil.copy(tmp_path / "later" / "late.key", tmp_path / "keys" / "authorized" / "late.key")
        pids = {int(p[0]) for _, _, p in loader}
    assert pids == {late.pid}


# --- resume: "a state saved with in_order=False cannot be resumed exactly" ----------------------------------
def test_a_state_saved_with_in_order_false_is_refused(endpoint, spawn):
    spawn(endpoint, "tests.datasets:PairDataset", {"length": 40})
    with RemoteLoader(endpoint=endpoint, batch_size=4, in_order=False, heartbeat=0.2, timeout=30) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
    assert state["in_order"] is False and state["batches_delivered"] == 1
    with RemoteLoader(endpoint=endpoint, batch_size=4, in_order=False, dataset_len=40, timeout=5) as loader:
        with pytest.raises(ConfigError, match="in_order=False cannot be resumed"):
            loader.load_state_dict(state)
        assert loader.state_dict()["batches_delivered"] == 0  # nothing of the refused state was taken


# --- "Batches larger than max_batch_bytes are refused by ZeroMQ itself." -----------------------------------
LIMIT = 1 << 20
BIG = {"length": 16, "shape": [1 << 19], "dtype": "uint8"}  # 4 samples: 2 MiB, twice the limit


def _loop_until_closed(loader: RemoteLoader, after: float) -> BaseException:
    closer = threading.Timer(after, loader.close)
    closer.start()
    try:
        next(iter(loader))
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        return exc
    finally:
        closer.cancel()
        closer.join(10)
    raise AssertionError("a batch larger than max_batch_bytes reached the loop")


def test_a_batch_larger_than_max_batch_bytes_never_reaches_the_loop(endpoint, spawn):
    producer = spawn(endpoint, "synthetic", BIG, threads=1, slots=1)
    loader = RemoteLoader(endpoint=endpoint, batch_size=4, max_batch_bytes=LIMIT, heartbeat=0.2, timeout=30,
                          log_every=None)
    try:
        wait_for(lambda: loader.stats()["producers_seen"] >= 1, 20, "the producer to join")
        # a bound on a hang, not on the answer: the BatchTooLarge ends the wait as soon as it comes
        failure = _loop_until_closed(loader, after=20.0)
        stats = loader.stats()
    finally:
        loader.close()
    assert isinstance(failure, BatchTooLarge), failure
    assert stats["received"] == 0 and stats["batches"] == 0 and stats["received_bytes"] == 0, stats
    # it never sent the batch (the consumer announced its limit), so libzmq never dropped its connection: it kept
    # its place instead of rejoining (a peer that ignores the limit is dropped by MAXMSGSIZE: tests/test_fuzz.py)
    assert stats["producers_seen"] == 1, stats
    assert producer.proc.poll() is None


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_loop_fed_only_oversized_batches_gets_an_error_naming_max_batch_bytes(endpoint, spawn, on_error):
    """The consumer announces max_batch_bytes in WELCOME; a producer answers a batch that exceeds it with a FAIL
    naming the limit (it would be dropped by libzmq's MAXMSGSIZE, rejoin and be dropped again forever). The loop
    raises it, whatever on_error says, and the producer keeps its place."""
    producer = spawn(endpoint, "synthetic", BIG, threads=1, slots=1)
    with RemoteLoader(endpoint=endpoint, batch_size=4, max_batch_bytes=LIMIT, heartbeat=0.2, timeout=30,
                      task_timeout=10, on_error=on_error, log_every=None) as loader:
        with pytest.raises(BatchTooLarge) as caught:
            next(iter(loader))
        stats = loader.stats()
    message = str(caught.value)
    size = 4 * (1 << 19) + 4 * 8  # 4 samples of 512 KiB and their int64 labels
    assert f"max_batch_bytes={LIMIT}" in message and f"batch of {size} bytes" in message and "batch 0" in message, message
    assert stats["invalid_messages"] == 0 and stats["reissued"] == 0, stats
    assert producer.proc.poll() is None


def test_an_oversized_batch_of_many_samples_under_skip_still_names_max_batch_bytes(endpoint, spawn):
    """One FAIL record for BatchTooLarge, whatever on_error: one per sample (each with its traceback) made a
    FAIL header of megabytes for a big batch, over MAX_HEADER_BYTES, dropped as invalid, and the batch was
    re-issued until it was poison."""
    spawn(endpoint, "synthetic", {"length": 4096, "shape": [1024], "dtype": "uint8"}, threads=1, slots=1)
    with RemoteLoader(endpoint=endpoint, batch_size=2048, max_batch_bytes=LIMIT, heartbeat=0.2, timeout=30,
                      task_timeout=10, on_error="skip", log_every=None) as loader:
        with pytest.raises(BatchTooLarge, match="max_batch_bytes"):
            next(iter(loader))
        stats = loader.stats()
    assert stats["invalid_messages"] == 0 and stats["reissued"] == 0, stats


# --- stall_fraction: "the share of the loop's time spent waiting for data" ---------------------------------
@pytest.mark.parametrize("load_s, step_s", [
    (0.12, 0.04),  # loading is the bottleneck: each step waits load - step, a stall of 2/3
    (0.02, 0.08),  # the model is: batches are always ready, no stall
])
def test_stall_fraction_is_the_share_of_the_loops_time_spent_waiting(endpoint, spawn, load_s, step_s):
    """Compared with the loop's own clock: the time it spent inside ``next()`` over the epoch's time. The loader
    counts less than that only by handing the batch over; a loaded machine stretches both sides alike, which
    a fixed expectation (2/3 and 0) could not allow for."""
    batch = 4
    # one producer, one thread, one slot: one batch every batch * delay seconds, one at a time
    spawn(endpoint, "synthetic", {"length": 4 * 12, "shape": [4], "delay": load_s / batch}, threads=1, slots=1)
    with RemoteLoader(endpoint=endpoint, batch_size=batch, heartbeat=0.2, timeout=30, log_every=None) as loader:
        list(loader)  # warm up: the producer joins, imports, and reads once
        loader.set_epoch(1)
        it = iter(loader)
        waited, began = 0.0, time.monotonic()
        while True:
            asked = time.monotonic()
            got = next(it, None)
            waited += time.monotonic() - asked
            if got is None:
                break
            time.sleep(step_s)  # the training step
        ended = time.monotonic()
        stats = loader.stats()
    measured = waited / (ended - began)
    reported = stats["epoch_stall_fraction"]
    # the loader's waits lie inside the loop's; handing 12 tiny batches over takes well under 5 % of the epoch
    assert measured - 0.05 <= reported <= measured + 0.01, f"measured {measured:.3f} by the loop: {stats}"
    # and the regime is the one the load and step times make: a stall of about 2/3, or none
    model = max(0.0, (load_s - step_s) / load_s)
    assert (reported > model / 2) if model else (reported < 0.25), f"model {model:.3f}: {stats}"

"""Issue 19, part 5: an engine's liveness and readiness probes. ``python -m ferry.producer --probe live|ready|serving``
reads the status file that the producer's main loop writes (``--status-file``); with ``--metrics-port`` the same
answers are served as /livez, /readyz and /servingz. Live fails when the main loop is stuck, even while the
producer's other threads run."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest

from tests import needs

from ferry import RemoteLoader
from ferry.common.datasets import SyntheticDataset
from ferry.producer import ProducerConfig
from ferry.producer.io.service import Producer
from ferry.producer.status import probe_file

from .helpers import REPO, free_port, producer_env, wait_for


def probe(kind: str, status_file: str) -> tuple[int, str]:
    """The exec probe, as an engine runs it: the exit status and its line. It must import neither torch nor zmq
    (the producer image has no torch; a probe runs every few seconds)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "ferry.producer", "--probe", kind],
                         env={**producer_env(), "FERRY_STATUS_FILE": status_file}, capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & {"torch", "zmq"}, "the probe imported torch or zmq"
    return out.returncode, out.stdout.strip()


def test_the_probes_follow_a_producer_from_start_to_exit(endpoint, spawn, tmp_path):
    status_file = str(tmp_path / "status.json")
    producer = spawn(endpoint, "synthetic", {"length": 16, "shape": [4]}, env={"FERRY_STATUS_FILE": status_file})
    wait_for(lambda: probe("ready", status_file)[0] == 0, 30, "the producer to be ready")
    code, line = probe("live", status_file)
    assert code == 0 and line.startswith("live: main loop turned") and "serving 0 of 1 consumer connections" in line
    assert probe("serving", status_file) == (1, "not serving: no consumer is being served (1 consumer connections)")
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, timeout=30, log_every=None) as loader:
        assert len(list(loader)) == 4
        wait_for(lambda: probe("serving", status_file)[0] == 0, 10, "the probe to see the consumer served")
        assert probe("serving", status_file)[1].startswith("serving: serving 1 of 1 consumer connections")
        assert producer.terminate() == 0
    code, line = probe("live", status_file)
    assert code == 1 and "no status file" in line  # removed at exit: no stale answer


def test_a_killed_producer_leaves_a_status_that_no_probe_believes(endpoint, spawn, tmp_path):
    status_file = str(tmp_path / "status.json")
    producer = spawn(endpoint, "synthetic", {"length": 16, "shape": [4]}, env={"FERRY_STATUS_FILE": status_file})
    wait_for(lambda: probe_file("ready", status_file)[0], 30, "the producer to be ready")
    producer.kill()  # SIGKILL: nothing removes the file
    for kind in ("live", "ready"):
        assert probe(kind, status_file) == (1, f"not {kind}: the producer (pid {producer.pid}) is gone")


def http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()


def test_the_live_probe_fails_when_the_main_loop_is_stuck_even_while_other_threads_run(tmp_path, leak_check):
    needs.module("prometheus_client", "metrics")  # the HTTP probes
    status_file, port = str(tmp_path / "status.json"), free_port()
    config = ProducerConfig(endpoints=(f"tcp://127.0.0.1:{free_port()}",), dataset="synthetic", threads=1, slots=1,
                            heartbeat=0.2, status_file=status_file, stuck_after=0.5, metrics_port=port)
    producer = Producer(config, SyntheticDataset(length=8, shape=[4]))
    unstick = threading.Event()
    stuck = threading.Event()
    next_outcome = producer._next_outcome  # PRIVATE: a step of every turn of the main loop, made to hang once

    def hang_once():
        if not stuck.is_set():
            stuck.set()
            unstick.wait(30)  # bounded: the test releases it
        return next_outcome()

    serving = threading.Thread(target=producer.run, name="test-producer")
    serving.start()
    try:
        wait_for(lambda: probe_file("ready", status_file)[0] and http(port, "/livez")[0] == 200, 10, "ready")
        assert http(port, "/readyz")[0] == 200 and http(port, "/servingz")[0] == 503
        producer._next_outcome = hang_once
        wait_for(stuck.is_set, 10, "the main loop to hang")
        ok, line = wait_for(lambda: (lambda a: a if not a[0] else None)(probe_file("live", status_file)), 10,
                            "the file's live probe to fail")
        assert "has not turned for" in line
        status, text = http(port, "/livez")  # the metrics thread answers: it runs, the main loop does not
        assert status == 503 and text.startswith("not live: the producer's main loop has not turned for"), text
        assert http(port, "/readyz")[0] == 503
        unstick.set()
        wait_for(lambda: probe_file("live", status_file)[0] and http(port, "/livez")[0] == 200, 10, "live again")
    finally:
        unstick.set()
        producer.stop()
        serving.join(20)
    assert not serving.is_alive()
    assert probe_file("live", status_file) == (False, f"not live: no status file at {status_file} (the producer is "
                                                      "not running, or has not started)")
    leak_check.assert_clean()


def test_a_status_file_that_cannot_be_written_is_a_configuration_error_at_start(endpoint, tmp_path):
    out = subprocess.run([sys.executable, "-m", "ferry.producer", "--connect", endpoint, "--dataset", "synthetic",
                          "--status-file", str(tmp_path / "missing" / "status.json")], env=producer_env(),
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"ferry producer: error: cannot write the status file "
                                               f"{str(tmp_path / 'missing' / 'status.json')!r}: No such file or "
                                               "directory"]


def test_a_probe_without_a_status_file_says_how_to_give_one():
    out = subprocess.run([sys.executable, "-m", "ferry.producer", "--probe", "live"], env=producer_env(),
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 2 and "--probe needs the producer's status file: --status-file PATH or " \
                                   "FERRY_STATUS_FILE" in out.stderr


def test_judging_a_status():
    from ferry.producer.status import judge

    status = {"state": "serving", "monotonic": 100.0, "stuck_after": 5.0, "pid": 1, "consumers": 2, "links": 3}
    status["pid"] = os.getpid()
    assert judge("live", status, 104.0)[0] and judge("ready", status, 104.0)[0] and judge("serving", status, 104.0)[0]
    assert not judge("live", status, 106.0)[0]
    assert judge("live", {**status, "state": "stopping"}, 101.0)[0]
    assert judge("ready", {**status, "state": "stopping"}, 101.0) == (False, "not ready: stopping")
    assert judge("live", {**status, "state": "starting"}, 1e9)[0]  # opening a large dataset takes what it takes
    assert judge("ready", {**status, "state": "starting"}, 101.0) == (False, "not ready: starting (opening its dataset)")
    assert not judge("serving", {**status, "consumers": 0}, 101.0)[0]
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=60)
    assert judge("live", {**status, "state": "starting", "pid": int(gone.stdout)}, 101.0) == (
        False, f"not live: the producer (pid {int(gone.stdout)}) is gone")

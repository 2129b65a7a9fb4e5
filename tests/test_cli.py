"""Acceptance 5: the command lines are clear and complete; errors are one line naming the cause."""

import subprocess
import sys
import time

import pytest

from ferry import RemoteLoader

from .helpers import REPO, producer_env, wait_for


def run(*args, timeout=60):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=producer_env(), cwd=REPO,
                          timeout=timeout)


def test_producer_help_lists_every_flag_with_examples():
    out = run("-m", "ferry.producer", "--help")
    assert out.returncode == 0
    for flag in ["--connect", "--dataset", "--dataset-arg", "--threads", "--slots", "--heartbeat", "--liveness",
                 "--log-level", "examples:", "FERRY_CONNECT", "npy-folder", "synthetic", "Exit status"]:
        assert flag in out.stdout, flag


def test_ferry_help_lists_subcommands_and_produce_passes_through():
    out = run("-m", "ferry", "--help")
    assert out.returncode == 0
    for word in ["produce", "demo", "RemoteLoader"]:
        assert word in out.stdout
    produce = run("-m", "ferry", "produce", "--help")
    assert produce.returncode == 0 and "usage: ferry produce" in produce.stdout and "--dataset-arg" in produce.stdout
    demo = run("-m", "ferry", "demo", "--help")
    assert demo.returncode == 0 and "--producers" in demo.stdout


@pytest.mark.parametrize(
    "args, cause",
    [
        (["--connect", "tcp://127.0.0.1:5", "--dataset", "nope"], "neither a built-in"),
        (["--connect", "tcp://127.0.0.1:5", "--dataset", "no_such_module_xyz:Thing"], "cannot import module"),
        (["--connect", "tcp://127.0.0.1:5", "--dataset", "tests.datasets:Missing"], "has no attribute"),
        (["--connect", "tcp://127.0.0.1:5", "--dataset", "synthetic", "--dataset-arg", "length=-3"], "length must"),
        (["--connect", "tcp://127.0.0.1:5", "--dataset", "npy-folder", "--dataset-arg", "root=/nonexistent"],
         "not a directory"),
        (["--connect", "localhost:5555", "--dataset", "synthetic"], "must look like tcp://"),
        (["--connect", "tcp://127.0.0.1:99999", "--dataset", "synthetic"], "invalid port"),
        (["--connect", "tcp://127.0.0.1:5", "--dataset", "synthetic", "--slots", "0"], "slots must be"),
    ],
)
def test_bad_configuration_is_one_clear_line(args, cause):
    out = run("-m", "ferry.producer", *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("ferry producer: error:") and cause in lines[0]


def test_unreachable_consumer_is_named_in_a_warning():
    from .helpers import free_port

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with subprocess.Popen([sys.executable, "-m", "ferry.producer", "--connect", endpoint, "--dataset", "synthetic",
                           "--heartbeat", "0.1"], env={**producer_env(), "FERRY_UNREACHABLE_WARNING_S": "0.5"},
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        lines = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "no consumer has answered" in line:
                break
        proc.terminate()
        assert proc.wait(10) == 0
        assert any(f"no consumer has answered at {endpoint}" in line for line in lines), lines


def test_sigterm_says_bye_and_exits_zero(endpoint, spawn):
    producer = spawn(endpoint, "synthetic", {"length": 100, "shape": [4]})
    # liveness 60 s: only the BYE can make the consumer notice the departure within the test's wait
    with RemoteLoader(endpoint=endpoint, batch_size=10, heartbeat=1.0, liveness=60, timeout=30) as loader:
        assert len(list(loader)) == 10
        assert loader.stats()["producers"] == 1
        assert producer.terminate() == 0
        wait_for(lambda: loader.stats()["producers"] == 0, 10, "the consumer to see the producer leave")
    assert "stopped after" in producer.output()

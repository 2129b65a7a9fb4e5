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


@pytest.mark.parametrize(
    "args, cause",
    [
        (["--connect", "tcp://127.0.0.1:5", "--dataset", "npy-folder", "--dataset-arg", "root=/nonexistent"],
         "not a directory"),
        (["--connect", "tcp://127.0.0.1:5", "--dataset", "tests.datasets:PairDataset", "--dataset-arg", "length=4",
          "--init", "tests.engine_datasets:storage_not_mounted"], "OSError: worker 0: /data is not mounted yet"),
    ],
)
def test_a_dataset_that_fails_to_open_is_one_clear_line_and_exit_4(args, cause):
    """Exit 4 (producer/exits.py): the dataset failed to open, which a restart may mend (a volume mounted late);
    the line is the one exit 2 gave before it had its own status."""
    out = run("-m", "ferry.producer", *args)
    assert out.returncode == 4, out.stderr
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


@pytest.mark.parametrize("variable, value, expected", [
    ("FERRY_THREADS", "abc", "is not an integer"),
    ("FERRY_SLOTS", "2.5", "is not an integer"),
    ("FERRY_METRICS_PORT", "http", "is not a port number"),
    ("FERRY_DATASET_ARGS", "[1, 2]", "is not a JSON object"),
    ("FERRY_LOG_LEVEL", "loud", "is not one of DEBUG"),
    ("FERRY_UNREACHABLE_WARNING_S", "soon", "is not a number of seconds"),
])
@pytest.mark.parametrize("flags", [["--help"], ["--connect", "tcp://127.0.0.1:5", "--dataset", "synthetic"]])
def test_a_bad_environment_variable_is_one_line_and_exit_2_even_with_help(variable, value, expected, flags):
    out = subprocess.run([sys.executable, "-m", "ferry.producer", *flags], capture_output=True, text=True,
                         env={**producer_env(), variable: value}, cwd=REPO, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"ferry producer: error: environment variable {variable}={value!r} {expected}")


def test_environment_values_are_typed_and_read_only_when_asked():
    from ferry.producer.config import read_env

    env = read_env({"FERRY_THREADS": " 8 ", "FERRY_CONNECT": "tcp://a:1, tcp://b:2", "FERRY_LOG_LEVEL": "debug",
                    "FERRY_DATASET_ARGS": '{"length": 4}', "FERRY_EXIT_WITH_PARENT": "1", "FERRY_SLOTS": "",
                    "FERRY_SHARED_MEMORY": "tok:/memfd/x", "UNRELATED": "x"})
    assert env == {"FERRY_THREADS": 8, "FERRY_CONNECT": ["tcp://a:1", "tcp://b:2"], "FERRY_LOG_LEVEL": "DEBUG",
                   "FERRY_DATASET_ARGS": {"length": 4}, "FERRY_EXIT_WITH_PARENT": True,
                   "FERRY_SHARED_MEMORY": ("/memfd/x", "tok")}
    # nothing reads the environment at import time: importing with bad values succeeds
    code = "import ferry.producer.cli, ferry.producer.config, ferry.consumer.options, ferry"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                         env={**producer_env(), "FERRY_THREADS": "abc", "FERRY_UNREACHABLE_WARNING_S": "x",
                              "RANK": "x", "LOCAL_RANK": "y"})
    assert out.returncode == 0, out.stderr


def test_log_level_is_case_insensitive():
    for level in (["--log-level", "debug"], ["--log-level", "Warning"]):
        out = run("-m", "ferry.producer", "--connect", "tcp://127.0.0.1:5", "--dataset", "synthetic", "--slots", "0",
                  *level)
        assert out.returncode == 2 and "slots must be" in out.stderr and "invalid choice" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "ferry.producer", "--connect", "tcp://127.0.0.1:5", "--dataset",
                          "synthetic", "--slots", "0"], capture_output=True, text=True, cwd=REPO, timeout=60,
                         env={**producer_env(), "FERRY_LOG_LEVEL": "error"})
    assert out.returncode == 2 and "slots must be" in out.stderr

"""A ``FERRY_*`` variable that no part of Ferry reads is named in a WARNING, with the closest known one
(ferry/common/variables.py): a trial user's ``FERRY_THREAD=4`` and ``FERRY_DATASET_ARG=root=/x`` were silently
ignored. Every ``FERRY_*`` name in the source tree is a known one, so a legitimate variable is never flagged."""

from __future__ import annotations

import logging
import os
import re

import pytest

from ferry import RemoteLoader
from ferry.common.variables import KEEP_FREED_MEMORY, OTHER_VARIABLES, unknown_variables
from ferry.producer.config import PRODUCER_ENV

from .helpers import REPO

PRODUCER_OWN = {*PRODUCER_ENV, KEEP_FREED_MEMORY}
KNOWN = PRODUCER_OWN | OTHER_VARIABLES
#: Names the tree mentions that are deliberately no variable, and so are flagged like a typo: --probe is a mode (in a
#: container's environment it would make the producer a probe); the typo the docs show as an example.
NOT_VARIABLES = {"FERRY_PROBE", "FERRY_THREAD"}
_TEXT = (".py", ".md", ".yaml", ".yml", ".sh", ".sbatch", ".toml", ".cfg", ".ini", ".txt", "Dockerfile", ".json")


def test_the_trial_users_typos_are_named_with_the_variable_meant():
    environ = {"FERRY_THREAD": "4", "FERRY_DATASET_ARG": "root=/x", "FERRY_THREADS": "2", "PATH": "/bin",
               "ferry_slots": "3", "FERRY_NOTHING_LIKE_IT": "1"}
    assert unknown_variables(environ, "producer", PRODUCER_OWN) == [
        ("FERRY_DATASET_ARG", "FERRY_DATASET_ARG is not a Ferry setting (did you mean FERRY_DATASET_ARGS?); ignored"),
        ("FERRY_NOTHING_LIKE_IT", "FERRY_NOTHING_LIKE_IT is not a Ferry setting; ignored"),
        ("FERRY_THREAD", "FERRY_THREAD is not a Ferry setting (did you mean FERRY_THREADS?); ignored"),
        ("ferry_slots", "ferry_slots is not a Ferry setting (did you mean FERRY_SLOTS?); ignored"),
    ]


def test_what_kubernetes_injects_for_a_service_named_ferry_something_is_no_setting_to_warn_about():
    """Each Service in a pod's namespace becomes variables: a "ferry-metrics" or "ferry-trainer" ClusterIP Service
    gives FERRY_METRICS_SERVICE_HOST, FERRY_TRAINER_PORT (which looks like FERRY_TRAINER_PID) and more."""
    injected = {"FERRY_METRICS_SERVICE_HOST": "10.0.0.9", "FERRY_METRICS_SERVICE_PORT": "9100",
                "FERRY_METRICS_SERVICE_PORT_HTTP": "9100", "FERRY_TRAINER_PORT": "tcp://10.0.0.8:5555",
                "FERRY_TRAINER_PORT_5555_TCP": "tcp://10.0.0.8:5555", "FERRY_TRAINER_PORT_5555_TCP_ADDR": "10.0.0.8",
                "FERRY_TRAINER_PORT_5555_TCP_PORT": "5555", "FERRY_TRAINER_PORT_5555_TCP_PROTO": "tcp"}
    assert unknown_variables(injected, "producer", PRODUCER_OWN) == []
    assert [name for name, _ in unknown_variables({**injected, "FERRY_THREAD": "4"}, "loader", [])] == ["FERRY_THREAD"]


def test_a_guess_the_side_does_not_read_says_so():
    [(_, text)] = unknown_variables({"FERRY_ENDPOINTS": "tcp://*:5555"}, "producer", PRODUCER_OWN)
    assert text == ("FERRY_ENDPOINTS is not a Ferry setting (did you mean FERRY_ENDPOINT? the producer does not "
                    "read it); ignored")


def test_no_known_variable_is_flagged_on_either_side():
    environ = {name: "x" for name in KNOWN}
    assert unknown_variables(environ, "producer", PRODUCER_OWN) == []
    assert unknown_variables(environ, "loader", OTHER_VARIABLES, others=PRODUCER_OWN) == []


def _names_in_the_tree() -> dict[str, str]:
    """Every FERRY_* name in the repository's text files, with one file that says it."""
    names: dict[str, str] = {}
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__" and not d.endswith(".egg-info")]
        for file in files:
            path = os.path.join(folder, file)
            if not file.endswith(_TEXT) or path == __file__:  # this file's typos are on purpose
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for name in re.findall(r"\bFERRY_[A-Z0-9_]+", f.read()):
                    if not name.endswith("_"):  # a prefix (FERRY_CURVE_*), not a name
                        names.setdefault(name, os.path.relpath(path, REPO))
    return names


def test_every_ferry_variable_in_the_source_tree_is_known():
    names = _names_in_the_tree()
    assert {"FERRY_THREADS", "FERRY_KEEP_FREED_MEMORY", "FERRY_ENDPOINT", "FERRY_SLURM_DIR"} <= set(names)  # it reads
    unknown = {name: where for name, where in names.items() if name not in KNOWN | NOT_VARIABLES}
    assert not unknown, f"FERRY_* names that ferry/common/variables.py does not know (add them there): {unknown}"
    flagged = {name for name, _ in unknown_variables({name: "x" for name in names}, "producer", PRODUCER_OWN)}
    assert flagged == NOT_VARIABLES


def test_a_producer_names_each_misspelled_variable_at_start(endpoint, spawn):
    """Process-level: the trial's two typos, on a hand-started producer that serves a loader all the same."""
    producer = spawn(endpoint, "synthetic", {"length": 8, "shape": [4]}, threads=None,
                     env={"FERRY_THREAD": "4", "FERRY_DATASET_ARG": "root=/x", "FERRY_SAMPLES": "8",
                          "FERRY_UNREACHABLE_WARNING_S": "30"})
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, timeout=30, log_every=None) as loader:
        assert len(list(loader)) == 2
    assert producer.terminate() == 0
    output = producer.output()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ferry-producer\[\d+\] "  # the plain format's start
    for name, meant in (("FERRY_THREAD", "FERRY_THREADS"), ("FERRY_DATASET_ARG", "FERRY_DATASET_ARGS")):
        line = f"{name} is not a Ferry setting (did you mean {meant}?); ignored"
        assert re.search("^" + stamp + "WARNING " + re.escape(line) + "$", output, re.M), output
    assert re.search("^" + stamp + "INFO ferry producer .* loading threads", output, re.M), output  # it served
    assert "FERRY_SAMPLES" not in output and "FERRY_UNREACHABLE_WARNING_S" not in output  # known: not flagged


def test_a_loader_names_a_misspelled_variable_once_per_process(monkeypatch, caplog, endpoint):
    """The loader reads FERRY_CURVE_SECRET_KEY: a typo there would leave it in plaintext without a word."""
    monkeypatch.setenv("FERRY_CURVE_SECRET_KEYS", "/keys/server.key_secret")
    with caplog.at_level(logging.WARNING, logger="ferry.consumer"):
        for _ in range(2):
            with RemoteLoader(endpoint=endpoint, batch_size=2, dataset_len=4) as loader:
                assert loader.curve is None
    warned = [r.getMessage() for r in caplog.records if "FERRY_CURVE_SECRET_KEYS" in r.getMessage()]
    assert warned == ["FERRY_CURVE_SECRET_KEYS is not a Ferry setting (did you mean FERRY_CURVE_SECRET_KEY?); "
                      "ignored"]


@pytest.mark.parametrize("name", sorted(NOT_VARIABLES))
def test_a_name_that_is_no_variable_is_flagged(name):
    assert [n for n, _ in unknown_variables({name: "live"}, "producer", PRODUCER_OWN)] == [name]

"""RemoteLoader's options: checked in the constructor before anything starts, grouped, read-only afterwards.

A wrong option is a ConfigError that is also a TypeError (a wrong type) or a ValueError (out of range), and
its message names the option, the value and what was expected. Every flat keyword that worked before the
option groups keeps working with the same meaning, but ``timeout``: once the old name of ``no_producer_timeout``,
it is now DataLoader's limit on each batch (issue 18).
"""

import glob
import os
import inspect
import math
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from ferry import (
    ConfigError, ConfigTypeError, CurveOptions, LocalOptions, NoProducersError, RemoteLoader, TransportOptions,
)
from ferry.common.constants import DEFAULT_TIMEOUT_S, HEARTBEAT_S

from .helpers import REPO, child_pids, free_port, producer_env

#: The keywords RemoteLoader took before the option groups: user code and tests rely on every one.
OLD_KEYWORDS = {
    "endpoint", "batch_size", "shuffle", "seed", "drop_last", "sampler", "batch_sampler", "rank", "world_size",
    "buffer_batches", "in_order", "timeout", "dataset_len", "device", "pin_memory", "device_transform",
    "local_producers", "dataset", "dataset_args", "producer_threads", "producer_slots", "on_error", "heartbeat",
    "liveness", "task_timeout", "max_batch_bytes", "mp_context", "curve_secret_key", "curve_authorized_keys",
    "log_every", "producer_transform", "metrics_port", "shared_memory",
}


def own_folders() -> set[str]:
    """Local-mode folders this process made (their ``owner`` file names it): other processes' temp files, such as
    tests running beside this one, do not count."""
    mine = set()
    for folder in glob.glob(f"{tempfile.gettempdir()}/ferry-*"):
        try:
            with open(os.path.join(folder, "owner")) as f:
                owner = f.read().split()
        except OSError:
            continue
        if owner and owner[0] == str(os.getpid()):
            mine.add(folder)
    return mine


class NothingStarted:
    """Threads, child processes, local-mode folders and the endpoint's port, before and after a constructor."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.threads = set(threading.enumerate())
        self.children = child_pids()
        self.folders = own_folders()

    def assert_nothing_started(self) -> None:
        assert not set(threading.enumerate()) - self.threads, "a thread was started"
        assert not child_pids() - self.children, "a producer process was started"
        assert not own_folders() - self.folders, "a local-mode folder was made"
        with socket.socket() as s:  # the loader never bound its endpoint
            s.bind(("127.0.0.1", self.port))


# (keyword arguments, the error's other base class, words the message must hold)
BAD = [
    ({"batch_size": 2.5}, TypeError, ["batch_size", "2.5", "an int >= 1"]),
    ({"batch_size": "8"}, TypeError, ["batch_size", "'8'", "an int"]),
    ({"batch_size": 0}, ValueError, ["batch_size", "0", ">= 1"]),
    ({"batch_size": True}, TypeError, ["batch_size", "True"]),
    ({"local_producers": "2"}, TypeError, ["local_producers", "'2'", "an int"]),
    ({"local_producers": True}, TypeError, ["local_producers", "True"]),
    ({"local_producers": False}, TypeError, ["local_producers", "False"]),
    ({"local_producers": -1}, ValueError, ["local_producers", "-1", ">= 0"]),
    ({"buffer_batches": 1.5}, TypeError, ["buffer_batches", "1.5", "an int >= 1"]),
    ({"buffer_batches": 0}, ValueError, ["buffer_batches", "0"]),
    ({"seed": "x"}, TypeError, ["seed", "'x'", "an int"]),
    ({"seed": True}, TypeError, ["seed", "True"]),
    ({"timeout": "30"}, TypeError, ["timeout", "'30'", "a number"]),
    ({"no_producer_timeout": "30"}, TypeError, ["no_producer_timeout", "'30'", "a number"]),
    ({"timeout": -1}, ValueError, ["timeout", "-1", ">= 0"]),
    ({"task_timeout": 0}, ValueError, ["task_timeout", "0", "> 0"]),
    ({"task_timeout": "2"}, TypeError, ["task_timeout", "'2'"]),
    ({"heartbeat": "0.2"}, TypeError, ["heartbeat", "'0.2'", "a number"]),
    ({"heartbeat": 0}, ValueError, ["heartbeat", "0"]),
    ({"liveness": 2.5}, TypeError, ["liveness", "2.5"]),
    ({"max_batch_bytes": 1e9}, TypeError, ["max_batch_bytes"]),
    ({"shuffle": "yes"}, TypeError, ["shuffle", "'yes'", "True or False"]),
    ({"drop_last": 1}, TypeError, ["drop_last", "1"]),
    ({"in_order": None}, TypeError, ["in_order", "None"]),
    ({"rank": "0"}, TypeError, ["rank", "'0'"]),
    ({"world_size": 0}, ValueError, ["world_size", "0"]),
    ({"rank": 2, "world_size": 2}, ValueError, ["rank 2", "world_size 2"]),
    ({"dataset_len": -1}, ValueError, ["dataset_len", "-1"]),
    ({"dataset_len": 1.0}, TypeError, ["dataset_len", "1.0"]),
    ({"on_error": "ignore"}, ValueError, ["on_error", "'ignore'", "'skip'"]),
    ({"log_every": "60"}, TypeError, ["log_every", "'60'"]),
    ({"metrics_port": 70000}, ValueError, ["metrics_port", "70000"]),
    ({"device_transform": 3}, TypeError, ["device_transform", "3", "callable"]),
    ({"sampler": 5}, TypeError, ["sampler", "5", "iterable"]),
    ({"dataset": 5}, TypeError, ["dataset", "5"]),
    ({"dataset_args": "length=3"}, TypeError, ["dataset_args", "'length=3'"]),
    ({"endpoint": 5555}, TypeError, ["endpoint", "5555"]),
    ({"device": "gpu0"}, ValueError, ["device", "'gpu0'"]),
    ({"local_producers": 2, "dataset": "synthetic", "producer_threads": "4"}, TypeError, ["producer_threads", "'4'"]),
    ({"local_producers": 2, "dataset": "synthetic", "producer_slots": 0}, ValueError, ["producer_slots", "0"]),
    ({"local_producers": 2, "dataset": "synthetic", "mp_context": "thread"}, ValueError, ["mp_context", "'thread'"]),
    ({"local_producers": 2, "dataset": "synthetic", "mp_context": 3}, TypeError, ["mp_context", "3", "context"]),
    ({"local_producers": 0, "dataset": "synthetic", "mp_context": "spawn"}, ValueError,
     ["mp_context applies to local producers", "local_producers=0"]),
    ({"local_producers": 2, "dataset": "synthetic", "shared_memory": "no"}, TypeError, ["shared_memory", "'no'"]),
    ({"local_producers": 2}, ValueError, ["local_producers needs a dataset"]),
    ({"curve_secret_key": 5, "curve_authorized_keys": "k"}, TypeError, ["curve_secret_key", "5"]),
]


@pytest.mark.parametrize("kwargs, base, words", BAD, ids=[repr(b[0]) for b in BAD])
def test_a_bad_option_raises_in_the_constructor_before_anything_starts(kwargs, base, words):
    port = free_port()
    before = NothingStarted(port)
    # local mode, where the loader would start producer processes, so that an early start would show
    kwargs = {"local_producers": 2, "dataset": "synthetic", **kwargs} if "local_producers" not in kwargs else kwargs
    kwargs = {"endpoint": f"tcp://127.0.0.1:{port}", **kwargs}
    if "curve_secret_key" in kwargs:
        kwargs.pop("local_producers", None)
    with pytest.raises(ConfigError) as info:
        RemoteLoader(**kwargs)
    assert isinstance(info.value, base)
    if base is TypeError:
        assert isinstance(info.value, ConfigTypeError)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    before.assert_nothing_started()


@pytest.mark.parametrize("forever", [0, 0.0, None])
def test_zero_or_none_means_no_limit_for_either_timeout(endpoint, forever):
    """``timeout`` is DataLoader's limit on each batch (0: none, DataLoader's default), ``no_producer_timeout``
    Ferry's on the wait for producers (math.inf: none); neither sets the other."""
    with RemoteLoader(endpoint=endpoint, batch_size=4, timeout=forever, dataset_len=20) as loader:
        assert loader.timeout == 0 and loader.no_producer_timeout == DEFAULT_TIMEOUT_S
    with RemoteLoader(endpoint=endpoint, batch_size=4, no_producer_timeout=forever, dataset_len=20) as loader:
        assert loader.no_producer_timeout == math.inf and loader.timeout == 0


def test_a_loader_that_waits_forever_outlasts_a_finite_timeout_then_serves(endpoint, spawn):
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, no_producer_timeout=None,
                      dataset_len=20) as loader:
        got, failure = [], []

        def consume():
            try:
                got.extend(loader)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failure.append(exc)

        consumer = threading.Thread(target=consume, name="test-consume")
        consumer.start()
        consumer.join(1.5)  # a window in which a finite timeout of 1 s would have raised
        assert consumer.is_alive() and not failure, failure
        spawn(endpoint, "synthetic", {"length": 20, "shape": [2]})
        consumer.join(60)
        assert not consumer.is_alive() and not failure, failure
        assert len(got) == 5


def test_a_finite_no_producer_timeout_still_fires(endpoint):
    with RemoteLoader(endpoint=endpoint, batch_size=4, no_producer_timeout=0.5, dataset_len=8) as loader:
        assert loader.no_producer_timeout == 0.5 and loader.timeout == 0
        with pytest.raises(NoProducersError, match=r"no_producer_timeout=0.5"):
            next(iter(loader))


def test_timeout_and_no_producer_timeout_are_two_options(endpoint):
    """``timeout`` was once the old name of ``no_producer_timeout``; now it is DataLoader's, and both may be given
    (tests/test_dataloader_meanings.py checks what each does)."""
    with RemoteLoader(endpoint=endpoint, timeout=5, no_producer_timeout=7) as loader:
        assert (loader.timeout, loader.no_producer_timeout) == (5, 7)


def test_every_old_flat_keyword_is_still_accepted():
    parameters = inspect.signature(RemoteLoader).parameters
    assert OLD_KEYWORDS <= set(parameters)
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in OLD_KEYWORDS)


def test_the_old_local_and_transport_keywords_work_and_mean_the_groups(tmp_path):
    flat = dict(batch_size=4, shuffle=True, seed=3, drop_last=True, rank=0, world_size=1, buffer_batches=6,
                in_order=True, timeout=30, dataset_len=None, device=None, pin_memory=False, device_transform=None,
                dataset="synthetic", dataset_args={"length": 18, "shape": [2]}, on_error="raise", log_every=None,
                metrics_port=None, endpoint=None)
    with RemoteLoader(**flat, local_producers=1, producer_threads=2, producer_slots=3, heartbeat=0.2, liveness=7,
                      task_timeout=9.0, max_batch_bytes=1 << 20, mp_context=None, producer_transform=None,
                      shared_memory=False) as loader:
        assert len(list(loader)) == 4  # 18 samples, batches of 4, the tail dropped
        assert loader.transport == TransportOptions(heartbeat=0.2, liveness=7, task_timeout=9.0,
                                                    max_batch_bytes=1 << 20)
        assert loader.local == LocalOptions(count=1, threads=2, slots=3, shared_memory=False)
        assert loader.stats()["shared_batches"] == 0  # shared_memory=False was applied
    with RemoteLoader(**flat, local=LocalOptions(count=1, threads=2, slots=3, shared_memory=False),
                      transport=TransportOptions(heartbeat=0.2, liveness=7, task_timeout=9.0,
                                                 max_batch_bytes=1 << 20)) as grouped:
        assert (grouped.local, grouped.transport, grouped.curve) == (loader.local, loader.transport, None)
        assert [getattr(grouped, k) for k in flat if hasattr(grouped, k)] == [getattr(loader, k) for k in flat
                                                                               if hasattr(loader, k)]
        assert len(list(grouped)) == 4


def test_the_old_curve_keywords_work_and_mean_the_group(tmp_path, endpoint):
    out = subprocess.run([sys.executable, "-m", "ferry", "keys", str(tmp_path / "keys"), "--producer", "p"],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    secret, authorized = str(tmp_path / "keys" / "server.key_secret"), str(tmp_path / "keys" / "authorized")
    with RemoteLoader(endpoint=endpoint, curve_secret_key=secret, curve_authorized_keys=authorized) as loader:
        assert loader.curve == CurveOptions(secret_key=secret, authorized_keys=authorized)
    with RemoteLoader(endpoint=endpoint, curve=CurveOptions(secret, authorized)) as loader:
        assert loader.curve == CurveOptions(secret_key=secret, authorized_keys=authorized)


@pytest.mark.parametrize("kwargs, clash", [
    ({"transport": TransportOptions(heartbeat=0.5), "heartbeat": 0.5}, "heartbeat="),
    ({"transport": TransportOptions(), "task_timeout": 3}, "task_timeout="),
    ({"local": LocalOptions(count=1), "local_producers": 1, "dataset": "synthetic"}, "local_producers="),
    ({"local": LocalOptions(count=1), "producer_threads": 2, "dataset": "synthetic"}, "producer_threads="),
    ({"curve": CurveOptions("a", "b"), "curve_secret_key": "a"}, "curve_secret_key="),
])
def test_one_option_given_both_ways_is_an_error(kwargs, clash):
    port = free_port()
    before = NothingStarted(port)
    with pytest.raises(ConfigError, match="both given") as info:
        RemoteLoader(endpoint=f"tcp://127.0.0.1:{port}", **kwargs)
    assert clash in str(info.value)
    before.assert_nothing_started()


def test_the_groups_check_their_fields_and_their_type():
    with pytest.raises(ConfigTypeError, match=r"TransportOptions.heartbeat must be a number .*'1'"):
        TransportOptions(heartbeat="1")
    with pytest.raises(ConfigError, match=r"LocalOptions.count must be an int >= 1, got 0"):
        LocalOptions(count=0)
    with pytest.raises(ConfigTypeError, match=r"CurveOptions.secret_key must be a path"):
        CurveOptions(secret_key=None, authorized_keys="k")
    with pytest.raises(ConfigTypeError, match=r"transport must be a TransportOptions, got \{'heartbeat': 1\}"):
        RemoteLoader(endpoint=None, local_producers=1, dataset="synthetic", transport={"heartbeat": 1})
    assert TransportOptions().heartbeat == HEARTBEAT_S
    with pytest.raises(AttributeError):
        TransportOptions().heartbeat = 2.0  # frozen


def test_options_cannot_be_assigned_after_construction(endpoint):
    with RemoteLoader(endpoint=endpoint, batch_size=4, dataset_len=8) as loader:
        assert loader.timeout == 0 and loader.no_producer_timeout == DEFAULT_TIMEOUT_S
        for name, value in [("batch_size", 8), ("shuffle", True), ("timeout", 5), ("endpoints", ())]:
            with pytest.raises(ValueError, match=rf"RemoteLoader\.{name} cannot be changed"):
                setattr(loader, name, value)
        with pytest.raises(ConfigError, match="batch_size"):
            del loader.batch_size
        assert loader.batch_size == 4 and loader.shuffle is False and loader.timeout == 0
        with pytest.raises(ConfigTypeError, match=r"epoch must be an int >= 0, got '3'"):
            loader.set_epoch("3")
        loader.set_epoch(3)  # the loader's own state still moves
        assert loader.epoch == 3 and loader.state_dict()["epoch"] == 3


def test_a_malformed_torchrun_variable_is_named(monkeypatch, endpoint):
    monkeypatch.setenv("RANK", "abc")
    with pytest.raises(ConfigError, match=r"environment variable RANK='abc' is not an integer"):
        RemoteLoader(endpoint=endpoint)
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("LOCAL_RANK", "one")
    with pytest.raises(ConfigError, match=r"LOCAL_RANK='one'"):
        RemoteLoader()


def test_the_endpoint_comes_from_ferry_endpoint_when_not_given(monkeypatch):
    """Engine files (a Kubernetes Job, a Slurm script) set where the trainer binds without editing the script."""
    ports = [free_port(), free_port()]
    monkeypatch.setenv("FERRY_ENDPOINT", f"tcp://127.0.0.1:{ports[0]}, tcp://127.0.0.1:{ports[1]}")
    with RemoteLoader(batch_size=2, dataset_len=4) as loader:
        assert loader.endpoints == (f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}")
    with RemoteLoader(batch_size=2, dataset_len=4, endpoint=f"tcp://127.0.0.1:{ports[1]}") as loader:
        assert loader.endpoints == (f"tcp://127.0.0.1:{ports[1]}",)  # the script's own choice wins
    monkeypatch.setenv("FERRY_ENDPOINT", "not-an-endpoint")
    with pytest.raises(ConfigError, match="FERRY_ENDPOINT"):
        RemoteLoader(batch_size=2, dataset_len=4)


def test_a_port_above_65535_is_refused_naming_it(monkeypatch):
    """libzmq would bind tcp://127.0.0.1:112000 on port 46464 (112000 - 65536) and say nothing, while producers
    refuse that endpoint: the trainer waited for producers that could never connect."""
    with pytest.raises(ConfigError, match=r"endpoint 'tcp://127.0.0.1:112000': port 112000 is out of range"):
        RemoteLoader(endpoint="tcp://127.0.0.1:112000", batch_size=2, dataset_len=4)
    with pytest.raises(ConfigError, match=r"'tcp://\*:70000': port 70000"):
        RemoteLoader(endpoint=[f"tcp://127.0.0.1:{free_port()}", "tcp://*:70000"], batch_size=2, dataset_len=4)
    monkeypatch.setenv("FERRY_ENDPOINT", "tcp://127.0.0.1:65536")
    with pytest.raises(ConfigError, match="port 65536"):
        RemoteLoader(batch_size=2, dataset_len=4)


def test_curve_comes_from_the_environment_when_the_script_gives_none(tmp_path, monkeypatch, endpoint):
    """Engine files turn CURVE on (deploy/slurm, deploy/kubernetes) without editing the training script."""
    out = subprocess.run([sys.executable, "-m", "ferry", "keys", str(tmp_path / "keys"), "--producer", "p"],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    secret, authorized = str(tmp_path / "keys" / "server.key_secret"), str(tmp_path / "keys" / "authorized")
    monkeypatch.setenv("FERRY_CURVE_SECRET_KEY", secret)
    monkeypatch.setenv("FERRY_CURVE_AUTHORIZED_KEYS", authorized)
    with RemoteLoader(endpoint=endpoint, batch_size=2, dataset_len=4) as loader:
        assert loader.curve == CurveOptions(secret_key=secret, authorized_keys=authorized)
    with RemoteLoader(endpoint=endpoint, batch_size=2, dataset_len=4, curve_secret_key=None) as loader:
        assert loader.curve is None  # the script said no CURVE: the environment does not overrule it
    with RemoteLoader(dataset="synthetic", dataset_args={"length": 4, "shape": [2]}, local_producers=1,
                      batch_size=2) as loader:
        assert loader.curve is None  # local mode never leaves the machine: the environment's keys do not apply
    monkeypatch.delenv("FERRY_CURVE_AUTHORIZED_KEYS")
    with pytest.raises(ConfigError, match="FERRY_CURVE_AUTHORIZED_KEYS is not set"):
        RemoteLoader(endpoint=endpoint, batch_size=2, dataset_len=4)

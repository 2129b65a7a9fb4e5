"""Issue 32: the producer actor of ferry.ray as a plain object (its methods are what Ray calls on the actor's threads),
and what the manager takes from a loader (endpoint, CURVE keys). A real RemoteLoader, real producers on threads of
this process; no Ray here (tests/test_ray.py runs the actors on a real cluster).

How the exit statuses meet Ray's restart policy: 0 returns; 2 and 3 (a restart repeats them) raise
ProducerExitError, which the manager answers by ending the actor for good; 1, 4 and 5 end the process, so that Ray
restarts the actor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import zmq.auth

from ferry import ConfigError, ProducerExitError, RemoteLoader
from ferry.producer import ProducerConfig
from ferry.ray import ProducerActor
from ferry.ray.handover import loader_keys, reachable_endpoint

from .datasets import PairDataset
from .helpers import kept_process_state, REPO, LeakCheck, assert_epoch_matches, producer_env, warm_zero_copy



@pytest.fixture(autouse=True)
def _process_state():
    """serve() runs on threads of this process here: what it sets for its process is put back after each test."""
    with kept_process_state():
        yield


class Exits(ProducerActor):
    """The actor, with the process exit it would take recorded instead."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.exits: list[int] = []

    def _exit(self, code: int) -> None:
        self.exits.append(code)


def config(endpoint: str, **fields) -> ProducerConfig:
    return ProducerConfig(endpoints=(endpoint,), threads=2, slots=2, heartbeat=0.2, **fields)


def run_serve(actor: ProducerActor) -> tuple[threading.Thread, list]:
    outcome: list = []

    def target() -> None:
        try:
            outcome.append(actor.serve())
        except BaseException as exc:  # what Ray hands the caller
            outcome.append(exc)
    thread = threading.Thread(target=target, name="test-actor-serve")
    thread.start()
    return thread, outcome


def test_serve_returns_0_when_stopped_and_the_epoch_stays_exact(endpoint):
    warm_zero_copy()
    check = LeakCheck()
    dataset = PairDataset(length=24, delay=0.01)
    with RemoteLoader(endpoint=endpoint, batch_size=4, shuffle=True, seed=3, heartbeat=0.2, max_attempts=1,
                      timeout=60, log_every=None) as loader:
        actor = Exits(config(endpoint, dataset_label="pairs"), dataset)
        thread, outcome = run_serve(actor)
        assert_epoch_matches(loader, dataset, epoch=0, batch_size=4, seed=3)
        where = actor.where()
        assert where["name"] in loader.stats()["per_producer"] and where["pid"] == os.getpid() and where["serving"]
        assert actor.figures()["batches_sent"] >= 6
        actor.stop()
        thread.join(10)
        assert outcome == [0] and actor.exits == [] and actor.figures() is None
        assert actor.serve() == 0  # once stopped, it serves no more
    check.assert_clean()


def test_a_configuration_error_raises_producer_exit_error_2_and_never_ends_the_process(endpoint):
    actor = Exits(config(endpoint, dataset="tests.datasets:NoSuchDataset"))
    with pytest.raises(ProducerExitError, match="NoSuchDataset") as raised:
        actor.serve()
    assert raised.value.status == 2 and actor.exits == []
    assert actor.where(timeout=5)["serving"] is False  # it answers at once: serve() ended
    with pytest.raises(ProducerExitError):  # again, as it ended: no second producer in the process
        actor.serve()


def test_a_permanent_rejection_raises_producer_exit_error_3(endpoint):
    with RemoteLoader(endpoint=endpoint, batch_size=4, dataset_len=10, heartbeat=0.2, log_every=None):
        actor = Exits(config(endpoint, dataset_label="pairs"), PairDataset(length=24))  # 24 samples, not 10
        thread, outcome = run_serve(actor)
        thread.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], ProducerExitError), outcome
    assert outcome[0].status == 3 and "rejected" in str(outcome[0]) and actor.exits == []


def test_a_dataset_that_fails_to_open_ends_the_process_with_4_for_ray_to_restart(endpoint):
    actor = Exits(config(endpoint, dataset_label="pairs", init="tests.engine_datasets:storage_not_mounted"),
                  PairDataset(length=8))
    assert actor.serve() == 4 and actor.exits == [4]


def test_stop_before_serve_makes_it_return_0_as_soon_as_its_producer_is_built(endpoint):
    actor = Exits(config(endpoint, dataset_label="pairs"), PairDataset(length=8))
    actor.stop()
    assert actor.serve() == 0 and actor.exits == []


# --- what is taken from the loader --------------------------------------------------------------------------------
def test_the_endpoint_producers_on_other_nodes_reach():
    assert reachable_endpoint(["tcp://*:5555"], "10.1.2.3") == ("tcp://10.1.2.3:5555", False)
    assert reachable_endpoint(["tcp://0.0.0.0:5555"], "10.1.2.3") == ("tcp://10.1.2.3:5555", False)
    assert reachable_endpoint(["ipc:///tmp/x/s", "tcp://10.9.9.9:6000"], "10.1.2.3") == ("tcp://10.9.9.9:6000", False)
    assert reachable_endpoint(["tcp://127.0.0.1:5555"], "10.1.2.3") == ("tcp://127.0.0.1:5555", True)
    with pytest.raises(ConfigError, match="no tcp:// endpoint"):
        reachable_endpoint(["ipc:///tmp/x/s"], "10.1.2.3")


@pytest.fixture
def keys(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ferry", "keys", str(tmp_path / "keys"), "--producer", "good"],
                         capture_output=True, text=True, env=producer_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    return tmp_path / "keys"


def test_keys_made_for_the_actors_are_authorized_while_they_run_and_removed_after(endpoint, keys, caplog):
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, timeout=30, log_every=None,
                      curve_secret_key=str(keys / "server.key_secret"),
                      curve_authorized_keys=str(keys / "authorized")) as loader:
        before = set(os.listdir(keys / "authorized"))
        client, authorized = loader_keys(loader.curve)
        assert client.server_key == zmq.auth.load_certificate(str(keys / "server.key"))[0]
        assert set(os.listdir(keys / "authorized")) == before | {os.path.basename(authorized)}
        assert zmq.auth.load_certificate(authorized) == (client.public_key, None)  # the public half only
        dataset = PairDataset(length=8)
        actor = Exits(config(endpoint, dataset_label="pairs", curve=client), dataset)
        thread, outcome = run_serve(actor)
        assert len([batch for batch in loader]) == 2  # let in: it served the epoch
        actor.stop()
        thread.join(10)
        assert outcome == [0]
        from ferry.ray.handover import Handover

        Handover("tcp://x:1", False, client, authorized).close()
        assert set(os.listdir(keys / "authorized")) == before
    # a given key pair is used as it is, and nothing is written
    client, authorized = loader_keys(loader.curve, str(keys / "good.key_secret"))
    assert authorized is None and client.public_key == zmq.auth.load_certificate(str(keys / "good.key"))[0]

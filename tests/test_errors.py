"""Clear errors: each one names its cause (endpoint, peer, lengths, versions)."""

import logging
import pathlib
import time

import msgpack
import numpy as np
import pytest
import zmq

from ferry.common import protocol
from ferry.common.errors import ConfigError, NoProducersError
from ferry import RemoteLoader

from .helpers import dealer, wait_for


def test_no_producers_names_the_endpoint_and_the_count_seen(endpoint):
    with RemoteLoader(endpoint=endpoint, batch_size=2, dataset_len=10, no_producer_timeout=0.5) as loader:
        started = time.monotonic()
        with pytest.raises(NoProducersError) as info:
            next(iter(loader))
        assert time.monotonic() - started < 10
    message = str(info.value)
    assert endpoint in message and "seen 0 producer(s)" in message and "no_producer_timeout=0.5" in message


def test_no_producers_for_a_dataset_object_without_local_producers_points_at_local_producers(endpoint):
    """A script moved from DataLoader(ds) that passes the dataset object and no local_producers: the loader waits
    for producers started by hand; the error says how to load it here instead."""
    from tests.datasets import PairDataset

    with RemoteLoader(endpoint=endpoint, dataset=PairDataset(length=8), batch_size=2,
                      no_producer_timeout=0.5) as loader:
        with pytest.raises(NoProducersError) as info:
            next(iter(loader))
    assert str(info.value).endswith("; or, to load this dataset object here as DataLoader's workers would, pass "
                                    "local_producers=N"), str(info.value)


def test_no_producers_names_the_rejected_producer_and_why(endpoint, spawn):
    """The only producer that came was rejected (another dataset length): the error says so, instead of "seen 0
    producer(s)" alone, and its start command names the loader's own endpoint."""
    producer = spawn(endpoint, "synthetic", {"length": 30})
    with RemoteLoader(endpoint=endpoint, dataset_len=31, batch_size=2, heartbeat=0.2,
                      no_producer_timeout=1.0) as loader:
        assert producer.proc.wait(20) == 3  # rejected for good: it exits
        with pytest.raises(NoProducersError) as info:
            next(iter(loader))
    message = str(info.value)
    assert "seen 0 producer(s)" in message and "rejected 1 producer HELLO(s)" in message, message
    assert "dataset length 30" in message and "differs from this consumer's 31" in message, message
    assert f"python -m ferry.producer --connect {endpoint} --dataset" in message, message


def test_the_start_hint_fills_in_what_the_loader_knows():
    from ferry.consumer.health import start_hint_for
    from tests.datasets import PairDataset

    assert start_hint_for(("tcp://*:5555",), "npy-folder", {"root": "/data x", "bands": [1, 2]}) == (
        "python -m ferry.producer --connect tcp://<this-host>:5555 --dataset npy-folder "
        "--dataset-arg 'root=/data x' --dataset-arg 'bands=[1, 2]'")
    assert start_hint_for(("ipc:///tmp/l", "tcp://10.0.0.1:6000"), PairDataset(), None) == (
        "python -m ferry.producer --connect tcp://10.0.0.1:6000 --dataset tests.datasets:PairDataset "
        "[--dataset-arg KEY=VALUE ...]")
    # a value JSON cannot write (a Path, numpy's int64) is written as its str: the loader is built, never refused
    assert start_hint_for(("tcp://h:1",), "npy-folder", {"root": pathlib.Path("/d"), "n": np.int64(3)}).endswith(
        "--dataset-arg root=/d --dataset-arg n=3")
    assert start_hint_for(("ipc:///tmp/l",), None, None) == (
        "python -m ferry.producer --connect tcp://<this-host>:<port> --dataset <package.module:YourDataset>")


def test_the_start_hint_never_names_a_command_that_drops_the_transform_or_the_collate():
    """Issue 30, points 1 and 7: an ImageFolder built with a transform got the hint `--dataset ...:ImageFolder`,
    which starts producers without it; a loader with a collate_fn got a hint without --collate."""
    from ferry.consumer.health import start_hint_for
    from tests.datasets import PairDataset
    from tests.lifecycle_datasets import collate_raising_type_error

    class Folder:  # as torchvision's DatasetFolder keeps them
        def __init__(self) -> None:
            self.root, self.transform, self.target_transform = "/data/train", (lambda x: x), None

    hint = start_hint_for(("tcp://10.0.0.1:6000",), Folder(), None)
    assert "--dataset <package.module:make_dataset>" in hint, hint
    assert "Folder holds transform, which a command line cannot carry" in hint, hint
    hint = start_hint_for(("tcp://10.0.0.1:6000",), PairDataset(), None, collate=collate_raising_type_error,
                          collate_args={"alpha": 0.2})
    assert hint.endswith("--collate tests.lifecycle_datasets:collate_raising_type_error --collate-arg alpha=0.2"), hint
    assert start_hint_for(("tcp://h:1",), "synthetic", None, collate=lambda b: b).endswith(
        "--collate <package.module:your_collate_fn>")


def test_no_producers_after_the_last_one_left(endpoint, spawn):
    producer = spawn(endpoint, "synthetic", {"length": 400, "shape": [2], "delay": 0.01}, threads=1, slots=1)
    with RemoteLoader(endpoint=endpoint, batch_size=4, heartbeat=0.2, no_producer_timeout=1.0) as loader:
        # start-up is not what this test times: on a loaded machine a producer may take over 1 s to start
        wait_for(lambda: loader.stats()["producers"] >= 1, 60, "the producer to register")
        it = iter(loader)
        next(it)
        producer.kill()
        with pytest.raises(NoProducersError, match="seen 1 producer"):
            for _ in it:
                pass


def test_port_in_use_is_a_config_error_naming_the_endpoint(endpoint):
    with RemoteLoader(endpoint=endpoint, batch_size=2, timeout=5):
        with pytest.raises(ConfigError, match=f"cannot bind the consumer to {endpoint}.*in use"):
            RemoteLoader(endpoint=endpoint, batch_size=2, timeout=5)


def test_dataset_length_mismatch_is_rejected_and_logged_on_both_sides(endpoint, spawn, caplog):
    producer = spawn(endpoint, "synthetic", {"length": 30})
    with RemoteLoader(endpoint=endpoint, batch_size=2, dataset_len=31, heartbeat=0.2, timeout=5):
        assert producer.proc.wait(20) == 3  # every consumer rejected it permanently
    assert "rejected this producer: dataset length 30" in producer.output()
    assert any("rejected producer" in r.message and "differs from this consumer's 31" in r.message
               for r in caplog.records)


def test_fingerprint_mismatch_between_producers_is_rejected(endpoint, spawn, caplog):
    good = spawn(endpoint, "synthetic", {"length": 20, "shape": [2]})
    with RemoteLoader(endpoint=endpoint, batch_size=5, heartbeat=0.2, timeout=20) as loader:
        assert len(loader) == 4
        bad = spawn(endpoint, "synthetic", {"length": 20, "shape": [3]})
        assert bad.proc.wait(20) == 3
        assert [b[0].shape[1] for b in loader] == [2, 2, 2, 2]
        assert loader.stats()["producers_seen"] == 1
    assert "dataset fingerprint" in bad.output() and "differs" in bad.output()
    assert good.proc.poll() is None


def test_protocol_version_mismatch_gets_a_reason(endpoint, caplog):
    with RemoteLoader(endpoint=endpoint, batch_size=2, timeout=5) as loader:
        ctx = zmq.Context()
        sock = dealer(ctx, endpoint)
        try:
            sock.send(msgpack.packb({"v": 99, "type": "HELLO", "producer": "x"}))
            assert sock.poll(10_000), "no answer to a HELLO of another protocol version"
            reply = protocol.parse_header(sock.recv())
        finally:
            sock.close()
            ctx.term()
        assert reply["type"] == "REJECT" and reply["permanent"]
        assert "protocol version 99 is not supported (this side speaks 1)" in reply["reason"]
        wait_for(lambda: loader.stats()["invalid_messages"] == 1, 5, "the invalid message to be counted")
    assert any("protocol version 99" in r.message for r in caplog.records if r.levelno >= logging.WARNING)

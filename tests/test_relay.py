"""``ferry relay`` with real producers, sockets and processes (issue 34), driven by the Python reference client: an
epoch is DataLoader's in both orders and both payloads, a client that drops goes on where it was, the relay holds no
more than the client's window, other versions, tokens and second clients are refused with a clear reason, a
sample's error crosses with its remote traceback, a state resumes in a new relay, and the command stops on SIGTERM
leaving nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from ferry import RemoteLoader
from ferry.common.errors import ConfigError, RelayError
from ferry.consumer.relay import Relay
from ferry.consumer.relay.client import RelayClient, RemoteError, read_connection_file
from tests.datasets import DictDataset, FailingDataset, PairDataset

from .helpers import REPO, LeakCheck, producer_env, reference_batches, wait_for


@contextlib.contextmanager
def relay_of(dataset, **keywords):
    """A relay in this process (its loop on a thread), over a loader of one local producer."""
    keywords = {"local_producers": 1, "batch_size": 4, "shuffle": True, "seed": 3, "log_every": None,
                "no_producer_timeout": 60, **keywords}
    loader = RemoteLoader(dataset=dataset, **keywords)
    relay = Relay(loader)
    thread = threading.Thread(target=relay.run, name="test-relay")
    thread.start()
    try:
        yield relay
    finally:
        relay.stop()
        thread.join(30)
        assert not thread.is_alive()


def as_numpy(tree):
    if isinstance(tree, torch.Tensor):
        return tree.numpy()
    if isinstance(tree, dict):
        return {key: as_numpy(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [as_numpy(value) for value in tree]
    return tree


def assert_same(got, expected, where="batch"):
    if isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: {got!r}"
        assert got.dtype == expected.dtype and got.shape == expected.shape, f"{where}: {got.dtype}{got.shape}"
        assert np.array_equal(got, expected), f"{where}: values differ"
    elif isinstance(expected, dict):
        assert list(got) == list(expected), where
        for key in expected:
            assert_same(got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, list):
        assert len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{where}[{i}]")
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


def expected_epoch(dataset, epoch, seed=3):
    return [as_numpy(b) for b in reference_batches(dataset, batch_size=4, drop_last=False, world_size=1, rank=0,
                                                   shuffle=True, seed=seed, epoch=epoch)]


def test_two_epochs_are_dataloaders_row_major_inline_and_column_major_from_files():
    leaks = LeakCheck()
    dataset = DictDataset(18)
    with relay_of(dataset) as relay:
        with RelayClient(relay.connection_file, order="C", payload="inline") as client:
            got = list(client.epoch())
            assert client.welcome.get("payload") == "inline"
        for got_batch, expected in zip(got, expected_epoch(dataset, 0), strict=True):
            assert_same(got_batch, expected)
        with RelayClient(relay.connection_file, order="F", payload="file") as client:
            assert client.welcome.get("payload") == "file" and os.path.isdir(client.folder)
            folder = client.folder
            got = list(client.epoch())  # epoch 1: the loader went on
            assert client.state_dict()["epoch"] == 2
        for got_batch, expected in zip(got, expected_epoch(dataset, 1), strict=True):
            assert got_batch["image"].flags.f_contiguous  # R's order: a[i, j] is the batch's [i, j] all the same
            assert_same(got_batch, expected)
    assert not os.path.exists(folder) and not os.path.exists(relay.connection_file)
    leaks.assert_clean()


def test_a_client_that_drops_goes_on_where_it_was_and_the_relay_holds_no_more_than_its_window():
    dataset = PairDataset(40, shape=(2, 2))
    expected = expected_epoch(dataset, 0)
    with relay_of(dataset, buffer_batches=4) as relay:
        first = RelayClient(relay.connection_file, window=2)
        got = [first.next() for _ in range(3)]
        figures = wait_for(lambda: (s := first.stats())["relay"]["held"] == 2 and s, 20, "the relay filling its "
                                                                                           "window")
        assert figures["relay"]["window"] == 2
        loader = figures["loader"]
        assert loader["buffered"] + loader["in_flight"] <= 4
        pass_no, consumed = first.pass_no, first.consumed
        first.drop()  # gone without a word, 2 batches sent and not consumed
        again = RelayClient(relay.connection_file, resume=(pass_no, consumed))  # the same client, reconnected
        got += [again.next() for _ in range(2)]
        again.drop()
        other = RelayClient(relay.connection_file)  # a new one: on where the last one was
        while (batch := other.next()) is not None:
            got.append(batch)
        assert other.stats()["relay"]["items_resent"] >= 2
        other.close()
    assert len(got) == len(expected) == 10
    for got_batch, expected_batch in zip(got, expected):
        assert_same(got_batch, expected_batch)


def test_another_version_a_wrong_token_and_a_second_client_are_refused_with_the_reason():
    with relay_of(PairDataset(8)) as relay:
        with pytest.raises(RelayError, match=r"relay protocol version 1, the client version 2: use a client of "
                                             r"version 1"):
            RelayClient(relay.connection_file, version=2)
        with pytest.raises(RelayError, match="wrong token"):
            RelayClient(port=relay.port, token="guess")
        with RelayClient(relay.connection_file, name="first") as first:
            with pytest.raises(RelayError, match=r"one client at a time and first \(pid"):
                RelayClient(relay.connection_file)
            assert first.next() is not None
    with pytest.raises(ConfigError, match="loopback interface only"):
        Relay(None, host="0.0.0.0")  # checked before anything starts


def test_a_samples_error_takes_its_batch_place_with_its_remote_traceback():
    dataset = FailingDataset(12, bad=(5,))
    with relay_of(dataset, shuffle=False) as relay, RelayClient(relay.connection_file) as client:
        assert client.next()[1].tolist() == [0, 1, 2, 3]
        with pytest.raises(RemoteError, match="corrupt sample 5") as caught:
            client.next()
        error = caught.value
        assert error.consumed and error.index == 1 and "ValueError" in error.classes
        assert "RemoteSampleError" in error.classes and "corrupt sample 5" in error.remote_traceback
        assert client.next()[1].tolist() == [8, 9, 10, 11] and client.next() is None


def test_a_state_resumes_in_a_new_relay():
    dataset = PairDataset(30, shape=(2,))
    expected = expected_epoch(dataset, 1)
    with relay_of(dataset) as relay, RelayClient(relay.connection_file) as client:
        client.set_epoch(1)
        got = [client.next() for _ in range(3)]
        state = client.state_dict()
    assert state["epoch"] == 1 and state["batches_delivered"] == 3
    with relay_of(dataset) as relay, RelayClient(relay.connection_file) as client:
        client.load_state_dict(state)
        while (batch := client.next()) is not None:
            got.append(batch)
    assert len(got) == len(expected)
    for got_batch, expected_batch in zip(got, expected):
        assert_same(got_batch, expected_batch)


@pytest.mark.slow  # 6 s, most of it the command's start (torch's import): the rest of this file runs in the suite
def test_the_command_serves_on_loopback_and_stops_on_sigterm_leaving_nothing(tmp_path):
    connection = tmp_path / "relay.conn"
    process = subprocess.Popen(
        [sys.executable, "-m", "ferry", "relay", "--connection-file", str(connection), "--dataset",
         "tests.datasets:PairDataset", "--dataset-arg", "length=8", "--local-producers", "1", "--options",
         '{"batch_size": 4, "log_every": null}'],
        env=producer_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(connection.exists, 60, "the connection file")
        info = read_connection_file(str(connection))
        assert info["host"] == "127.0.0.1" and (os.stat(connection).st_mode & 0o777) == 0o600
        with RelayClient(str(connection), payload="file") as client:
            labels = [b[1].tolist() for b in client.epoch()]
        assert labels == [[0, 1, 2, 3], [4, 5, 6, 7]]
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert f"serving on 127.0.0.1:{info['port']}" in out
    assert not connection.exists() and not os.path.exists(info["payload"])


def test_every_example_of_ferry_relay_help_parses_into_loader_keywords():
    import shlex

    from ferry.cli import build_parser
    from ferry.relaying import EPILOG, loader_keywords

    text = EPILOG.replace("\\\n", " ")
    examples = [line.strip() for line in text.splitlines() if line.strip().startswith("ferry relay")]
    assert len(examples) >= 4
    parser = build_parser()
    for example in examples:
        words = [w for w in shlex.split(example.split("#")[0]) if w != "..."]
        args = parser.parse_args(words[1:])
        keywords = loader_keywords(args) if "--object" not in example else {}
        assert args.connection_file == "/tmp/relay.conn", example
        for endpoint in keywords.get("endpoint", ()):
            assert not endpoint.startswith(("tcp://*", "tcp://0.0.0.0")), example  # a private address, as the rest
    first = loader_keywords(parser.parse_args(shlex.split(examples[0].split("#")[0])[1:]))
    assert first["dataset_args"] == {"root": "/data/tiles", "shape": "13,299,299", "dtype": "uint8"}
    assert first["local_producers"] == 2 and first["shuffle"] is True and first["seed"] == 0
    json_one = [e for e in examples if "--options" in e][0]
    assert loader_keywords(parser.parse_args(shlex.split(json_one)[1:]))["buffer_batches"] == 4

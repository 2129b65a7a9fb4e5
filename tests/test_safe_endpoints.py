"""Safe defaults for where a loader binds (issue 30, points 3 and 7): never every interface without authentication
by default; two loaders of one process never collide on a port, FERRY_ENDPOINT included; a loader waiting for
remote producers says so within seconds, with the command that starts one, and again while it waits."""

from __future__ import annotations

import logging

import pytest
import torch

from ferry import RemoteLoader
from ferry.common.constants import WAITING_NOTICE_S
from ferry.consumer.io.ports import in_slot, release_slot, take_slot
from ferry.consumer.options import resolve_options
from ferry.consumer.options.groups import UNSET

from .helpers import free_port, wait_for


def _given(**kw):
    """RemoteLoader's keywords as its signature gives them, UNSET where not given."""
    import inspect

    given = {name: (UNSET if p.default is UNSET else p.default)
             for name, p in inspect.signature(RemoteLoader.__init__).parameters.items()
             if name not in ("self", "dataloader_options")}
    given.update(kw)
    return given


def _two_free_ports() -> int:
    """A port that is free, and the next one too."""
    import socket

    for _ in range(100):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two free ports in a row")


def test_the_default_binds_this_machine_only_and_every_interface_only_with_curve(monkeypatch, tmp_path):
    monkeypatch.delenv("FERRY_ENDPOINT", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert resolve_options(_given(dataset_len=4)).endpoints == ("tcp://127.0.0.1:5555",)
    curve = resolve_options(_given(dataset_len=4, curve_secret_key=str(tmp_path / "k"),
                                   curve_authorized_keys=str(tmp_path)))
    assert curve.endpoints == ("tcp://*:5555",)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert resolve_options(_given(dataset_len=4)).endpoints == ("tcp://127.0.0.1:5557",)


def test_slots_shift_tcp_ports_by_the_local_world_and_ipc_paths_by_a_suffix():
    assert in_slot("tcp://127.0.0.1:5555", 0, 4) == "tcp://127.0.0.1:5555"
    assert in_slot("tcp://10.0.0.5:5555", 2, 4) == "tcp://10.0.0.5:5563"
    assert in_slot("ipc:///tmp/t.sock", 1, 4) == "ipc:///tmp/t.sock.1"
    first, second = take_slot(), take_slot()
    assert second != first
    release_slot(first)
    assert take_slot() == first, "a closed loader's slot is taken again, so a script binds the same ports each run"
    release_slot(first)
    release_slot(second)


def test_two_loaders_of_one_process_on_ferry_endpoint_bind_two_ports_and_both_serve(monkeypatch, spawn):
    """A train and a val loader under FERRY_ENDPOINT: "Address already in use" before. The second binds the next
    slot; a producer given the range serves both."""
    port = _two_free_ports()
    monkeypatch.setenv("FERRY_ENDPOINT", f"tcp://127.0.0.1:{port}")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    args = {"length": 12, "shape": [2]}
    with RemoteLoader(dataset="synthetic", dataset_args=args, batch_size=4, timeout=60, log_every=None) as train, \
            RemoteLoader(dataset="synthetic", dataset_args=args, batch_size=4, timeout=60, log_every=None) as val:
        assert train.endpoints == (f"tcp://127.0.0.1:{port}",)
        assert val.endpoints == (f"tcp://127.0.0.1:{port + 1}",)
        spawn(f"tcp://127.0.0.1:{port}-{port + 1}", "synthetic", args)
        assert sum(len(x) for x, _ in train) == 12
        assert sum(len(x) for x, _ in val) == 12
    with RemoteLoader(dataset_len=4, batch_size=2) as again:
        assert again.endpoints == (f"tcp://127.0.0.1:{port}",), "the closed loaders gave their slots back"


def test_a_loader_waiting_for_producers_says_so_with_the_command(monkeypatch, caplog):
    monkeypatch.setenv("FERRY_ENDPOINT", f"tcp://127.0.0.1:{free_port()}")
    caplog.set_level(logging.WARNING, logger="ferry")
    with RemoteLoader(dataset="synthetic", batch_size=2, no_producer_timeout=WAITING_NOTICE_S + 30,
                      log_every=None) as loader:
        import threading

        from ferry import LoaderClosedError

        def wait() -> None:
            with pytest.raises(LoaderClosedError):
                next(iter(loader))

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        notice = wait_for(lambda: [r.getMessage() for r in caplog.records if "waiting for a producer" in r.getMessage()],
                          WAITING_NOTICE_S + 10, "the waiting notice")
        loader.close()  # ends the wait (LoaderClosedError in the waiter)
        waiter.join(10)
    assert f"bound to {loader.endpoints[0]}" in notice[0]
    assert f"python -m ferry.producer --connect {loader.endpoints[0]} --dataset synthetic" in notice[0]

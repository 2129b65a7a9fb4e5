"""The one endpoint parser: shapes accepted, errors that name the endpoint, ranges, and the LOCAL_RANK shift."""

from __future__ import annotations

import pytest

from ferry.common.endpoints import Endpoint, expand_endpoints, parse_endpoint, shift_port
from ferry.common.errors import ConfigError, FerryError


def test_parse_tcp_ipc_ipv6_and_ranges():
    assert parse_endpoint("tcp://trainer:5555") == Endpoint("tcp", host="trainer", port=5555, last_port=5555)
    assert parse_endpoint("tcp://[::1]:7000-7002") == Endpoint("tcp", host="[::1]", port=7000, last_port=7002)
    assert parse_endpoint("tcp://*:5555").host == "*"
    assert parse_endpoint("ipc:///tmp/ferry.sock") == Endpoint("ipc", path="/tmp/ferry.sock")


@pytest.mark.parametrize("bad", ["", "trainer:5555", "tcp://trainer", "tcp://trainer:", "tcp://trainer:http",
                                 "udp://trainer:5555", "ipc://", "tcp://a b:5555", "tcp://host:5555-"])
def test_malformed_endpoints_are_config_errors_naming_them(bad):
    with pytest.raises(ConfigError, match="must look like") as info:
        parse_endpoint(bad)
    assert repr(bad) in str(info.value) and isinstance(info.value, FerryError)


@pytest.mark.parametrize("bad", ["tcp://h:0", "tcp://h:65536", "tcp://h:6000-5999", "tcp://h:5000-5256"])
def test_invalid_ports_and_ranges(bad):
    with pytest.raises(ConfigError, match="invalid port"):
        parse_endpoint(bad)


def test_expand_endpoints_expands_ranges_keeps_order_and_refuses_duplicates_and_none():
    assert expand_endpoints(["tcp://h:5555-5557", "ipc:///tmp/x"]) == (
        "tcp://h:5555", "tcp://h:5556", "tcp://h:5557", "ipc:///tmp/x")
    assert len(expand_endpoints(["tcp://h:5000-5255"])) == 256  # the largest range
    with pytest.raises(ConfigError, match="duplicate"):
        expand_endpoints(["tcp://h:5555-5556", "tcp://h:5556"])
    with pytest.raises(ConfigError, match="at least one"):
        expand_endpoints([])


def test_shift_port_by_local_rank():
    assert shift_port("tcp://*:5555", 3) == "tcp://*:5558"
    assert shift_port("tcp://[::1]:5555", 1) == "tcp://[::1]:5556"
    assert shift_port("tcp://trainer:5555", 0) == "tcp://trainer:5555"
    assert shift_port("ipc:///tmp/ferry.sock", 2) == "ipc:///tmp/ferry.sock"


@pytest.mark.parametrize("bad", ["tcp://trainer", "tcp://trainer:http", "tcp://trainer:5555-5557"])
def test_shift_port_refuses_an_endpoint_without_one_port(bad):
    with pytest.raises(ConfigError, match="no port to shift by LOCAL_RANK=2") as info:
        shift_port(bad, 2)
    assert repr(bad) in str(info.value)


def test_shift_port_refuses_a_port_out_of_range():
    with pytest.raises(ConfigError, match="65536"):
        shift_port("tcp://h:65535", 1)

"""ZeroMQ endpoints: the one parser for ``tcp://HOST:PORT``, ``tcp://HOST:LO-HI`` (a port range) and
``ipc://PATH``, and what is built on it (expanding ranges, shifting a port by a local rank)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ferry.common.constants import MAX_PORT_RANGE
from ferry.common.errors import ConfigError

__all__ = ["Endpoint", "parse_endpoint", "expand_endpoints", "shift_port", "tcp_address"]

# HOST: a bracketed IPv6 address, or anything without ':', '/' or blanks (a name, an IPv4 address, '*' to bind)
_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]+\]|[^:/\s]+):(?P<lo>\d+)(?:-(?P<hi>\d+))?$")
_SHAPES = "tcp://HOST:PORT, tcp://HOST:PORT-PORT or ipc://PATH"


@dataclass(frozen=True)
class Endpoint:
    """A parsed endpoint. ``tcp``: ``host`` and the port range ``port..last_port`` (equal for one port);
    ``ipc``: ``path``."""

    scheme: str
    host: str = ""
    port: int = 0
    last_port: int = 0
    path: str = ""

    def urls(self) -> list[str]:
        """One endpoint string per port of the range (the endpoint itself for ipc)."""
        if self.scheme == "ipc":
            return [f"ipc://{self.path}"]
        return [f"tcp://{self.host}:{port}" for port in range(self.port, self.last_port + 1)]


def tcp_address(endpoint: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``tcp://HOST:PORT`` endpoint (the last port of a range), None for any other shape (a
    consumer may bind shapes this module does not parse: libzmq judges them). The port is not checked."""
    match = _TCP.match(endpoint)
    return None if match is None else (match["host"], int(match["hi"] or match["lo"]))


def parse_endpoint(endpoint: str) -> Endpoint:
    """Parse one endpoint.

    Raises:
        ConfigError: it is not one of the accepted shapes, or its port or range is invalid; the message
            names it.
    """
    if not isinstance(endpoint, str):
        raise ConfigError(f"endpoint {endpoint!r} must be a string like {_SHAPES}")
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return Endpoint("ipc", path=endpoint[len("ipc://"):])
    match = _TCP.match(endpoint)
    if not match:
        raise ConfigError(f"endpoint {endpoint!r} must look like {_SHAPES}")
    lo = int(match["lo"])
    hi = int(match["hi"]) if match["hi"] else lo
    if not (0 < lo <= hi < 65536) or hi - lo >= MAX_PORT_RANGE:
        raise ConfigError(f"endpoint {endpoint!r} has an invalid port or port range")
    return Endpoint("tcp", host=match["host"], port=lo, last_port=hi)


def expand_endpoints(endpoints: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Validate endpoints and expand port ranges: ``tcp://host:5555-5557`` -> three endpoints.

    Raises:
        ConfigError: an endpoint is malformed, none is given, or one is given twice; the message names it.
    """
    out = [url for endpoint in endpoints for url in parse_endpoint(endpoint).urls()]
    if not out:
        raise ConfigError("at least one consumer endpoint (--connect) is required")
    if len(set(out)) != len(out):
        raise ConfigError(f"duplicate endpoints in {list(endpoints)}")
    return tuple(out)


def shift_port(endpoint: str, offset: int) -> str:
    """``tcp://host:5555`` -> ``tcp://host:(5555 + offset)``: torchrun ranks on one host each get a port.

    An offset of 0, and an ipc endpoint, are returned unchanged.

    Raises:
        ConfigError: a tcp endpoint to shift is malformed or has no single port, or the shifted port is out
            of range; the message names the endpoint and the offset.
    """
    if offset == 0 or not endpoint.startswith("tcp://"):
        return endpoint
    try:
        parsed = parse_endpoint(endpoint)
    except ConfigError:
        parsed = None
    if parsed is None or parsed.last_port != parsed.port:
        raise ConfigError(f"endpoint {endpoint!r} has no port to shift by LOCAL_RANK={offset}")
    port = parsed.port + offset
    if not 0 < port < 65536:
        raise ConfigError(f"endpoint {endpoint!r} shifted by LOCAL_RANK={offset} gives port {port}, out of range")
    return f"tcp://{parsed.host}:{port}"

"""Endpoint slots: two loaders of one process that bind the same default (or ``FERRY_ENDPOINT``) never collide.

A loader given no ``endpoint=`` binds the default (``tcp://127.0.0.1:5555``; with CURVE every interface) or what
``FERRY_ENDPOINT`` says, its tcp ports shifted by torchrun's ``LOCAL_RANK``. A training script often has two
loaders (train and val): the second one of a process takes the next *slot*, its ports shifted by
``LOCAL_WORLD_SIZE`` more, so that the slots of the ranks of one host never meet either: with 2 ranks, rank 0's
loaders bind 5555 and 5557, rank 1's 5556 and 5558, and ``--connect tcp://host:5555-5558`` serves all four. An
ipc endpoint's path gets ``.N`` for slot N. Slots are taken in the order loaders are built and given back when one
closes, so the same script binds the same ports every run. An endpoint given as ``endpoint=`` is the script's
own choice: it is bound as given, and a port in use is a ConfigError.
"""

from __future__ import annotations

import threading

from ferry.common.endpoints import parse_endpoint

__all__ = ["take_slot", "release_slot", "in_slot"]

_lock = threading.Lock()
_held: set[int] = set()


def take_slot() -> int:
    """The lowest slot no open loader of this process holds, now held."""
    with _lock:
        slot = 0
        while slot in _held:
            slot += 1
        _held.add(slot)
        return slot


def release_slot(slot: int) -> None:
    with _lock:
        _held.discard(slot)


def in_slot(endpoint: str, slot: int, stride: int) -> str:
    """``endpoint`` moved to ``slot``: its tcp port plus ``slot × stride``, or its ipc path plus ``.slot``.

    Raises:
        ConfigError: the shifted port is out of range, or the endpoint has no single port.
    """
    from ferry.common.errors import ConfigError

    if slot == 0:
        return endpoint
    if endpoint.startswith("ipc://"):
        return f"{endpoint}.{slot}"
    parsed = parse_endpoint(endpoint)
    port = parsed.port + slot * stride
    if parsed.last_port != parsed.port or not 0 < port < 65536:
        raise ConfigError(f"endpoint {endpoint!r}: this process's loader number {slot + 1} would bind port {port}; "
                          "give each loader its own endpoint=")
    return f"tcp://{parsed.host}:{port}"

"""What producer actors need from the loader, taken from it so that nobody copies it by hand: where to connect,
and CURVE keys that let them in.

**Where.** The loader's first ``tcp://`` endpoint (an ``ipc://`` one is its local producers'). One bound on every
interface (``tcp://*:P``, ``tcp://0.0.0.0:P``) is reached at the address Ray knows the driver's node by
(``ray.util.get_node_ip_address()``); one bound on a named address, at that address. One bound on loopback only
(``127.0.0.1``, ``localhost``, ``::1``) cannot be reached from any other node: the producers then run on the
driver's own node (:attr:`Handover.local_only`), and the manager says so when the cluster has other nodes.

**Keys.** With the loader's CURVE on, each producer needs the loader's public key (read from its secret key file)
and a key pair whose public half lies in the loader's authorized-keys folder. Given ``curve_key`` (a
``.key_secret`` file of ``ferry keys``), that pair is used as it is: it must be authorized already. Otherwise the
manager makes a pair of its own, in memory, and authorizes it by writing its public key into the folder as
``ferry-ray-<random>.key`` (the loader reads the folder again at each handshake); :meth:`Handover.close` removes the
file. The secret half never touches a disk of the driver's: it travels to the actors inside their
:class:`~ferry.producer.ProducerConfig`, over Ray's own connections (token-authenticated since Ray 2.60, not
encrypted unless Ray's TLS is on).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import Any

from ferry.common.endpoints import parse_endpoint
from ferry.common.errors import ConfigError
from ferry.common.security import CurveClient

__all__ = ["Handover", "reachable_endpoint", "loader_keys", "file_keys", "LOOPBACK"]

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
#: Hosts that bind every interface.
EVERY_INTERFACE = ("*", "0.0.0.0", "[::]", "::")


@dataclass
class Handover:
    """Where producer actors connect, with what keys; and the authorized key file it made, if any."""

    endpoint: str
    local_only: bool
    curve: CurveClient | None = None
    authorized_file: str | None = None  # a public key written into the loader's authorized folder, removed at close

    def close(self) -> None:
        """Remove the public key this handover authorized (idempotent)."""
        path, self.authorized_file = self.authorized_file, None
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def reachable_endpoint(endpoints: tuple[str, ...] | list[str], node_address: str) -> tuple[str, bool]:
    """``(endpoint, local_only)``: what a producer on another node connects to, for a loader bound to ``endpoints``
    on the node Ray knows by ``node_address``; ``local_only`` when only this node can reach it (loopback).

    Raises:
        ConfigError: no ``tcp://`` endpoint (local mode's ``ipc://`` socket never leaves the machine).
    """
    for endpoint in endpoints:
        if not endpoint.startswith("tcp://"):
            continue
        parsed = parse_endpoint(endpoint)
        if parsed.host in EVERY_INTERFACE:
            return f"tcp://{node_address}:{parsed.port}", False
        return f"tcp://{parsed.host}:{parsed.port}", parsed.host in LOOPBACK
    raise ConfigError(f"the loader binds no tcp:// endpoint ({', '.join(endpoints) or 'none'}): give it "
                      "endpoint='tcp://ADDRESS:PORT' on an address the Ray nodes reach (with CURVE keys: "
                      "docs/deployment.md#ray)")


def loader_keys(curve: Any, key_file: str | None = None) -> tuple[CurveClient, str | None]:
    """Producer keys for a loader whose CURVE options are ``curve`` (a :class:`~ferry.consumer.options.CurveOptions`):
    ``(client keys, the authorized public key file made for them or None)``.

    Raises:
        ConfigError: a key file that does not load; an authorized-keys folder this process cannot write (give
            ``curve_key``, a pair authorized already).
    """
    import zmq.auth

    from ferry.common.security import _load

    server_public, _ = _load(curve.secret_key, secret=True, role="the loader's CURVE secret key")
    if key_file is not None:
        public, secret = _load(key_file, secret=True, role="producer CURVE key (curve_key)")
        return CurveClient(public, secret, server_public), None
    public, secret = zmq.curve_keypair()  # in memory only
    target = os.path.join(curve.authorized_keys, f"ferry-ray-{secrets.token_hex(6)}.key")
    try:
        with open(target + ".tmp", "w") as f:  # the public half, as zmq.auth.create_certificates writes it
            f.write(f"#   ferry.ray: producer actors' key, removed when they stop\nmetadata\ncurve\n"
                    f"    public-key = \"{public.decode()}\"\n")
        os.replace(target + ".tmp", target)  # whole, or not there: the authenticator may read the folder now
        _touch(curve.authorized_keys)
    except OSError as exc:
        raise ConfigError(f"cannot authorize the producer actors' key in {curve.authorized_keys!r}: {exc.strerror}; "
                          "give curve_key= a key pair whose public key is authorized there") from None
    return CurveClient(public, secret, server_public), target


def _touch(folder: str) -> None:
    """Move the folder's modification time on by a nanosecond: the loader reads the folder again only when it
    changes, and two changes within one tick of the kernel's coarse clock (the temporary file made, then renamed)
    may leave it equal to the time of a read in between."""
    try:
        info = os.stat(folder)
        os.utime(folder, ns=(info.st_atime_ns, info.st_mtime_ns + 1))
    except OSError:  # not its owner: the rename's own change stands
        pass


def file_keys(key_file: str, server_key_file: str) -> CurveClient:
    """Producer keys from files, as ``--curve-key`` and ``--curve-server-key`` take them (a separate driver).

    Raises:
        ConfigError: a key file that does not load.
    """
    return CurveClient.load(key_file, server_key_file)

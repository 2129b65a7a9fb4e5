"""Optional CURVE security (docs/ARCHITECTURE.md#security), through pyzmq's ``zmq.auth``.

The consumer is the CURVE *server*: it holds a secret key and accepts only producers whose public keys lie
in an *authorized-keys folder* (checked by a ZAP authenticator thread in the consumer's context). Each
producer is a CURVE *client*: it holds its own key pair and the server's public key. Traffic is encrypted;
an unauthorized or plaintext producer never completes the handshake, so it never sends a message.

Key files are the ``.key`` (public) / ``.key_secret`` (both keys) pairs of ``zmq.auth.create_certificates``;
``ferry keys DIR`` makes them.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth

from ferry.common.constants import MAX_TRACKED_PEERS
from ferry.common.errors import ConfigError
from ferry.common.ratelimit import RateLimitedLog

__all__ = ["CurveServer", "CurveClient", "AuthorizedKeys", "generate_keys"]

log = logging.getLogger("ferry.consumer")


def _load(path: str, *, secret: bool, role: str) -> tuple[bytes, bytes | None]:
    if not os.path.isfile(path):
        raise ConfigError(f"{role}: key file {path!r} does not exist (make keys with: ferry keys DIR)")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except Exception as exc:
        raise ConfigError(f"{role}: {path!r} is not a CURVE key file: {exc}") from None
    if secret and not secret_key:
        raise ConfigError(f"{role}: {path!r} holds no secret key; give the .key_secret file")
    return public, secret_key


@dataclass(frozen=True)
class CurveServer:
    """The consumer's side: its key pair and the folder of authorized producer public keys."""

    public_key: bytes
    secret_key: bytes
    authorized_keys: str

    @classmethod
    def load(cls, secret_key_file: str, authorized_keys: str) -> "CurveServer":
        public, secret = _load(secret_key_file, secret=True, role="consumer CURVE secret key")
        if not os.path.isdir(authorized_keys):
            raise ConfigError(f"authorized-keys folder {authorized_keys!r} does not exist")
        return cls(public, secret, os.path.abspath(authorized_keys))

    def apply_server(self, sock: zmq.Socket) -> None:
        sock.curve_secretkey = self.secret_key
        sock.curve_publickey = self.public_key
        sock.curve_server = True

    def start_authenticator(self, ctx: zmq.Context) -> Any:
        """Start the ZAP handler thread for ``ctx``; the caller stops it before terminating ``ctx``."""
        from zmq.auth.thread import ThreadAuthenticator

        auth = ThreadAuthenticator(ctx, log=logging.getLogger("ferry.consumer.zap"))
        auth.start()
        auth.configure_curve_callback(domain="*", credentials_provider=AuthorizedKeys(self.authorized_keys))
        return auth


class AuthorizedKeys:
    """ZAP credentials provider: a key is allowed when its ``.key`` file lies in the folder.

    The folder is read again whenever its modification time changes, so a producer authorized later is
    let in without restarting the trainer. A denied key is logged once, at WARNING, with its public key, and
    at most LOG_LINES_PER_WINDOW such lines a minute (a hostile peer can make up keys).
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._mtime: float | None = None
        self._keys: set[bytes] = set()
        self._denied: set[bytes] = set()
        self._denied_log = RateLimitedLog(
            log, suppressed="%d more CURVE handshakes of unknown keys were denied without a log line")

    def callback(self, domain: str, key: bytes) -> bool:
        mtime = os.stat(self.folder).st_mtime
        if mtime != self._mtime:
            self._mtime = mtime
            self._keys = set(zmq.auth.load_certificates(self.folder))
        if key in self._keys:
            return True
        if key not in self._denied and len(self._denied) < MAX_TRACKED_PEERS:
            self._denied.add(key)
            self._denied_log.warning("CURVE handshake DENIED for producer key %s: not in %s", key.decode(),
                                     self.folder)
        return False


@dataclass(frozen=True)
class CurveClient:
    """A producer's side: its own key pair and the consumer's public key."""

    public_key: bytes
    secret_key: bytes
    server_key: bytes

    @classmethod
    def load(cls, key_file: str, server_key_file: str) -> "CurveClient":
        public, secret = _load(key_file, secret=True, role="producer CURVE key")
        server, _ = _load(server_key_file, secret=False, role="consumer CURVE public key")
        return cls(public, secret, server)

    def apply_client(self, sock: zmq.Socket) -> None:
        sock.curve_secretkey = self.secret_key
        sock.curve_publickey = self.public_key
        sock.curve_serverkey = self.server_key


def generate_keys(directory: str, producers: list[str]) -> dict[str, str]:
    """Create ``server`` and producer key pairs in ``directory`` and authorize the producers.

    Existing key files are kept. Returns a map of what lies where.
    """
    os.makedirs(directory, exist_ok=True)
    authorized = os.path.join(directory, "authorized")
    os.makedirs(authorized, exist_ok=True)
    for name in ["server", *producers]:
        if not os.path.exists(os.path.join(directory, f"{name}.key_secret")):
            zmq.auth.create_certificates(directory, name)
        os.chmod(os.path.join(directory, f"{name}.key_secret"), 0o600)
    for name in producers:
        shutil.copy(os.path.join(directory, f"{name}.key"), os.path.join(authorized, f"{name}.key"))
    return {
        "consumer secret key": os.path.join(directory, "server.key_secret"),
        "consumer public key (give to producers)": os.path.join(directory, "server.key"),
        "authorized producer keys": authorized,
        **{f"producer {n} key pair": os.path.join(directory, f"{n}.key_secret") for n in producers},
    }

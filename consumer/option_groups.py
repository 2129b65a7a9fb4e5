"""RemoteLoader's three option groups: small frozen dataclasses, each checked when it is built.

* :class:`LocalOptions` (``local=``): producer processes that the loader starts on this machine;
* :class:`TransportOptions` (``transport=``): heartbeats, liveness, the task timeout and the message bound;
* :class:`CurveOptions` (``curve=``): encryption and authentication of remote producers.

Each group field has a flat keyword too; :meth:`_Group.from_flat` builds a group from either, never both.
They are public API, importable from ``ferry`` and :mod:`ferry.consumer.options` (which resolves the rest
of the keywords). This module never imports torch.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Callable

from ferry.common import validate as check
from ferry.common.constants import (
    DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BATCH_BYTES, DEFAULT_SLOTS, DEFAULT_TASK_TIMEOUT_S, DEFAULT_THREADS,
    HEARTBEAT_S, LIVENESS, MAX_HEARTBEAT_S, MAX_SLOTS, MAX_THREADS, MIN_HEARTBEAT_S, MIN_LIVENESS,
)
from ferry.common.errors import ConfigError, ConfigTypeError
from ferry.common import compression as comp

__all__ = ["LocalOptions", "TransportOptions", "CurveOptions", "UNSET"]


class _Unset:
    """A keyword the caller did not give (so that ``heartbeat=1.0`` plus ``transport=`` is seen as a clash)."""

    def __repr__(self) -> str:
        return "<default>"


UNSET: Any = _Unset()


def _compression(name: str, value: Any) -> str | None:
    """"auto", "lz4", "zstd" or None; an explicit codec needs its library here, to decompress."""
    mode = comp.check_mode(name, value)
    comp.require(mode)
    return value


def _start_method(name: str, value: Any) -> str:
    return check.choice(name, value, multiprocessing.get_all_start_methods())


def _hook(name: str, value: Any) -> Any:
    """A producer-side hook: a callable (pickled to forked or spawned producers) or a 'package.module:fn' spec."""
    if callable(value):
        return value
    if not isinstance(value, str):
        raise ConfigTypeError(f"{name} must be a callable or a 'package.module:function' spec, got {value!r} "
                              f"({type(value).__name__})")
    if ":" not in value:
        raise ConfigError(f"{name} must look like package.module:callable, got {value!r}")
    return value


class _Group:
    """Checks a frozen dataclass's fields with ``_CHECKS``: ``field -> (flat keyword, check(name, value))``."""

    _CHECKS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {}

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            _, validate = self._CHECKS[f.name]
            object.__setattr__(self, f.name, validate(f"{type(self).__name__}.{f.name}", getattr(self, f.name)))

    @classmethod
    def from_flat(cls, given: Mapping[str, Any], group: Any, keyword: str) -> Any:
        """The group from ``keyword=`` (an instance of ``cls``) or from its flat keywords; never both."""
        flat = {field: given[name] for field, (name, _) in cls._CHECKS.items() if given[name] is not UNSET}
        if group is None:
            for field, value in flat.items():  # checked under the name the caller used
                flat[field] = cls._CHECKS[field][1](cls._CHECKS[field][0], value)
            return cls(**flat)
        if not isinstance(group, cls):
            raise ConfigTypeError(f"{keyword} must be a {cls.__name__}, got {group!r} ({type(group).__name__})")
        clashes = [f for f, value in flat.items() if value is not None]
        if clashes:
            names = ", ".join(f"{cls._CHECKS[f][0]}=" for f in clashes)
            raise ConfigError(f"{names} and {keyword}= both given: set each option once, either as a flat "
                              f"keyword or in {cls.__name__}(...)")
        return group


@dataclass(frozen=True)
class LocalOptions(_Group):
    """Producer processes that the loader starts on this machine, owns, and stops at ``close()``.

    They serve the loader's ``dataset`` over a private ``ipc://`` socket.

    Args:
        count: how many producer processes (flat: ``local_producers``).
        threads: loader threads in each (flat: ``producer_threads``).
        slots: batches each takes at once (flat: ``producer_slots``).
        mp_context: the multiprocessing start method for a dataset *object* (``"fork"`` on Linux by default,
            ``"spawn"`` for objects that must not be forked).
        transform: applied to every sample on the producer (flat: ``producer_transform``). A callable, or a
            ``package.module:callable`` spec (required when the dataset is a spec).
        collate: merges a list of samples into a batch on the producer, in place of ``default_collate``, as
            DataLoader's ``collate_fn`` (flat: ``collate_fn``), e.g. to pad variable-length sequences. Its
            output is what travels: any tree of dicts, lists and tuples with array, tensor and scalar leaves.
            A callable or a spec, as ``transform``. Producers on other hosts take ``--collate`` instead.
        init: called once in each producer process with its worker id (0..count-1), after its ``random``,
            numpy and torch generators are seeded: DataLoader's ``worker_init_fn`` (flat: ``producer_init``).
        shared_memory: producers write batches into shared memory that the loader maps, instead of
            sending them over the socket (one copy of the bytes instead of four).
    """

    count: int
    threads: int = DEFAULT_THREADS
    slots: int = DEFAULT_SLOTS
    mp_context: str | None = None
    transform: Any = None
    shared_memory: bool = True
    collate: Any = None
    init: Any = None

    _CHECKS = {
        "count": ("local_producers", lambda n, v: check.integer(n, v, low=1)),
        "threads": ("producer_threads", lambda n, v: check.integer(n, v, low=1, high=MAX_THREADS)),
        "slots": ("producer_slots", lambda n, v: check.integer(n, v, low=1, high=MAX_SLOTS)),
        "mp_context": ("mp_context", lambda n, v: check.optional(_start_method, n, v)),
        "transform": ("producer_transform", lambda n, v: check.optional(_hook, n, v)),
        "shared_memory": ("shared_memory", check.boolean),
        "collate": ("collate_fn", lambda n, v: check.optional(_hook, n, v)),
        "init": ("producer_init", lambda n, v: check.optional(_hook, n, v)),
    }


@dataclass(frozen=True)
class TransportOptions(_Group):
    """How the loader talks to its producers, and when it gives up on one.

    Args:
        heartbeat: seconds between PINGs, on both sides. [Unit: second]
        liveness: heartbeats of silence after which a producer is lost and its tasks re-issued.
        task_timeout: a producer holding one task longer than this is dropped and its tasks re-issued
            (a hung sample, or a peer that never answers). [Unit: second]
        max_batch_bytes: the largest batch accepted (ZMQ_MAXMSGSIZE, and the total of a batch's arrays);
            a bigger one is dropped as invalid. [Unit: byte]
        max_attempts: a batch whose task is lost this many times (its producer died or fell silent, it held
            the task past ``task_timeout``, or its answer was unusable) raises PoisonTaskError in the loop
            instead of being issued again. An orderly leave (BYE) costs no attempt.
        compression: what producers should do with batch frames: ``"auto"`` (compress only where it pays:
            never on loopback, ipc or shared memory; elsewhere a codec this consumer kept after a trial showed
            more data arriving while the training loop waited, see docs/tuning.md), ``"lz4"``, ``"zstd"`` or
            None (off). A producer's ``--compression`` overrides
            it. ``"lz4"`` needs ``ferry[lz4]``, ``"zstd"`` ``ferry[zstd]``; ``"auto"`` without either stays off.
    """

    heartbeat: float = HEARTBEAT_S
    liveness: int = LIVENESS
    task_timeout: float = DEFAULT_TASK_TIMEOUT_S
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    compression: str | None = "auto"

    _CHECKS = {
        "heartbeat": ("heartbeat", lambda n, v: check.number(n, v, low=MIN_HEARTBEAT_S, high=MAX_HEARTBEAT_S)),
        "liveness": ("liveness", lambda n, v: check.integer(n, v, low=MIN_LIVENESS)),
        "task_timeout": ("task_timeout", lambda n, v: check.number(n, v, low=0, low_open=True)),
        "max_batch_bytes": ("max_batch_bytes", lambda n, v: check.integer(n, v, low=1, high=2**63 - 1)),
        "max_attempts": ("max_attempts", lambda n, v: check.integer(n, v, low=1)),
        "compression": ("compression", _compression),
    }


@dataclass(frozen=True)
class CurveOptions(_Group):
    """CURVE: traffic is encrypted, and only producers with an authorized key are let in.

    Args:
        secret_key: the loader's key pair, ``server.key_secret`` from ``ferry keys`` (flat: ``curve_secret_key``).
        authorized_keys: the folder of authorized producer public keys, ``.key`` files
            (flat: ``curve_authorized_keys``).
    """

    secret_key: str
    authorized_keys: str

    _CHECKS = {
        "secret_key": ("curve_secret_key", check.path),
        "authorized_keys": ("curve_authorized_keys", check.path),
    }

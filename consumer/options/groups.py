"""RemoteLoader's three option groups: small frozen dataclasses, each checked when it is built.

* :class:`LocalOptions` (``local=``): producer processes that the loader starts on this machine;
* :class:`TransportOptions` (``transport=``): heartbeats, liveness, the task timeout and the message bound;
* :class:`CurveOptions` (``curve=``): encryption and authentication of remote producers.

Every field is declared by a :class:`~ferry.common.settings.Setting` (its check, default and doc; the options
a producer takes too are the very declarations of :class:`ferry.producer.ProducerConfig`), with the name of its
flat keyword on ``RemoteLoader``; :meth:`_Group.from_flat` builds a group from either, never both. They are
public API, importable from ``ferry`` and :mod:`ferry.consumer.options`. This module never imports torch.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ferry.common import settings as s
from ferry.common.constants import (
    DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BATCH_BYTES, DEFAULT_TASK_TIMEOUT_S, MAX_BATCH_BYTES_LIMIT,
)
from ferry.common.errors import ConfigError, ConfigTypeError
from ferry.common.pool import MAX_WEIGHT
from ferry.common.settings import Setting, option, setting_of

__all__ = ["LocalOptions", "TransportOptions", "CurveOptions", "UNSET", "AUTO", "ProducerCount"]


class _Unset:
    """A keyword the caller did not give (so that ``heartbeat=1.0`` plus ``transport=`` is seen as a clash)."""

    def __repr__(self) -> str:
        return "<default>"


UNSET: Any = _Unset()


class _Group:
    """A frozen dataclass whose fields are declared with :func:`~ferry.common.settings.option`, each with the
    name of its flat keyword; its fields are checked when it is built."""

    def __post_init__(self) -> None:
        s.check_fields(self, f"{type(self).__name__}.")

    @classmethod
    def from_flat(cls, given: Mapping[str, Any], group: Any, keyword: str) -> Any:
        """The group from ``keyword=`` (an instance of ``cls``) or from its flat keywords; never both."""
        flat = {f: given[f.metadata["flat"]] for f in fields(cls) if given[f.metadata["flat"]] is not UNSET}
        if group is None:  # checked under the name the caller used
            return cls(**{f.name: setting_of(f).check(f.metadata["flat"], value) for f, value in flat.items()})
        if not isinstance(group, cls):
            raise ConfigTypeError(f"{keyword} must be a {cls.__name__}, got {group!r} ({type(group).__name__})")
        clashes = [f.metadata["flat"] for f, value in flat.items() if value is not None]
        if clashes:
            names = ", ".join(f"{name}=" for name in clashes)
            raise ConfigError(f"{names} and {keyword}= both given: set each option once, either as a flat "
                              f"keyword or in {cls.__name__}(...)")
        return group

    @classmethod
    def flat_keywords(cls) -> dict[str, str]:
        """``{flat keyword: field}``."""
        return {f.metadata["flat"]: f.name for f in fields(cls)}


class StartMethod(s.Choice):
    """A start method's name, or a ``multiprocessing`` context object (DataLoader's ``multiprocessing_context``
    takes both; ``torch.multiprocessing.get_context`` returns the same objects)."""

    def __init__(self) -> None:
        super().__init__(multiprocessing.get_all_start_methods())

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, multiprocessing.context.BaseContext):
            return value
        if not isinstance(value, str):
            raise ConfigTypeError(f"{name} must be a start method name ({', '.join(self.choices)}) or a "
                                  f"multiprocessing context, got {value!r} ({type(value).__name__})")
        return super().check(name, value)


#: ``count="auto"`` (flat ``local_producers="auto"``): as many producers as the training loop needs.
AUTO = "auto"


class ProducerCount(s.Int):
    """An int >= ``low``, or ``"auto"``."""

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, str):
            if value == AUTO:
                return AUTO
            raise ConfigTypeError(f'{name} must be an int >= {self.low} or "auto", got {value!r} (str)')
        return super().check(name, value)


COUNT = Setting(ProducerCount(1), "how many producer processes, or ``\"auto\"``: as many as the training loop needs, "
                "between ``min`` and ``max``, started and stopped from the demand gauge (``stats()"
                "[\"producers_needed\"]``) at most once every 5 s, changing direction at most once a minute "
                "(consumer/local/autoscale.py, docs/tuning.md#autoscaling-local-producers).")
MIN_COUNT = Setting(s.Int(1), "with ``count=\"auto\"``: the fewest producers, and how many start. None: 1.", None,
                    optional=True)
MAX_COUNT = Setting(s.Int(1), "with ``count=\"auto\"``: the most producers. None: the CPUs this process may run on "
                    "(``os.sched_getaffinity``) minus one, at least 1 and at least ``min``.", None, optional=True)
MP_CONTEXT = Setting(StartMethod(),
                     "the multiprocessing start method for a dataset *object*: a name or a context object "
                     "(``multiprocessing.get_context(\"spawn\")``), as DataLoader's ``multiprocessing_context``. "
                     "``\"fork\"`` on Linux by default, ``\"spawn\"`` for objects that must not be forked. Only "
                     "with local producers (without them it is a ConfigError, as DataLoader refuses it with "
                     "``num_workers=0``).", None, optional=True)
SHARED_MEMORY = Setting(s.Bool(), "producers write batches into shared memory that the loader maps, instead of "
                        "sending them over the socket (one copy of the bytes instead of four).", True)


@s.documented
@dataclass(frozen=True)
class LocalOptions(_Group):
    """Producer processes that the loader starts on this machine, owns, and stops at ``close()``.

    They serve the loader's ``dataset`` over a private ``ipc://`` socket. Producers on other hosts take the
    command-line flags of the same options (``--threads``, ``--transform``, ``--collate``, ``--init`` …).
    """

    count: int | str = option(COUNT, flat="local_producers")
    threads: int = option(s.THREADS, flat="producer_threads")
    slots: int = option(s.SLOTS, flat="producer_slots")
    mp_context: Any = option(MP_CONTEXT, flat="mp_context")  # a name, a context object, or None
    transform: Any = option(s.TRANSFORM, flat="producer_transform")
    shared_memory: bool = option(SHARED_MEMORY, flat="shared_memory")
    collate: Any = option(s.COLLATE, flat="collate_fn")
    init: Any = option(s.INIT, flat="producer_init")
    collate_args: dict[str, Any] = option(s.COLLATE_ARGS, flat="collate_args")
    transform_args: dict[str, Any] = option(s.TRANSFORM_ARGS, flat="producer_transform_args")
    # last, so that the fields above keep their positions
    min: int | None = option(MIN_COUNT, flat="local_producers_min")
    max: int | None = option(MAX_COUNT, flat="local_producers_max")
    ahead: int | None = option(s.AHEAD, flat="producer_ahead")
    seed_per_sample: bool | None = option(s.SEED_PER_SAMPLE, flat="seed_per_sample")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.count != AUTO and (self.min is not None or self.max is not None):
            raise ConfigError(f'min= and max= (local_producers_min=, local_producers_max=) bound count="auto" '
                              f'(local_producers="auto"); with count={self.count!r} the count is fixed')
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ConfigError(f"min={self.min} is above max={self.max} (local_producers_min, local_producers_max)")


TASK_TIMEOUT = Setting(s.Real(0, low_open=True), "a producer holding one task longer than this is dropped and its "
                       "tasks re-issued (a hung sample, or a peer that never answers).", DEFAULT_TASK_TIMEOUT_S,
                       unit="second")
MAX_BATCH_BYTES = Setting(s.Int(1, MAX_BATCH_BYTES_LIMIT), "the largest batch accepted (ZMQ_MAXMSGSIZE, and the "
                          "total of a batch's arrays); a bigger one is dropped as invalid.", DEFAULT_MAX_BATCH_BYTES,
                          unit="byte")
MAX_ATTEMPTS = Setting(s.Int(1), "a batch whose task is lost this many times (its producer died or fell silent, it "
                       "held the task past ``task_timeout``, or its answer was unusable) raises PoisonTaskError in "
                       "the loop instead of being issued again. An orderly leave (BYE) costs no attempt.",
                       DEFAULT_MAX_ATTEMPTS)
COMPRESSION = Setting(s.Compression(), "what producers should do with batch frames: ``\"auto\"`` (compress only "
                      "where it pays: never on loopback, ipc or shared memory; elsewhere a codec this loader kept "
                      "after a trial showed more data arriving while the training loop waited, see docs/tuning.md), "
                      "``\"lz4\"``, ``\"zstd\"`` or None (off). A "
                      "producer's ``--compression`` overrides it. ``\"lz4\"`` needs ``ferry[lz4]``, ``\"zstd\"`` "
                      "``ferry[zstd]``; ``\"auto\"`` without either stays off.", "auto", optional=True)

WEIGHT = Setting(s.Real(0, MAX_WEIGHT, low_open=True, expected=f"a number in (0, {MAX_WEIGHT:g}]"),
                 "this loader's share of a producer pool against the other jobs it serves: when their demand exceeds "
                 "the pool, each producer gives its consumers time in proportion to their weights, and a job that "
                 "needs less than its share leaves the rest to the others (docs/deployment.md#one-pool-several-jobs).",
                 1.0)


@s.documented
@dataclass(frozen=True)
class TransportOptions(_Group):
    """How the loader talks to its producers, and when it gives up on one."""

    heartbeat: float = option(s.HEARTBEAT, flat="heartbeat")
    liveness: int = option(s.LIVENESS, flat="liveness")
    task_timeout: float = option(TASK_TIMEOUT, flat="task_timeout")
    max_batch_bytes: int = option(MAX_BATCH_BYTES, flat="max_batch_bytes")
    max_attempts: int = option(MAX_ATTEMPTS, flat="max_attempts")
    compression: str | None = option(COMPRESSION, flat="compression")
    weight: float = option(WEIGHT, flat="weight")


@s.documented
@dataclass(frozen=True)
class CurveOptions(_Group):
    """CURVE: traffic is encrypted, and only producers with an authorized key are let in."""

    secret_key: str = option(Setting(s.Path(), "the loader's key pair, ``server.key_secret`` from ``ferry keys``."),
                             flat="curve_secret_key")
    authorized_keys: str = option(Setting(s.Path(), "the folder of authorized producer public keys, ``.key`` files."),
                                  flat="curve_authorized_keys")

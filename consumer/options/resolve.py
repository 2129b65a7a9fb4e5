"""The resolution of RemoteLoader's keywords into one checked :class:`LoaderOptions`.

Each keyword is checked by its declaration (:mod:`ferry.consumer.options.keywords`, and the groups' fields in
:mod:`ferry.consumer.options.groups`); what is left here are the rules between keywords (a group and its flat
keywords, ``batch_sampler`` and ``batch_size``, ``seed`` and ``generator``, CURVE and local mode …) and the
defaults that come from the environment (torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).
:func:`resolve_options` checks everything before the loader starts any thread or process; torch is imported
only to draw a seed from a ``generator``.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from ferry.common.constants import DEFAULT_CURVE_ENDPOINT, DEFAULT_ENDPOINT, DEFAULT_THREADS, MAX_PORT
from ferry.common.errors import ConfigError
from ferry.common.endpoints import shift_port
from ferry.common.variables import (
    CURVE_VARIABLES as CURVE_ENV, ENDPOINT_VARIABLE, LOADER_VARIABLES, OTHER_VARIABLES, warn_unknown_variables,
)

from ferry.consumer.options.groups import AUTO, UNSET, CurveOptions, LocalOptions, ProducerCount, TransportOptions
from ferry.consumer.options.keywords import KEYWORDS

__all__ = ["LoaderOptions", "resolve_options", "env_int", "warn_excessive_producers"]


@dataclass(frozen=True)
class LoaderOptions:
    """Every option of a RemoteLoader, checked and resolved (environment, defaults, groups)."""

    endpoints: tuple[str, ...]  # to bind, before local mode adds its ipc socket; LOCAL_RANK applied
    batch_size: int | None  # None: a batch_sampler's batches, or unbatched mode
    unbatched: bool  # batch_size=None without a batch_sampler: DataLoader's unbatched mode, one sample a task
    shuffle: bool
    seed: int
    drop_last: bool
    generator: Any  # the user's torch.Generator, or None
    generator_state: Any  # its state when the loader was built (a ByteTensor), which the shuffle replays; or None
    sampler: Any
    batch_sampler: Any
    rank: int
    world_size: int
    buffer_batches: int
    in_order: bool
    no_producer_timeout: float  # math.inf: wait forever
    timeout: float  # DataLoader's: seconds each batch may take to come; 0 (or math.inf): no limit
    dataset_len: int | None
    device: Any
    pin_memory: bool | None
    device_transform: Callable[[Any], Any] | None
    dataset: Any
    dataset_args: dict[str, Any] | None
    iterable_streams: int | None  # the streams an iterable dataset is split into; None: local_producers="auto"
    on_error: str
    log_every: float | None
    metrics_port: int | None
    local: LocalOptions | None
    transport: TransportOptions
    curve: CurveOptions | None
    # the endpoints are the default's or FERRY_ENDPOINT's, which every loader of a process would bind: each takes a
    # slot of its own when it binds (consumer/io/ports.py); False: given as endpoint=, bound as given
    shared_endpoints: bool = False


#: Keywords that only their declaration checks; the others have rules between them, below.
_CHECKED_ALONE = ("drop_last", "sampler", "batch_sampler", "buffer_batches", "in_order", "dataset", "dataset_args",
                  "dataset_len", "pin_memory", "device_transform", "on_error", "log_every", "metrics_port", "timeout")


def _check(name: str, value: Any) -> Any:
    """The keyword ``name``'s ``value`` (its declared default where UNSET), checked by its declaration."""
    return KEYWORDS[name].check(name, KEYWORDS[name].default if value is UNSET else value)


def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """An integer environment variable (torchrun's RANK, WORLD_SIZE, LOCAL_RANK), read when called."""
    value = (os.environ if environ is None else environ).get(name, "")
    if value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def _endpoints(given: Mapping[str, Any], local: bool, curve: bool,
               environ: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], bool]:
    """What to bind: the given ones, else ``FERRY_ENDPOINT``'s, else the default (none in local mode, whose ipc
    socket is added later): this machine only, or every interface with CURVE on (``curve``), never every interface
    without authentication. And whether they are shared by the process's loaders (not given as ``endpoint=``)."""
    endpoint, name = given["endpoint"], "endpoint"
    shared = endpoint is UNSET
    if endpoint is UNSET:
        from_env = (os.environ if environ is None else environ).get(ENDPOINT_VARIABLE, "")
        endpoint, name = [e.strip() for e in from_env.split(",") if e.strip()] or UNSET, ENDPOINT_VARIABLE
        bad = [e for e in (endpoint if endpoint is not UNSET else []) if "://" not in e]
        if bad:
            raise ConfigError(f"environment variable {ENDPOINT_VARIABLE}={from_env!r} is not a comma-separated list of "
                              f"endpoints like tcp://*:5555 or ipc:///path ({bad[0]!r})")
    if endpoint is UNSET:
        default = DEFAULT_CURVE_ENDPOINT if curve else DEFAULT_ENDPOINT
        return (() if local else (shift_port(default, env_int("LOCAL_RANK", 0)),)), shared
    endpoints = KEYWORDS["endpoint"].check(name, endpoint) or ()
    local_rank = env_int("LOCAL_RANK", 0) if endpoints else 0
    return tuple(shift_port(e, local_rank) for e in endpoints), shared


def _metrics_port(port: int | None) -> int | None:
    """``metrics_port`` shifted by torchrun's ``LOCAL_RANK``, as the endpoint is; 0 or None: none.

    Raises:
        ConfigError: the shifted port is out of range.
    """
    if not port:
        return None
    local_rank = env_int("LOCAL_RANK", 0)
    if not 0 < port + local_rank <= MAX_PORT:
        raise ConfigError(f"metrics_port={port} shifted by LOCAL_RANK={local_rank} gives port {port + local_rank}, "
                          "out of range")
    return port + local_rank


def _no_producer_timeout(given: Mapping[str, Any]) -> float:
    """``no_producer_timeout``; None or 0 wait forever (math.inf)."""
    value = _check("no_producer_timeout", given["no_producer_timeout"])
    return math.inf if value in (None, 0) else value


def _sharding(given: Mapping[str, Any]) -> tuple[int, int]:
    """``rank`` and ``world_size``, by default torchrun's ``RANK`` and ``WORLD_SIZE``."""
    rank = env_int("RANK", 0) if given["rank"] is None else given["rank"]
    world = env_int("WORLD_SIZE", 1) if given["world_size"] is None else given["world_size"]
    rank, world = _check("rank", rank), _check("world_size", world)
    if not 0 <= rank < world:
        raise ConfigError(f"rank {rank} is not in range for world_size {world}")
    return rank, world


def _batching(given: Mapping[str, Any], shuffle: bool, drop_last: bool) -> tuple[int | None, bool]:
    """``batch_size`` (None with a batch_sampler, or unbatched), and whether the loader is unbatched."""
    batch_size, sampler = given["batch_size"], given["sampler"]
    if given["batch_sampler"] is not None:
        if sampler is not None or shuffle or drop_last or batch_size not in (None, 1):
            raise ConfigError("batch_sampler is mutually exclusive with batch_size, shuffle, sampler and drop_last")
        return None, False
    if sampler is not None and shuffle:
        raise ConfigError("sampler is mutually exclusive with shuffle")
    if batch_size is None:  # DataLoader's unbatched mode: each sample as it is, one task each
        if drop_last:
            raise ConfigError("batch_size=None option disables auto-batching and is mutually exclusive with "
                              "drop_last")
        return None, True
    return _check("batch_size", batch_size), False


def _iterable_streams(given: Mapping[str, Any], dataset: Any, local: LocalOptions | None,
                      shuffle: bool) -> int | None:
    """``iterable_streams``: as given, else ``local_producers``, else 1; None with ``local_producers="auto"``, which
    an iterable dataset refuses. A dataset object that is an iterable dataset takes no ``shuffle``, ``sampler`` or
    ``batch_sampler`` (a spec's kind is known only from its producers: the planner checks it then)."""
    from ferry.common.streamplan import AUTOSCALED, check_iterable_options, is_iterable

    streams = _check("iterable_streams", given["iterable_streams"])
    auto = local is not None and local.count == AUTO
    if dataset is not None and not isinstance(dataset, str):
        if is_iterable(dataset):
            check_iterable_options(shuffle=shuffle, sampler=given["sampler"], batch_sampler=given["batch_sampler"])
            if auto:
                raise ConfigError(AUTOSCALED)
        elif streams is not None:
            raise ConfigError(f"iterable_streams applies to an IterableDataset, and {type(dataset).__name__} is not "
                              "one")
    if auto:
        return None
    if streams is not None:
        return streams
    return local.count if local is not None else 1


def _seed(given: Mapping[str, Any]) -> tuple[int, Any]:
    """``seed``, or one drawn from ``generator``; not both. With a generator also its state before the draw, from
    which the shuffle replays DataLoader's draws (:class:`ferry.common.plan.GeneratorOrder`).

    The one draw is DataLoader's first from its generator (its workers' base seed, at its first ``iter()``): the
    loader's ``seed`` and its local producers' base seed (consumer/pipeline.py).
    """
    generator = _check("generator", given["generator"])
    if generator is None:
        return _check("seed", given["seed"]), None
    if given["seed"] is not UNSET:
        raise ConfigError("seed= and generator= both given: the shuffle seed comes from one of them")
    import torch

    state = generator.get_state()  # a copy
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()), state


def _local(given: Mapping[str, Any], dataset: Any) -> LocalOptions | None:
    """The local producers, if any: ``local=`` or ``local_producers=N`` or ``"auto"`` (0: none, the other flat
    keywords ignored, but for the hooks and the bounds of "auto", which would be lost)."""
    count = given["local_producers"]
    if count is not UNSET and given["local"] is None:  # the flat count's own rule: 0 is no local mode
        count = ProducerCount(0).check("local_producers", count)
    if given["local"] is None and count in (UNSET, 0):
        for name in ("local_producers_min", "local_producers_max"):
            if given[name] not in (UNSET, None):
                raise ConfigError(f'{name} bounds local_producers="auto", which is not given')
        if given["mp_context"] not in (UNSET, None):
            raise ConfigError(f"mp_context applies to local producers (local_producers=N), and this loader starts "
                              f"none (local_producers={0 if count is UNSET else count}): nothing would use "
                              f"mp_context={given['mp_context']!r} (DataLoader refuses multiprocessing_context "
                              f"with num_workers=0 too)")
        for name, flag in (("collate_fn", "--collate package.module:function"),
                           ("seed_per_sample", "--seed-per-sample 0|1"),
                           ("producer_init", "--init package.module:function"),
                           ("collate_args", "--collate-arg KEY=VALUE"),
                           ("producer_transform_args", "--transform-arg KEY=VALUE")):
            if given[name] is not UNSET and given[name] not in (None, {}):
                raise ConfigError(f"{name} applies to local producers (local_producers=N); producers on other "
                                  f"hosts take {flag}")
        return None
    if dataset is None:
        raise ConfigError("local_producers needs a dataset (an object or a spec string)")
    return LocalOptions.from_flat(given, given["local"], "local")


def _curve(given: Mapping[str, Any], local: LocalOptions | None,
           environ: Mapping[str, str] | None = None) -> CurveOptions | None:
    keys = [given[k] not in (UNSET, None, "") for k in ("curve_secret_key", "curve_authorized_keys")]
    if given["curve"] is None and not any(keys) and local is None and given["curve_secret_key"] is UNSET:
        # not given in the script: an engine's files may turn CURVE on (FERRY_CURVE_*), as FERRY_ENDPOINT binds
        env = os.environ if environ is None else environ
        found = {k: env.get(v, "").strip() for k, v in CURVE_ENV.items()}
        if any(found.values()):
            missing = [CURVE_ENV[k] for k, v in found.items() if not v]
            if missing:
                raise ConfigError(f"CURVE from the environment needs both {' and '.join(CURVE_ENV.values())}; "
                                  f"{missing[0]} is not set")
            return CurveOptions(secret_key=found["curve_secret_key"], authorized_keys=found["curve_authorized_keys"])
    if given["curve"] is None and not any(keys):
        return None
    if given["curve"] is None and not all(keys):
        raise ConfigError("CURVE needs both curve_secret_key and curve_authorized_keys")
    curve = CurveOptions.from_flat(given, given["curve"], "curve")
    if local is not None:
        raise ConfigError("CURVE and local_producers cannot be combined: local producers connect over "
                          "ipc://, which never leaves this machine; use CURVE for remote producers")
    return curve


def resolve_options(given: Mapping[str, Any]) -> LoaderOptions:
    """Check every keyword of ``RemoteLoader(...)`` (as given, UNSET where not) and resolve them.

    Raises:
        ConfigTypeError: an option of the wrong type (also a TypeError).
        ConfigError: an option out of range, a bad combination, or one option given twice (a ValueError).
    """
    shuffle = bool(_check("shuffle", given["shuffle"]))  # None: False
    alone = {name: _check(name, given[name]) for name in _CHECKED_ALONE}
    alone["metrics_port"] = _metrics_port(alone["metrics_port"])
    alone["timeout"] = alone["timeout"] or 0.0  # None: no limit, as 0
    batch_size, unbatched = _batching(given, shuffle, alone["drop_last"])
    local = _local(given, alone["dataset"])
    iterable_streams = _iterable_streams(given, alone["dataset"], local, shuffle)
    curve = _curve(given, local)
    rank, world_size = _sharding(given)
    (endpoints, shared_endpoints), no_producer_timeout = (_endpoints(given, local is not None, curve is not None),
                                                          _no_producer_timeout(given))
    transport = TransportOptions.from_flat(given, given["transport"], "transport")
    seed, generator_state = _seed(given)  # last: a generator is drawn from only once every option is good
    return LoaderOptions(
        **alone, endpoints=endpoints, batch_size=batch_size, unbatched=unbatched, shuffle=shuffle, seed=seed,
        generator=given["generator"],
        generator_state=generator_state, rank=rank, world_size=world_size, no_producer_timeout=no_producer_timeout,
        device=given["device"], local=local, curve=curve, transport=transport, iterable_streams=iterable_streams,
        shared_endpoints=shared_endpoints,
    )


def warn_unknown_environment() -> None:
    """A WARNING (logger ``ferry.consumer``), once per process, for each ``FERRY_*`` variable of the environment
    that no part of Ferry reads, naming the closest known one: a misspelled ``FERRY_CURVE_SECRET_KEY`` would
    otherwise leave the loader in plaintext without a word (:mod:`ferry.common.variables`)."""
    from ferry.producer.config import LOG_LEVEL, PRODUCER_ENV  # local producers inherit this environment

    own = LOADER_VARIABLES | {LOG_LEVEL.variable}  # the level of its local producers (launchers.py)
    warn_unknown_variables(logging.getLogger("ferry.consumer"), "loader", own, OTHER_VARIABLES | set(PRODUCER_ENV))


def warn_excessive_producers(local: LocalOptions | None, stacklevel: int) -> None:
    """A UserWarning when ``local`` starts more producer processes than the CPUs this process may use, as
    DataLoader warns about ``num_workers`` (``check_worker_number_rationality``). ``stacklevel`` as for
    :func:`warnings.warn`: the caller's caller's line is the script's ``RemoteLoader(...)``."""
    if local is None:
        return
    auto = local.count == AUTO  # then the most it may start: its max (None: fewer than the CPUs, no warning)
    most = local.max if auto else local.count
    if most is None:
        return
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = len(affinity(0)) if affinity is not None else os.cpu_count()
    if cpus is not None and most <= cpus:
        return
    usable = ("the number of CPUs is not known" if cpus is None else f"this process may use {cpus} CPU(s)"
              + ("" if affinity is not None else " (cpuset not taken into account)"))
    start, knob = (f"may start up to {most}", "local_producers_max") if auto else (f"will start {most}",
                                                                                   "local_producers")
    threads = (f"{DEFAULT_THREADS} loading threads for a built-in dataset, 1 for a class of your own"
               if local.threads is None else f"{local.threads} loading threads")
    warnings.warn(f"This RemoteLoader {start} local producer processes, and {usable}. Please be "
                  f"aware that excessive producer creation might make loading slow or even freeze it; lower "
                  f"{knob} if necessary (each producer also runs {threads}).",
                  UserWarning, stacklevel=stacklevel + 1)

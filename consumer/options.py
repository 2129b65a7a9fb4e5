"""RemoteLoader's options: the groups a user may pass, their checks, and the resolution of the flat keywords.

The DataLoader-shaped options stay flat keywords (``batch_size``, ``shuffle``, ``sampler`` …). Three groups
of options that belong together are small frozen dataclasses, checked when they are built (they live in
:mod:`ferry.consumer.option_groups` and are re-exported here):

* :class:`LocalOptions` (``local=``): producer processes that the loader starts on this machine;
* :class:`TransportOptions` (``transport=``): heartbeats, liveness, the task timeout and the message bound;
* :class:`CurveOptions` (``curve=``): encryption and authentication of remote producers.

Each group field has a flat keyword too (``local_producers``, ``heartbeat``, ``curve_secret_key`` …), the
shorthand that has always worked. A group and one of its flat keywords together are a :class:`ConfigError`:
one option, one place. :func:`resolve_options` checks everything before the loader starts any thread or
process; this module never imports torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Callable

from ferry.common import validate as check
from ferry.common.constants import DEFAULT_ENDPOINT, DEFAULT_TIMEOUT_S
from ferry.common.errors import ConfigError, ConfigTypeError
from ferry.common.endpoints import shift_port
from ferry.consumer.option_groups import UNSET, CurveOptions, LocalOptions, TransportOptions

__all__ = ["LocalOptions", "TransportOptions", "CurveOptions", "LoaderOptions", "resolve_options", "UNSET"]


_MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed's range
_MIN_SEED = -(2**63)


@dataclass(frozen=True)
class LoaderOptions:
    """Every option of a RemoteLoader, checked and resolved (environment, defaults, groups)."""

    endpoints: tuple[str, ...]  # to bind, before local mode adds its ipc socket; LOCAL_RANK applied
    batch_size: int | None
    shuffle: bool
    seed: int
    drop_last: bool
    generator: Any  # a torch.Generator: the producers' base seed is drawn from it (else from torch's RNG)
    sampler: Any
    batch_sampler: Any
    rank: int
    world_size: int
    buffer_batches: int
    in_order: bool
    no_producer_timeout: float  # math.inf: wait forever
    dataset_len: int | None
    device: Any
    pin_memory: bool | None
    device_transform: Callable[[Any], Any] | None
    dataset: Any
    dataset_args: dict[str, Any] | None
    on_error: str
    log_every: float | None
    metrics_port: int | None
    local: LocalOptions | None
    transport: TransportOptions
    curve: CurveOptions | None


def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """An integer environment variable (torchrun's RANK, WORLD_SIZE, LOCAL_RANK), read when called."""
    value = (os.environ if environ is None else environ).get(name, "")
    if value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def _endpoints(endpoint: Any, local: bool) -> tuple[str, ...]:
    """What to bind: the default (none in local mode, whose ipc socket is added later), or the given ones."""
    if endpoint is None:
        return ()
    if endpoint is UNSET:
        return () if local else (shift_port(DEFAULT_ENDPOINT, env_int("LOCAL_RANK", 0)),)
    given = [endpoint] if isinstance(endpoint, str) else endpoint
    if not isinstance(given, (list, tuple)) or not all(isinstance(e, str) and e for e in given):
        raise ConfigTypeError(f"endpoint must be a string like tcp://*:5555, a list of them, or None; got {endpoint!r}")
    local_rank = env_int("LOCAL_RANK", 0)
    return tuple(shift_port(e, local_rank) for e in given)


def _no_producer_timeout(given: Mapping[str, Any]) -> float:
    """``no_producer_timeout`` or its old name ``timeout``; None or 0 wait forever (math.inf)."""
    named = {k: given[k] for k in ("no_producer_timeout", "timeout") if given[k] is not UNSET}
    if len(named) == 2:
        raise ConfigError("timeout= and no_producer_timeout= both given: they are one option (timeout is the "
                          "old name); give no_producer_timeout")
    name, value = next(iter(named.items()), ("timeout", DEFAULT_TIMEOUT_S))
    if value is None:
        return math.inf
    value = check.number(name, value, low=0, finite=False)
    return math.inf if value == 0 else value


def _iterable(name: str, value: Any) -> Any:
    if value is not None and not isinstance(value, Iterable):
        raise ConfigTypeError(f"{name} must be an iterable of sample indices (a torch Sampler, a list …), "
                              f"got {value!r} ({type(value).__name__})")
    return value


def _dataset(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    from ferry.common.shardplan import check_sharded, looks_streaming

    if looks_streaming(value):  # a stream of shards (common/shardplan.py), or an error naming the two methods
        check_sharded(value)
        return value
    if not (hasattr(value, "__len__") and hasattr(value, "__getitem__")):
        raise ConfigTypeError(f"dataset must be a spec string or a map-style dataset (with __len__ and "
                              f"__getitem__), got {value!r} ({type(value).__name__})")
    return value


def _sharding(given: Mapping[str, Any]) -> tuple[int, int]:
    rank = env_int("RANK", 0) if given["rank"] is None else check.integer("rank", given["rank"], low=0)
    world = env_int("WORLD_SIZE", 1) if given["world_size"] is None else given["world_size"]
    world = check.integer("world_size", world, low=1)
    if not 0 <= rank < world:
        raise ConfigError(f"rank {rank} is not in range for world_size {world}")
    return rank, world


def _batching(given: Mapping[str, Any]) -> int | None:
    batch_size, sampler = given["batch_size"], given["sampler"]
    if given["batch_sampler"] is not None:
        if sampler is not None or given["shuffle"] or given["drop_last"] or batch_size not in (None, 1):
            raise ConfigError("batch_sampler is mutually exclusive with batch_size, shuffle, sampler and drop_last")
        return None
    if batch_size is None:
        raise ConfigError("batch_size=None (DataLoader's unbatched mode) is not supported: Ferry always sends "
                          "batches. Use batch_size=1 and take sample [0] of each, or give a batch_sampler")
    batch_size = check.integer("batch_size", batch_size, low=1)
    if sampler is not None and given["shuffle"]:
        raise ConfigError("sampler is mutually exclusive with shuffle")
    return batch_size


#: DataLoader's options that Ferry does not take, and what to use instead.
DATALOADER_ONLY = {
    "num_workers": "producers do the loading: local_producers=N on this machine, or python -m ferry.producer "
                   "processes anywhere",
    "prefetch_factor": "buffer_batches bounds the batches buffered and in flight, over all producers",
    "persistent_workers": "producers are always persistent: they live as long as the loader (or longer)",
    "worker_init_fn": "producer_init= (local producers) or --init package.module:fn (producers by hand)",
    "multiprocessing_context": "mp_context=",
    "pin_memory_device": "device= (with pin_memory=True)",
}


def check_unknown_keywords(extra: Mapping[str, Any]) -> None:
    """Keywords RemoteLoader does not take: DataLoader's get a pointer to Ferry's own; others a TypeError."""
    for name in extra:
        advice = DATALOADER_ONLY.get(name)
        if advice:
            raise ConfigError(f"RemoteLoader does not take DataLoader's {name}=: {advice}")
        raise ConfigTypeError(f"RemoteLoader() got an unexpected keyword argument {name!r}")


def _seed(given: Mapping[str, Any]) -> int:
    """``seed``, or one drawn from ``generator`` as DataLoader draws its shuffle from it; not both."""
    generator, seed = given["generator"], given["seed"]
    if generator is None:
        return 0 if seed is UNSET else check.integer("seed", seed, low=_MIN_SEED, high=_MAX_SEED)
    import torch

    if not isinstance(generator, torch.Generator):
        raise ConfigTypeError(f"generator must be a torch.Generator, got {generator!r} ({type(generator).__name__})")
    if seed is not UNSET:
        raise ConfigError("seed= and generator= both given: the shuffle seed comes from one of them")
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def resolve_options(given: Mapping[str, Any]) -> LoaderOptions:
    """Check every keyword of ``RemoteLoader(...)`` (as given, UNSET where not) and resolve them.

    Raises:
        ConfigTypeError: an option of the wrong type (also a TypeError).
        ConfigError: an option out of range, a bad combination, or one option given twice (a ValueError).
    """
    shuffle = False if given["shuffle"] is None else check.boolean("shuffle", given["shuffle"])
    drop_last = check.boolean("drop_last", given["drop_last"])
    batch_size = _batching({**given, "shuffle": shuffle, "drop_last": drop_last})
    dataset = _dataset(given["dataset"])
    local, count = None, given["local_producers"]
    if count is not UNSET and given["local"] is None:
        count = check.integer("local_producers", count, low=0)  # 0: no local mode, its other keywords ignored
    if given["local"] is not None or count not in (UNSET, 0):
        local = LocalOptions.from_flat(given, given["local"], "local")
        if dataset is None:
            raise ConfigError("local_producers needs a dataset (an object or a spec string)")
    else:
        for name, flag in (("collate_fn", "--collate"), ("producer_init", "--init")):
            if given[name] not in (UNSET, None):
                raise ConfigError(f"{name} applies to local producers (local_producers=N); producers on other "
                                  f"hosts take {flag} package.module:function")
    curve = None
    keys = [given[k] not in (UNSET, None, "") for k in ("curve_secret_key", "curve_authorized_keys")]
    if given["curve"] is not None or any(keys):
        if given["curve"] is None and not all(keys):
            raise ConfigError("CURVE needs both curve_secret_key and curve_authorized_keys")
        curve = CurveOptions.from_flat(given, given["curve"], "curve")
        if local is not None:
            raise ConfigError("CURVE and local_producers cannot be combined: local producers connect over "
                              "ipc://, which never leaves this machine; use CURVE for remote producers")
    device_transform = given["device_transform"]
    if device_transform is not None and not callable(device_transform):
        raise ConfigTypeError(f"device_transform must be callable, got {device_transform!r}")
    dataset_args = given["dataset_args"]
    if dataset_args is not None and not isinstance(dataset_args, Mapping):
        raise ConfigTypeError(f"dataset_args must be a dict of keyword arguments, got {dataset_args!r}")
    rank, world_size = _sharding(given)
    return LoaderOptions(
        endpoints=_endpoints(given["endpoint"], local is not None),
        batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
        seed=_seed(given), generator=given["generator"],
        sampler=_iterable("sampler", given["sampler"]), batch_sampler=_iterable("batch_sampler", given["batch_sampler"]),
        rank=rank, world_size=world_size,
        buffer_batches=check.integer("buffer_batches", given["buffer_batches"], low=1),
        in_order=check.boolean("in_order", given["in_order"]),
        no_producer_timeout=_no_producer_timeout(given),
        dataset_len=check.optional(check.integer, "dataset_len", given["dataset_len"], low=0),
        device=given["device"],
        pin_memory=check.optional(check.boolean, "pin_memory", given["pin_memory"]),
        device_transform=device_transform, dataset=dataset,
        dataset_args=dict(dataset_args) if dataset_args is not None else None,
        on_error=check.choice("on_error", given["on_error"], ("raise", "skip")),
        log_every=check.optional(check.number, "log_every", given["log_every"], low=0),
        metrics_port=check.optional(check.integer, "metrics_port", given["metrics_port"], low=0, high=65535) or None,
        local=local, transport=TransportOptions.from_flat(given, given["transport"], "transport"), curve=curve,
    )

"""RemoteLoader's own keywords, each declared once: its kind (type and bounds) and its doc.

A keyword's name and default are those of ``RemoteLoader.__init__``'s signature, which is what a user sees in
``help()``; where the signature says ``UNSET`` (the loader must know whether it was given) the default is the
declaration's. :func:`document_keywords` writes the loader's ``Args:`` from these declarations, the signature
and the option groups (whose flat keywords are declared in :mod:`ferry.consumer.options.groups`). This module
never imports torch.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from ferry.common import settings as s
from ferry.common.constants import (
    DEFAULT_CURVE_ENDPOINT, DEFAULT_ENDPOINT, DEFAULT_TIMEOUT_S, MAX_SEED, MAX_STREAMS, MIN_SEED,
)
from ferry.common.endpoints import tcp_address
from ferry.common.errors import ConfigError, ConfigTypeError
from ferry.common.settings import Setting

from ferry.consumer.options.groups import UNSET, CurveOptions, LocalOptions, TransportOptions

__all__ = ["KEYWORDS", "DATALOADER_ONLY", "check_unknown_keywords", "document_keywords"]


class _Endpoints(s.Kind):
    def check(self, name: str, value: Any) -> Any:
        given = [value] if isinstance(value, str) else value
        if not isinstance(given, (list, tuple)) or not all(isinstance(e, str) and e for e in given):
            raise ConfigTypeError(f"{name} must be a string like tcp://*:5555, a list of them, or None; got {value!r}")
        for endpoint in given:  # libzmq would bind a port above 65535 modulo 65536, and say nothing
            address = tcp_address(endpoint)
            if address is not None and address[1] > 65535:
                raise ConfigError(f"{name} {endpoint!r}: port {address[1]} is out of range (1-65535)")
        return tuple(given)


class _Indices(s.Kind):
    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, Iterable):
            raise ConfigTypeError(f"{name} must be an iterable of sample indices (a torch Sampler, a list …), "
                                  f"got {value!r} ({type(value).__name__})")
        return value


class _Callable(s.Kind):
    def check(self, name: str, value: Any) -> Any:
        if not callable(value):
            raise ConfigTypeError(f"{name} must be callable, got {value!r}")
        return value


class _KeywordArguments(s.Kind):
    def check(self, name: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ConfigTypeError(f"{name} must be a dict of keyword arguments, got {value!r}")
        return dict(value)


class _Dataset(s.Kind):
    """A spec string, a map-style dataset, a stream of shards (common/shardplan.py) or an iterable dataset
    (common/streamplan.py)."""

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, str):
            return value
        from ferry.common.shardplan import check_sharded, looks_streaming
        from ferry.common.streamplan import check_iterable, is_iterable

        if is_iterable(value):  # read as DataLoader's workers read it, one copy per stream
            check_iterable(value)
            return value
        if looks_streaming(value):  # a stream of shards, or an error naming the method it lacks
            check_sharded(value)
            return value
        if not (hasattr(value, "__len__") and hasattr(value, "__getitem__")):
            raise ConfigTypeError(f"{name} must be a spec string or a map-style dataset (with __len__ and "
                                  f"__getitem__), got {value!r} ({type(value).__name__})")
        return value


class _Generator(s.Kind):
    def check(self, name: str, value: Any) -> Any:
        import torch

        if not isinstance(value, torch.Generator):
            raise ConfigTypeError(f"{name} must be a torch.Generator, got {value!r} ({type(value).__name__})")
        return value


_NO_PRODUCER_TIMEOUT = Setting(
    s.Real(0, finite=False), "seconds without any live producer before ``__next__`` raises NoProducersError; "
    "``None`` or 0: wait forever. It counts only while no producer is alive: a slow batch from a live producer "
    "never ends it (``timeout`` bounds each batch, ``task_timeout`` a producer's hold on one task). It also "
    "fires when no batch arrives for that long while producers keep joining and leaving, and it bounds the "
    "wait for the first producer's dataset length (``iter()``, ``len()``).", DEFAULT_TIMEOUT_S, unit="second",
    optional=True)

_TIMEOUT = Setting(
    s.Real(0, finite=False), "DataLoader's ``timeout``: how long each ``__next__`` waits for its batch before it "
    "raises BatchTimeoutError (a RuntimeError, as DataLoader's \"timed out after N seconds\"). The batch is not "
    "lost: the next call waits for it again. It counts from the call, whether producers are alive or not; "
    "``None`` or 0: no limit. Before this meaning it was the old name of ``no_producer_timeout``.",
    0, unit="second", optional=True)

#: Every keyword of ``RemoteLoader`` but the groups' flat ones, in the signature's order.
KEYWORDS: dict[str, Setting] = {
    "endpoint": Setting(_Endpoints(), "where the consumer binds its ROUTER, or a list of them. Not given: the "
                        "environment's ``FERRY_ENDPOINT`` (comma-separated), so that an engine's files can set it "
                        f"without editing the script; else ``{DEFAULT_ENDPOINT}`` (this machine only; with CURVE "
                        f"``{DEFAULT_CURVE_ENDPOINT}``: never every interface without authentication), and in local "
                        "mode only the private ipc socket. None: bind nothing else. A tcp port is shifted by "
                        "``LOCAL_RANK`` under torchrun; without ``endpoint=``, a process's second loader binds the "
                        "next free slot (the port plus ``LOCAL_WORLD_SIZE``, logged), so that train and val loaders "
                        "never collide.", optional=True),
    "batch_size": Setting(s.Int(1), "samples per batch. None (without a ``batch_sampler``): DataLoader's unbatched "
                          "mode, each sample on its own, as ``default_convert`` leaves it (or through "
                          "``collate_fn``); a sampler may then yield lists of indices, each passed to the "
                          "dataset whole."),
    "shuffle": Setting(s.Bool(), "shuffle with DistributedSampler's permutation (seed + epoch).", optional=True),
    "seed": Setting(s.Int(MIN_SEED, MAX_SEED), "the shuffle seed. ``sample_info().seed`` on the producers derives "
                    "from it too.", 0),
    "drop_last": Setting(s.Bool(), "drop the tail that does not fill a batch (and the uneven tail across ranks)."),
    "generator": Setting(_Generator(), "a ``torch.Generator``, instead of ``seed``: with ``shuffle=True`` each "
                         "epoch's order is the one ``DataLoader(shuffle=True, generator=g)`` draws in that epoch "
                         "(replayed from ``g``'s state when the loader is built, so ``set_epoch`` and a resume give "
                         "it too). The loader draws one number from ``g`` when it is built (DataLoader's first "
                         "draw): its ``seed`` and the local producers' base seed. See docs/porting.md.",
                         optional=True),
    "sampler": Setting(_Indices(), "a torch sampler (or any iterable of indices) instead of the default plan. One "
                       "with ``set_epoch`` gets each epoch's number before it is planned; an epoch the script gave "
                       "it itself (``sampler.set_epoch(e)``, read from its ``epoch`` as DistributedSampler keeps it) "
                       "is the epoch planned, and one that conflicts with ``loader.set_epoch`` or "
                       "``load_state_dict`` is a ConfigError naming both.",
                       optional=True),
    "batch_sampler": Setting(_Indices(), "an iterable of index lists, used as given; excludes batch_size / sampler "
                             "/ shuffle / drop_last.", optional=True),
    "rank": Setting(s.Int(0), "this trainer's shard. Default: torchrun's RANK, else 0.", optional=True),
    "world_size": Setting(s.Int(1), "the number of shards. Default: torchrun's WORLD_SIZE, else 1.", optional=True),
    "buffer_batches": Setting(s.Int(1), "capacity C. Batches buffered + tasks in flight never exceed it."),
    "in_order": Setting(s.Bool(), "True: yield in plan order; False: as batches arrive."),
    "no_producer_timeout": _NO_PRODUCER_TIMEOUT,
    "timeout": _TIMEOUT,
    "dataset": Setting(_Dataset(), "a dataset object or a spec string (see ``ferry.common.datasets``), served by "
                       "local producers. Without them it says what remote producers must serve: an object gives the "
                       "dataset length and its fingerprint, a spec admits only producers announcing that spec (the "
                       "first one sets the length and fingerprint; ``dataset_args`` are not compared). Others are "
                       "refused for good, with the reason. A *sharded* dataset (``shards()`` and "
                       "``iter_shard(name)``, optionally ``shard_len(name)`` and ``shuffle_buffer``) is planned over "
                       "its shards: see ``ferry.common.shardplan`` and docs/datasets.md; ``len()`` then needs "
                       "``shard_len``, else raises TypeError. A torch ``IterableDataset`` without them is iterated "
                       "as DataLoader's workers iterate it, one copy per stream (``iterable_streams``), batches "
                       "interleaved in DataLoader's order: see ``ferry.common.streamplan``.", optional=True),
    "dataset_args": Setting(_KeywordArguments(), "keyword arguments of a dataset spec.", optional=True),
    "dataset_len": Setting(s.Int(0), "the dataset length, if known up front (else learned from the first producer).",
                           optional=True),
    "iterable_streams": Setting(s.Int(1, MAX_STREAMS), "how many streams an IterableDataset is split into, as "
                                "DataLoader's ``num_workers``: stream ``w`` is one copy of the dataset iterated while "
                                "``get_worker_info()`` reports ``id=w, num_workers=N``, and batches come round robin "
                                "over the streams. Default: ``local_producers``, else 1. A producer started as worker "
                                "``w`` of N (local producers; ``FERRY_WORKER=w/N`` by hand) serves only stream ``w``; "
                                "others serve any stream. Only for an IterableDataset.", optional=True),
    "device": Setting(s.Kind(), "``None`` / ``\"cpu\"`` (tensors over the received bytes, no copy) or a CUDA "
                      "device; another kind (mps, xpu) is refused: move batches to it in device_transform.",
                      optional=True),
    "pin_memory": Setting(s.Bool(), "stage through page-locked memory. Default: True on CUDA, False otherwise.",
                          optional=True),
    "device_transform": Setting(_Callable(), "a callable applied to each batch on the device, in the training "
                                "thread.", optional=True),
    "on_error": Setting(s.Choice(("raise", "skip")), "``\"raise\"`` (RemoteSampleError in the loop) or "
                        "``\"skip\"`` (drop the failed samples)."),
    "log_every": Setting(s.Real(0), "seconds between one-line progress logs (logger ``ferry.consumer``, INFO); "
                         "None: never. An epoch's diagnosis is logged only when it has something to act on: at INFO for a "
                         "data-bound epoch (stall above 10 %, 20 batches or more, steps of 1 ms or more), at WARNING "
                         "when that lasts two epochs in a row, else at DEBUG (see "
                         ":mod:`ferry.consumer.figures.diagnosis`; ``diagnosis()`` gives it any time).",
                         unit="second", optional=True),
    "metrics_port": s.METRICS_PORT,
    "local": Setting(s.Kind(), "a :class:`LocalOptions`: start producer processes here (local mode). Needs "
                     "``dataset``.", optional=True),
    "transport": Setting(s.Kind(), "a :class:`TransportOptions`: heartbeats, liveness, the task timeout, the batch "
                         "size bound, compression (``stats()`` counts ``compressed_bytes`` and "
                         "``uncompressed_bytes``).", optional=True),
    "curve": Setting(s.Kind(), "a :class:`CurveOptions`: encrypt, and let in only authorized producers. Not given "
                     "(nor its flat keywords), outside local mode: ``FERRY_CURVE_SECRET_KEY`` and "
                     "``FERRY_CURVE_AUTHORIZED_KEYS`` from the environment turn it on, so that an engine's files can "
                     "(deploy/).", optional=True),
}

_GROUPS = {"local": LocalOptions, "transport": TransportOptions, "curve": CurveOptions}

#: DataLoader's options that Ferry does not take, and what to use instead.
DATALOADER_ONLY = {
    "num_workers": "producers do the loading: local_producers=N on this machine, or python -m ferry.producer "
                   "processes anywhere",
    "prefetch_factor": "buffer_batches bounds the batches buffered and in flight, over all producers (each "
                       "producer also takes tasks ahead of its slots: producer_ahead=, --ahead)",
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
            raise ConfigError(f"RemoteLoader does not take DataLoader's {name}=: {advice}; or port with `from ferry "
                              f"import DataLoader`, which takes {name}= with its DataLoader meaning (docs/porting.md)")
        raise ConfigTypeError(f"RemoteLoader() got an unexpected keyword argument {name!r}")


def document_keywords(cls: type) -> type:
    """Class decorator: an ``Args:`` entry per keyword of ``cls.__init__`` in ``cls``'s docstring (before its
    ``Raises:``), from its declaration's doc, the signature's default and, for a group, its flat keywords."""
    signature = inspect.signature(cls.__init__).parameters
    intro, raises, after = inspect.cleandoc(cls.__doc__ or "").partition("Raises:")
    lines = [intro.rstrip(), "", "Args:"]
    for name, setting in KEYWORDS.items():
        default = signature[name].default
        shown = setting if default is UNSET else Setting(setting.kind, setting.doc, default, setting.unit)
        text = f"{name}: {shown.describe()}"
        if name in _GROUPS:
            flat = ", ".join(f"``{k}``" + (f" ({f})" if f != k else "") for k, f in _GROUPS[name].flat_keywords().items())
            text += f" Flat shorthand, one keyword per field: {flat}."
        lines += textwrap.wrap(text, 110, initial_indent="    ", subsequent_indent="        ")
    lines += ["", "Each flat shorthand means the group's field; a group and one of its flat keywords together are a",
              "ConfigError.", ""]
    cls.__doc__ = "\n".join(lines) + ("\n" + raises + after if raises else "")
    return cls

"""Ferry: distributed data loading for PyTorch.

Producers (``python -m ferry.producer``) read and collate batches on any machine and stream them over
ZeroMQ to :class:`RemoteLoader`, a bounded, staged iterator inside the training script.

The public API is this module: ``from ferry import DataLoader`` (torch's DataLoader, one import to port:
docs/porting.md), ``from ferry import RemoteLoader``, its option groups (``LocalOptions``,
``TransportOptions``, ``CurveOptions``), the error types below, :func:`register_batch_type` (a batch class of your
own over the network), and :func:`keep_freed_memory`, the one process-wide setting Ferry offers a training script
(a loader never changes its process's settings itself).
Importing ``ferry`` does not import torch (the producer image has none): ``DataLoader`` and ``RemoteLoader`` are
loaded on first use.
"""

from __future__ import annotations

from typing import Any

from ferry.common.batch_types import register_batch_type
from ferry.common.heap import keep_freed_memory
from ferry.common.sampleinfo import SampleInfo, sample_info
from ferry.common.errors import (
    ConfigError,
    ConfigTypeError,
    DatasetError,
    DatasetOpenError,
    BatchTimeoutError,
    BatchTooLarge,
    BatchTypeError,
    CollateError,
    DatasetSpecError,
    FerryError,
    FerryThreadError,
    LoaderClosedError,
    MissingExtraError,
    NoProducersError,
    ProducerDiedError,
    ProducerExitError,
    ProducerStartupError,
    PoisonTaskError,
    ProtocolError,
    RelayError,
    RemoteSampleError,
    SampleIndexError,
    SampleLoadError,
    VersionMismatch,
)
from ferry.consumer.options import CurveOptions, LocalOptions, TransportOptions

__all__ = [
    "DataLoader",
    "RemoteLoader",
    "sample_info",
    "SampleInfo",
    "keep_freed_memory",
    "register_batch_type",
    "LocalOptions",
    "TransportOptions",
    "CurveOptions",
    "FerryError",
    "FerryThreadError",
    "LoaderClosedError",
    "ConfigError",
    "ConfigTypeError",
    "DatasetSpecError",
    "DatasetOpenError",
    "DatasetError",
    "SampleLoadError",
    "MissingExtraError",
    "NoProducersError",
    "BatchTimeoutError",
    "ProducerDiedError",
    "ProducerExitError",
    "ProducerStartupError",
    "ProtocolError",
    "RemoteSampleError",
    "SampleIndexError",
    "PoisonTaskError",
    "BatchTooLarge",
    "BatchTypeError",
    "CollateError",
    "VersionMismatch",
    "RelayError",
]


def __getattr__(name: str) -> Any:
    if name == "RemoteLoader":  # lazily: it imports torch
        from ferry.consumer.loader import RemoteLoader

        return RemoteLoader
    if name == "DataLoader":  # lazily too: torch's DataLoader signature, Ferry's producers (docs/porting.md)
        from ferry.consumer.dataloader import DataLoader

        return DataLoader
    raise AttributeError(f"module 'ferry' has no attribute {name!r}")

"""Ferry's consumer: :class:`RemoteLoader`, the iterator inside the training script, and its option groups.

See :mod:`ferry.consumer.loader` for its lifecycle, threads and shutdown order. ``RemoteLoader`` is loaded on
first use (it imports torch); the option groups of :mod:`ferry.consumer.options` need no torch.
"""

from __future__ import annotations

from typing import Any

from ferry.common.errors import NoProducersError, RemoteSampleError

from ferry.consumer.options import CurveOptions, LocalOptions, TransportOptions

__all__ = ["RemoteLoader", "RemoteSampleError", "NoProducersError", "LocalOptions", "TransportOptions",
           "CurveOptions"]


def __getattr__(name: str) -> Any:
    if name == "RemoteLoader":  # lazily: it imports torch
        from ferry.consumer.loader import RemoteLoader

        return RemoteLoader
    raise AttributeError(f"module 'ferry.consumer' has no attribute {name!r}")

"""Batches as tensors on the CPU: each array leaf a tensor over the memory it arrived in (no copy), a leaf that
came in several frames assembled into a reused host buffer (:class:`~ferry.consumer.staging.hostpool.HostPool`), or
with ``pin_memory=True`` a page-locked copy, as ``DataLoader(pin_memory=True)`` makes. The tree walks here are shared
with the CUDA stager (:mod:`ferry.consumer.staging.cuda`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ferry.common.arrays import Chunked
from ferry.common.tree import iter_leaves, map_tree

from ferry.consumer.core import Delivery
from ferry.consumer.staging.hostpool import HostPool

__all__ = ["CpuStager", "map_arrays", "pinned", "iter_tensors", "is_assembled"]


def is_assembled(leaf: Any) -> bool:
    """A leaf the receiver assembles (:class:`Chunked`, or anything with its ``assemble_into``, such as a
    compressed leaf decoded lazily) rather than an array over received memory."""
    return hasattr(leaf, "assemble_into")


def map_arrays(tree: Any, fn: Callable[[np.ndarray | Chunked], torch.Tensor],
               other: Callable[[Any], Any] | None = None) -> Any:
    """The tree with ``fn(leaf)``, a tensor, in place of each array leaf (and ``other(leaf)`` in place of every
    other leaf, where given). A bfloat16 leaf (its int16 bits on the wire) becomes a bfloat16 tensor over the
    same memory. Typed containers and namedtuples keep their classes; a registered type is rebuilt by its
    ``from_tree`` (:func:`~ferry.common.tree.map_tree`)."""
    return map_tree(lambda leaf: _tensor_of(leaf, fn) if isinstance(leaf, np.ndarray) or is_assembled(leaf)
                    else leaf if other is None else other(leaf), tree)


def pinned(leaf: Any) -> Any:
    """A leaf that is not an array, pinned as DataLoader's ``pin_memory`` pins it: ``leaf.pin_memory()`` where it
    has one (a local producer's pickled object of a class of your own, a sparse tensor), else itself."""
    pin = getattr(leaf, "pin_memory", None)
    return pin() if callable(pin) and not isinstance(leaf, type) else leaf


def _tensor_of(leaf: np.ndarray | Chunked, fn: Callable[[np.ndarray | Chunked], torch.Tensor]) -> torch.Tensor:
    tensor = fn(leaf)
    return tensor.view(torch.bfloat16) if getattr(leaf, "bfloat16", False) else tensor


def iter_tensors(tree: Any):
    return (leaf for leaf in iter_leaves(tree) if isinstance(leaf, torch.Tensor))


class CpuStager:
    """Tensors over the received frames (chunked leaves: over a pooled buffer); or fresh pinned copies
    when ``pin_memory``."""

    def __init__(self, pin_memory: bool, pool_limit: int = 12) -> None:
        self.pin_memory = pin_memory
        self.host = HostPool(pool_limit)

    def stage(self, delivery: Delivery) -> None:
        if self.pin_memory:
            delivery.tree = map_arrays(delivery.tree, lambda a: torch.from_numpy(self._array(a)).pin_memory(), pinned)
            delivery.frames = []  # the copies own their memory now
        else:
            delivery.tree = map_arrays(delivery.tree, lambda a: torch.from_numpy(self._array(a)))

    def _array(self, leaf: np.ndarray | Chunked) -> np.ndarray:
        return self.host.adopt(leaf) if is_assembled(leaf) else leaf

    def reclaim(self) -> None:
        """Nothing is held past ``stage`` on the CPU."""

    def close(self) -> None:
        self.host.close()

"""Datasets, collate functions and batch types for the tests of any collate output (tests/test_collate_outputs.py,
tests/test_batch_types.py). An importable module: producers started by hand (``--collate``) and spawned local
producers find them by name, and importing it registers :class:`RegisteredPair` (in the trainer and in every
producer, as a user's module would)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

import ferry


class Detection:
    """A detection dataset as torchvision's: sample i is an image (3, 4 + i % 3, 5) and a target dict with i % 3
    boxes (none for some images), so that only a collate_fn can batch it."""

    def __init__(self, length: int = 10) -> None:
        self.length = int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(index)
        boxes = index % 3
        image = torch.rand(3, 4 + index % 3, 5, generator=generator)
        target = {"boxes": torch.rand(boxes, 4, generator=generator), "labels": torch.arange(boxes) + index}
        return image, target


def detection_collate(samples):
    """torchvision's detection references' collate_fn: a tuple of images and a tuple of targets."""
    return tuple(zip(*samples))


class Steps:
    """Sample i: a (4 + i % 3, 2) float32 sequence and its class, for collate functions that make their own
    batch types."""

    def __init__(self, length: int = 10) -> None:
        self.length = int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return torch.full((4 + index % 3, 2), float(index)), index % 2


def packed_collate(samples):
    """The sequences as one PackedSequence (a namedtuple whose fields are not batch-first)."""
    return torch.nn.utils.rnn.pack_sequence([s for s, _ in samples], enforce_sorted=False)


class Pair:
    """A batch class of the user's own, as TestCustomPinFn's SimpleCustomBatch: inputs and targets."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.inputs, self.targets = inputs, targets


class RegisteredPair(Pair):
    """Registered in every process that imports this module."""


class UnregisteredPair(Pair):
    """Registered nowhere."""


def _pad(samples) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = torch.nn.utils.rnn.pad_sequence([s for s, _ in samples], batch_first=True)
    return inputs, torch.tensor([label for _, label in samples])


def registered_pair_collate(samples) -> RegisteredPair:
    return RegisteredPair(*_pad(samples))


def unregistered_pair_collate(samples) -> UnregisteredPair:
    return UnregisteredPair(*_pad(samples))


def pair_to_tree(pair: Pair) -> dict[str, Any]:
    return {"inputs": pair.inputs, "targets": pair.targets}


ferry.register_batch_type(RegisteredPair, pair_to_tree, lambda tree: RegisteredPair(tree["inputs"], tree["targets"]))


def producer_only_pair_collate(samples) -> Pair:
    """A batch of a class registered only where this function runs (a producer), under a name the trainer never
    registers: the training process cannot rebuild it."""
    ferry.register_batch_type(ProducerOnlyPair, pair_to_tree, lambda tree: ProducerOnlyPair(**tree),
                              name="tests.batch_type_datasets:ProducerOnlyPair")
    return ProducerOnlyPair(*_pad(samples))


class ProducerOnlyPair(Pair):
    """Registered only by :func:`producer_only_pair_collate`."""


@dataclasses.dataclass
class Batch:
    """A dataclass batch: padded inputs and their labels."""

    inputs: torch.Tensor
    labels: torch.Tensor
    note: str = "steps"


def dataclass_collate(samples) -> Batch:
    return Batch(*_pad(samples))


class CustomDict(dict):
    """A dict subclass, which default_collate keeps."""


class CustomList(list):
    """A list subclass, which default_collate keeps."""


class Subclassed:
    """Sample i: a CustomDict holding an array and a CustomList of two numbers."""

    def __init__(self, length: int = 10) -> None:
        self.length = int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return CustomDict(x=np.full(3, index, np.float32), pair=CustomList([index, -index]))


class Plain:
    """Sample i: a (float32 array, int) tuple, and a numpy scalar and a string in a dict: what an unbatched loader
    converts (the tuple becomes a list, the numpy values tensors)."""

    def __init__(self, length: int = 10) -> None:
        self.length = int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return np.arange(3, dtype=np.float32) + index, {"n": np.int16(index), "name": f"s{index}", "i": index}

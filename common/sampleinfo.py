"""Randomness that does not depend on who loads a sample: :func:`sample_info` and the producers' seeding.

DataLoader seeds each worker with ``base_seed + worker_id``, so a dataset's augmentations change whenever
``num_workers`` changes. Ferry does that too (:func:`seed_process`, so that no two producers draw the same
numbers), and goes further: while a producer runs ``dataset[i]``, :func:`sample_info` returns the epoch,
the index and a seed derived only from ``(seed, epoch, index)``. A dataset that draws its augmentation from
``np.random.default_rng(ferry.sample_info().seed)`` gets the same augmentation for the same sample whatever
the number of producers, whichever producer serves it, and after a re-issue when a producer dies.

This module does not import torch; :func:`seed_process` seeds torch only where torch is already loaded.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

__all__ = ["SampleInfo", "sample_info", "sample_seed", "seed_process", "producer_seed", "rank_base_seed", "numpy_seed",
           "seed_generators", "kept_generators"]

_SEED_MASK = (1 << 63) - 1
_MASK32 = 0xFFFFFFFF
#: A third word of numpy's seeding key: ``random.seed(s)`` seeds the same Mersenne Twister from the words of ``s``, so
#: without it both modules would draw the very same numbers.
_NUMPY_KEY = 0x6E756D70


@dataclass(frozen=True)
class SampleInfo:
    """What a producer is loading right now.

    Attributes:
        epoch: the epoch of the batch this sample belongs to.
        index: the sample's index in the dataset.
        seed: a 63-bit seed derived only from the loader's ``seed``, ``epoch`` and ``index``.
    """

    epoch: int
    index: int
    seed: int


_current = threading.local()
#: Held while a sample loads under the process-wide generators seeded for it (``loading(seed_globals=True)``).
_GENERATORS = threading.Lock()


def sample_info() -> SampleInfo | None:
    """The sample being loaded on this thread, or None outside a producer's ``dataset[i]``.

    A thread-local, like ``torch.utils.data.get_worker_info()``: each of a producer's loader threads sees
    its own sample.
    """
    return getattr(_current, "info", None)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A seed that depends only on ``(seed, epoch, index)``: the same on every machine and every run."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEED_MASK


@contextmanager
def loading(seed: int, epoch: int, index: int, *, seed_globals: bool = False) -> Iterator[None]:
    """Make :func:`sample_info` describe sample ``index`` of ``epoch`` on this thread while it loads.

    ``seed_globals``: also seed the process-wide generators (:func:`seed_generators`) with the sample's seed first,
    so that an augmentation drawn from ``torch.rand``, ``np.random`` or ``random`` gives the same pixels whichever
    producer loads the sample, and after a re-issue or a resume. Only where this process loads one sample at a time:
    those generators are shared by every thread.
    """
    previous = getattr(_current, "info", None)
    info = _current.info = SampleInfo(epoch=epoch, index=index, seed=sample_seed(seed, epoch, index))
    try:
        if not seed_globals:
            yield
            return
        with _GENERATORS:  # two datasets of a producer pool, each loading one sample at a time, take turns
            seed_generators(info.seed)
            yield
    finally:
        _current.info = previous


def seed_generators(seed: int) -> None:
    """Seed Python's ``random``, numpy's legacy global generator (``np.random.*``) and torch's CPU generator
    (where numpy and torch are loaded) from the 63-bit ``seed``: about 20 µs (docs/performance.md).

    torch's through ``torch.default_generator`` itself: ``torch.manual_seed`` also queues the seeding of every
    accelerator, formatting a stack trace for each, which costs ten times as much; a producer's samples are made
    on the CPU. ``torch.initial_seed()`` then returns ``seed``, as it returns a DataLoader worker's seed.
    """
    seed &= _SEED_MASK
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed([seed & _MASK32, seed >> 32, _NUMPY_KEY])  # not random's key: another stream
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "default_generator"):  # a torch module that is not one: left alone
        torch.default_generator.manual_seed(seed)


@contextmanager
def kept_generators() -> Iterator[None]:
    """Run the block, then put back the states of the generators :func:`seed_generators` seeds: for a sample loaded
    under its own seeds in the training process itself, whose generators are the script's, not Ferry's."""
    state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    torch = sys.modules.get("torch")
    torch_state = torch.default_generator.get_state() if torch is not None and hasattr(torch, "default_generator") \
        else None
    try:
        yield
    finally:
        random.setstate(state)
        if numpy_state is not None:
            sys.modules["numpy"].random.set_state(numpy_state)
        if torch_state is not None:
            torch.default_generator.set_state(torch_state)


def rank_base_seed(base_seed: int, rank: int) -> int:
    """The base seed of rank ``rank``'s local producers: rank 0's is ``base_seed`` itself (DataLoader's), every other
    rank's a digest of both. DataLoader draws its workers' base seed from torch's RNG on every rank, so ranks that
    call ``torch.manual_seed`` alike give their workers the same random streams (the same augmentations on
    different samples); Ferry's producers of different ranks never share one."""
    if rank == 0:
        return base_seed
    digest = hashlib.blake2b(f"{base_seed}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEED_MASK


def producer_seed(base_seed: int | None, worker_id: int, num_workers: int, generation: int = 0) -> int | None:
    """The process seed of local producer ``worker_id`` (of ``num_workers``): ``base_seed + worker_id``, as DataLoader
    seeds its workers, fixed when the producer starts whether or not it ever gets a batch. A replacement of a
    producer that died (its ``generation``-th) adds ``generation * num_workers``: a seed no other producer of
    the loader had, so no random stream is ever drawn twice. None without a base seed (drawn from the OS)."""
    if base_seed is None:
        return None
    return (base_seed + worker_id + generation * num_workers) & _SEED_MASK


def seed_process(seed: int | None, *, worker_id: int = 0, num_workers: int = 1, dataset: Any = None) -> int:
    """Seed ``random``, numpy's global generator and (if loaded) torch in this producer process.

    ``seed`` is the process's own seed (the loader's base seed plus the producer's index, in local mode);
    None draws one from the OS, so that no two producers started by hand share a stream. Where torch is
    loaded, ``torch.utils.data.get_worker_info()`` then returns a WorkerInfo for this producer, so datasets
    that consult it behave as in a DataLoader worker. Returns the seed used.
    """
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little") & _SEED_MASK
    seed &= _SEED_MASK
    random.seed(seed)
    if "numpy" in sys.modules:
        import numpy as np

        np.random.seed(numpy_seed((seed - worker_id) & _SEED_MASK, worker_id))
    if "torch" in sys.modules:
        import torch
        from torch.utils.data._utils import worker as torch_worker

        torch.manual_seed(seed)
        torch_worker._worker_info = torch_worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                                            dataset=dataset)
    return seed


def numpy_seed(base_seed: int, worker_id: int) -> list[int]:
    """The seed DataLoader gives numpy's global generator in worker ``worker_id`` of base seed ``base_seed``: four
    32-bit words hashed from both, as ``torch.utils.data._utils.worker._generate_state`` computes them (numpy's
    SeedSequence hashing; written out here because torch keeps it private). A producer's process seed is
    ``base_seed + worker_id``, so the base is that less its id."""
    init_a, mult_a, init_b, mult_b, mix_l, mix_r, shift = (0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED,
                                                           0xCA01F9DD, 0x4973F715, 16)
    entropy = [worker_id, base_seed & _MASK32, base_seed >> 32, 0]
    const_a = init_a

    def hashed(value: int) -> int:
        nonlocal const_a
        value = (value ^ const_a) & _MASK32
        const_a = (const_a * mult_a) & _MASK32
        value = (value * const_a) & _MASK32
        return (value ^ (value >> shift)) & _MASK32

    def mixed(x: int, y: int) -> int:
        result = (((mix_l * x) & _MASK32) - ((mix_r * y) & _MASK32)) & _MASK32
        return (result ^ (result >> shift)) & _MASK32

    pool = [hashed(value) for value in entropy]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mixed(pool[dst], hashed(pool[src]))
    state, const_b = [], init_b
    for value in pool:
        value = (value ^ const_b) & _MASK32
        const_b = (const_b * mult_b) & _MASK32
        value = (value * const_b) & _MASK32
        state.append((value ^ (value >> shift)) & _MASK32)
    return state

"""Plumbing of the adaptation of PyTorch's DataLoader tests (tests/test_dataloader_parity*.py): the start-method
fixture, loaders shared between read-only cases, and the gaps that keep a case an expected failure.

Each adapted case runs ``RemoteLoader(dataset=..., local_producers=N)`` where the original runs
``DataLoader(..., num_workers=N)`` and keeps the original's expectation; the list of the original cases, with
what became of each, is docs/porting.md ("PyTorch's DataLoader tests").

Every expected failure is ``xfail(strict=True)`` with one of the reasons below: the day its gap is closed the
case passes, strict turns that into a failure ("XPASS(strict)"), and the marker must go (and the line in
docs/porting.md with it).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from ferry import RemoteLoader

from .helpers import LeakCheck

#: producers where the original has num_workers >= 2: two keep every cross-worker property (batches from
#: several processes, in order) at half the start-up cost of four under spawn on a two-core machine
WORKERS = 2

#: the options every adapted loader shares: fast heartbeats, no progress lines, a bounded wait for each batch
#: (DataLoader's timeout)
COMMON = {"heartbeat": 0.2, "log_every": None, "timeout": 60}

#: the start methods of the cases where the start method matters (a producer-side hook or a dataset class
#: is pickled, a producer seeds itself or reports its worker info, the original names spawn itself): both, always
START_METHODS = ("fork", "spawn")

#: the start methods of the other cases: spawn only with ``-m slow`` (it costs each loader a fresh
#: interpreter importing torch per producer, seconds on two cores, and changes nothing these cases check)
BULK_START_METHODS = ("fork", pytest.param("spawn", marks=pytest.mark.slow))


def xfail(reason: str) -> Any:
    """A case that fails today because of ``reason``; strict, so that it must be re-enabled when fixed."""
    return pytest.mark.xfail(strict=True, reason=reason)


# --- gaps of issue 18 ----------------------------------------------------------------------------------------

class SharedLoaders:
    """Loaders built once per (dataset, options) and shared by the read-only cases of one test module and
    start method; each case iterates whole epochs, so none sees another's state. All are closed at teardown,
    which then checks that no thread, fd or process is left."""

    def __init__(self, mp_context: str, datasets: dict[str, Any]) -> None:
        self.mp_context = mp_context
        self.datasets = datasets
        self._loaders: dict[tuple, RemoteLoader] = {}
        keep_for_spawn(datasets)
        self._leaks = LeakCheck()

    def get(self, dataset: str, **options: Any) -> RemoteLoader:
        """The loader over ``self.datasets[dataset]`` with ``options`` (plus WORKERS producers and COMMON)."""
        key = (dataset, tuple(sorted((name, repr(value)) for name, value in options.items())))
        if key not in self._loaders:
            options = {"local_producers": WORKERS, **COMMON, **options}
            self._loaders[key] = RemoteLoader(dataset=self.datasets[dataset], mp_context=self.mp_context, **options)
        return self._loaders[key]

    def close(self) -> None:
        for loader in self._loaders.values():
            loader.close()
        self._loaders.clear()
        self._leaks.assert_clean()


def keep_for_spawn(datasets: dict[str, Any]) -> None:
    """Make now what sending ``datasets`` to a spawned producer keeps for the rest of the process, so that a
    leak check that starts after this call does not count it: multiprocessing's resource tracker (one process
    per interpreter, and its pipe) and torch's shared-memory fd of each tensor (pickling a tensor for another
    process moves its storage to shared memory, for as long as the tensor lives)."""
    import multiprocessing.resource_tracker

    multiprocessing.resource_tracker.ensure_running()
    for dataset in datasets.values():
        for tensor in getattr(dataset, "tensors", (dataset,)):
            if isinstance(tensor, torch.Tensor):
                tensor.share_memory_()


def local(dataset: Any, mp_context: str, **options: Any) -> RemoteLoader:
    """A loader of its own (use it in ``with``): WORKERS local producers under ``mp_context`` and COMMON."""
    return RemoteLoader(dataset=dataset, mp_context=mp_context, **{"local_producers": WORKERS, **COMMON, **options})


def cpus() -> int:
    """CPUs this process may run on (what DataLoader compares num_workers with)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

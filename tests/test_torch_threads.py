"""A producer runs each torch operation on one CPU thread by default, as DataLoader's workers do: its ``--threads``
loads run at once, and OpenMP teams as large as the machine in each of them fought over the cores (a user's image
transform in torch served about 5x fewer samples on 2 cores). ``--torch-threads N`` (``FERRY_TORCH_THREADS``) or
``OMP_NUM_THREADS`` in a hand-started producer's environment says otherwise; local producers always use one.

The rule as a unit (a stand-in for torch); then real producers whose dataset imports torch in ``__getitem__``,
after the producer started, which only ``OMP_NUM_THREADS`` reaches."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from ferry import RemoteLoader
from ferry.producer.torch_threads import THREAD_VARIABLES, limit_torch_threads

from tests.torch_threads_datasets import TorchThreads

SPEC = "tests.torch_threads_datasets:TorchThreads"

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                     reason="torch's default is one thread on one CPU: nothing would differ")


@pytest.fixture
def environment(monkeypatch):
    """The thread variables unset, and put back as they were after the test (setenv first: monkeypatch restores
    only what it saw, and limit_torch_threads writes them)."""
    for name in THREAD_VARIABLES:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def loaded_torch(environment):
    """torch as loaded already: a stand-in that records what it was told."""
    told = []
    environment.setitem(sys.modules, "torch", SimpleNamespace(set_num_threads=told.append))
    return told


def test_one_thread_by_default_two_when_told_and_the_environment_s_count_when_it_has_one(loaded_torch, environment):
    assert (limit_torch_threads(None), limit_torch_threads(2)) == (1, 2)
    environment.setenv("OMP_NUM_THREADS", "4")
    assert (limit_torch_threads(None), limit_torch_threads(3)) == (None, 3)
    environment.delenv("OMP_NUM_THREADS")
    environment.setenv("MKL_NUM_THREADS", "4")  # torch reads it too, and it wins over OMP_NUM_THREADS
    assert limit_torch_threads(None) is None
    assert loaded_torch == [1, 2, 3]


def test_torch_not_loaded_yet_is_reached_through_both_variables(environment):
    environment.delitem(sys.modules, "torch")
    assert limit_torch_threads(None) == 1
    assert [os.environ[name] for name in THREAD_VARIABLES] == ["1", "1"]
    assert limit_torch_threads(3) == 3
    assert [os.environ[name] for name in THREAD_VARIABLES] == ["3", "3"]


def _threads_seen(loader) -> set[int]:
    return {int(v) for batch in loader for v in batch.flatten().tolist()}


UNSET = {name: "" for name in THREAD_VARIABLES}


@needs_two_cpus
@pytest.mark.parametrize("flags, env, args, expected", [
    ((), UNSET, {}, {1}),  # the default: what DataLoader's workers use
    ((), {**UNSET, "MKL_NUM_THREADS": "2"}, {}, {2}),  # the environment of a producer started by hand says
    (("--torch-threads", "2"), {**UNSET, "MKL_NUM_THREADS": "3"}, {}, {2}),  # the flag wins over it
    ((), UNSET, {"import_at_open": True}, {1}),  # torch loaded before the loading threads: set_num_threads
], ids=["default", "environment", "flag", "loaded-at-open"])
def test_a_hand_started_producer_s_loads_use_the_threads_it_was_given(endpoint, spawn, flags, env, args, expected):
    spawn(endpoint, SPEC, {"length": 8, **args}, threads=2, extra=flags, env=env)
    with RemoteLoader(endpoint=endpoint, batch_size=2, timeout=60, log_every=None) as loader:
        assert _threads_seen(loader) == expected


@needs_two_cpus
def test_local_producers_use_one_thread_whatever_the_trainer_s_environment(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the trainer's own setting, which a spawned producer inherits
    with RemoteLoader(dataset=TorchThreads(8), local_producers=1, mp_context="spawn", batch_size=2, timeout=60,
                      log_every=None) as loader:
        assert _threads_seen(loader) == {1}

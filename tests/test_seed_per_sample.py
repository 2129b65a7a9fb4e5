"""Per-sample seeding: a map-style sample loaded one at a time is loaded under torch's CPU generator, numpy's global
one and Python's ``random`` seeded from (seed, epoch, index), so an augmentation drawn from them gives the same
pixels whichever producer loads it, however many run, and after a producer is killed (issue 30, point 5).

The oracle is the documented function itself: each sample computed in this process under
``loading(seed, epoch, index, seed_globals=True)``, with this process's generators kept."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch

from ferry import RemoteLoader
from ferry.common.sampleinfo import kept_generators, loading, sample_seed, seed_generators

from .helpers import wait_for
from .random_datasets import GlobalAugmented

SEED, EPOCHS = 11, 2


def _expected(dataset, seed: int, epoch: int, index: int) -> torch.Tensor:
    with kept_generators(), loading(seed, epoch, index, seed_globals=True):
        return dataset[index][0]


def _rows(loader, epochs: int) -> list[dict[int, torch.Tensor]]:
    """Each epoch's samples by index; every index once per epoch."""
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        rows: dict[int, torch.Tensor] = {}
        for x, y in loader:
            for row, index in zip(x, y.tolist()):
                assert index not in rows, f"sample {index} twice in epoch {epoch}"
                rows[index] = row.clone()
        out.append(rows)
    return out


def _assert_per_sample(rows: list[dict[int, torch.Tensor]], dataset, seed: int) -> None:
    for epoch, by_index in enumerate(rows):
        assert sorted(by_index) == list(range(len(dataset))), f"epoch {epoch} is not every sample once"
        for index, row in by_index.items():
            assert torch.equal(row, _expected(dataset, seed, epoch, index)), f"epoch {epoch}, sample {index}"


# --- the rule, without processes ---------------------------------------------------------------------------
def test_a_sample_draws_the_same_numbers_each_time_it_is_loaded():
    dataset = GlobalAugmented(8)
    first = [_expected(dataset, SEED, 0, i) for i in range(8)]
    assert all(torch.equal(a, _expected(dataset, SEED, 0, i)) for i, a in enumerate(first))
    assert len({tuple(a.tolist()) for a in first}) == 8, "samples share a stream"
    assert not torch.equal(first[3], _expected(dataset, SEED, 1, 3)), "another epoch must draw anew"
    assert not torch.equal(first[3], _expected(dataset, SEED + 1, 0, 3)), "another seed must draw anew"


def test_each_generator_gets_a_stream_of_its_own_and_torch_reports_the_seed():
    with kept_generators():
        seed_generators(sample_seed(SEED, 0, 5))
        drawn = (random.random(), float(np.random.rand()), float(torch.rand(())), torch.initial_seed())
    assert len(set(drawn[:3])) == 3, f"two generators draw the same numbers: {drawn}"
    assert drawn[3] == sample_seed(SEED, 0, 5)


def test_the_training_process_generators_are_put_back():
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    _expected(GlobalAugmented(4), SEED, 0, 1)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def test_two_threads_loading_under_their_own_seeds_take_turns():
    """Two datasets of one producer pool each load one sample at a time on a thread of their own: the
    process-wide generators are seeded for one sample at a time."""
    dataset, results, errors = GlobalAugmented(64), {}, []

    def load(start: int) -> None:
        try:
            for index in range(start, 64, 2):
                with loading(SEED, 0, index, seed_globals=True):
                    results[index] = dataset[index][0]
        except Exception as exc:  # reported below
            errors.append(exc)

    with kept_generators():
        threads = [threading.Thread(target=load, args=(start,)) for start in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert not errors and len(results) == 64
    assert all(torch.equal(results[i], _expected(dataset, SEED, 0, i)) for i in range(64))


# --- real producers ----------------------------------------------------------------------------------------
def test_one_and_three_local_producers_give_each_sample_its_own_draws():
    dataset = GlobalAugmented(48)
    for producers in (1, 3):
        with RemoteLoader(dataset=dataset, local_producers=producers, batch_size=5, shuffle=True, seed=SEED,
                          timeout=60, log_every=None) as loader:
            _assert_per_sample(_rows(loader, EPOCHS), dataset, SEED)


def test_loads_that_overlap_are_not_seeded_unless_asked_and_then_load_one_at_a_time():
    """With loading threads (producer_threads=2) the generators are shared, so the default leaves them alone;
    ``seed_per_sample=True`` seeds them and loads the samples one at a time."""
    dataset = GlobalAugmented(24)
    with RemoteLoader(dataset=dataset, local_producers=1, producer_threads=2, batch_size=4, seed=SEED, timeout=60,
                      log_every=None) as loader:
        rows = _rows(loader, 1)[0]
    assert not all(torch.equal(rows[i], _expected(dataset, SEED, 0, i)) for i in rows)
    with RemoteLoader(dataset=dataset, local_producers=1, producer_threads=2, batch_size=4, seed=SEED, timeout=60,
                      log_every=None, seed_per_sample=True) as loader:
        _assert_per_sample(_rows(loader, 1), dataset, SEED)


def test_a_producer_killed_mid_epoch_changes_no_pixel(spawn, endpoint):
    """Three producers started by hand (default options), one SIGKILLed while it holds a task: its batches are
    loaded again by the others, under the same seeds."""
    dataset = GlobalAugmented(60)
    with RemoteLoader(endpoint=endpoint, batch_size=6, shuffle=True, seed=SEED, timeout=60, heartbeat=0.1,
                      liveness=3, log_every=None) as loader:
        producers = {p.pid: p for p in (spawn(endpoint, "tests.random_datasets:GlobalAugmented",
                                              {"length": 60, "delay": 0.01}, threads=None, slots=1)
                                        for _ in range(3))}
        wait_for(lambda: loader.stats()["producers"] == 3, 30, "3 producers")
        rows: dict[int, torch.Tensor] = {}
        victim = None
        for x, y in loader:
            rows.update({index: row.clone() for row, index in zip(x, y.tolist())})
            if victim is None and len(rows) >= 12:
                busy = [int(name.rsplit(":", 1)[1]) for name, figures in loader.stats()["per_producer"].items()
                        if figures["in_flight"] > 0]
                victim = next((producers[pid] for pid in busy if pid in producers), None)
                if victim is not None:
                    victim.kill()
        assert victim is not None, "no producer was ever seen holding a task"
        assert loader.stats()["reissued"] >= 1, "the killed producer held no task: nothing was re-issued"
    _assert_per_sample([rows], dataset, SEED)

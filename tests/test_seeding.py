"""Producers' randomness: no two producers share a random stream (as DataLoader seeds its workers), and
``ferry.sample_info().seed`` gives augmentations that do not depend on who loads a sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ferry
from ferry import RemoteLoader
from ferry.common.sampleinfo import sample_seed

from .helpers import assert_tree_equal, wait_for
from .random_datasets import Augmented, Draws, WorkerView


def _draws(loader: RemoteLoader, epochs: int) -> dict[str, list[float]]:
    seen: dict[str, list[float]] = {"torch": [], "numpy": [], "random": []}
    indices = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for index, t, n, r in loader:
            indices += index.tolist()
            seen["torch"] += t.tolist()
            seen["numpy"] += n.tolist()
            seen["random"] += r.tolist()
    assert sorted(indices) == sorted(list(range(len(indices) // epochs)) * epochs)
    return seen


def _assert_no_repeats(seen: dict[str, list[float]]) -> None:
    for name, values in seen.items():
        repeats = len(values) - len(set(values))
        assert repeats == 0, f"{repeats} of {len(values)} {name} draws repeat across producers"


@pytest.mark.parametrize("dataset", [Draws(64), "tests.random_datasets:Draws"], ids=["forked", "spawned-by-spec"])
def test_local_producers_never_share_a_random_stream(dataset):
    torch.manual_seed(0)  # what a training script does; forked producers inherit this state
    np.random.seed(0)
    with RemoteLoader(dataset=dataset, local_producers=2, producer_threads=2, batch_size=4, shuffle=True,
                      timeout=60) as loader:
        _assert_no_repeats(_draws(loader, epochs=2))


def test_producer_seeds_follow_torch_manual_seed_like_dataloader_workers():
    """The producers' base seed is drawn from torch's RNG, so a script's torch.manual_seed fixes them."""
    def run() -> list[float]:
        torch.manual_seed(1234)
        with RemoteLoader(dataset=Draws(16), local_producers=1, producer_threads=1, batch_size=16,
                          timeout=60) as loader:
            (index, t, _, _), = list(loader)
        return [x for _, x in sorted(zip(index.tolist(), t.tolist()))]

    assert run() == run()


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_one_producer_draws_what_one_dataloader_worker_draws(method):
    """torch, numpy and Python's random in a producer give a dataset the numbers a DataLoader worker's do, draw for
    draw: the same base seed (from torch's RNG), torch and random seeded with base + id, numpy with DataLoader's
    hash of both, and nothing of Ferry's drawing from them (the HELLO nonce comes from the OS). One producer loads
    a user's dataset class one sample at a time, in the order of its batches whatever its slots (samplepool.Turns),
    as the worker does. With per-sample seeding off (``seed_per_sample=False``): on, which is the default for a
    dataset class of your own, each sample draws from its own seeds instead (tests/test_seed_per_sample.py)."""
    def draws(loader) -> list[tuple]:
        return [row for batch in loader for row in zip(*(column.tolist() for column in batch))]

    torch.manual_seed(1234)
    expected = draws(torch.utils.data.DataLoader(Draws(48), batch_size=4, num_workers=1,
                                                 multiprocessing_context=method))
    for slots in (1, 4):
        torch.manual_seed(1234)
        with RemoteLoader(dataset=Draws(48), local_producers=1, producer_slots=slots, batch_size=4, timeout=60,
                          mp_context=method, log_every=None, seed_per_sample=False) as loader:
            got = draws(loader)
        assert got == expected, f"producer_slots={slots}"


def test_numpy_seed_is_dataloaders_hash_of_base_seed_and_worker_id():
    from torch.utils.data._utils.worker import _generate_state  # private to torch: what numpy_seed writes out

    from ferry.common.sampleinfo import numpy_seed

    for base, worker in [(0, 0), (1, 0), (0, 1), ((1 << 63) - 1, 7), (0x1234_5678_9ABC_DEF0, 31), (42, 1000)]:
        assert numpy_seed(base, worker) == _generate_state(base, worker), (base, worker)


def _augmented_batches(loader: RemoteLoader, epochs: int) -> list:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out += [[x.clone(), y.clone()] for x, y in loader]
    return out


def test_sample_info_augmentation_is_the_same_with_1_and_3_producers():
    runs = []
    for producers in (1, 3):
        with RemoteLoader(dataset=Augmented(48), local_producers=producers, batch_size=8, shuffle=True, seed=7,
                          timeout=60) as loader:
            runs.append(_augmented_batches(loader, epochs=2))
    assert len(runs[0]) == 12
    for i, (a, b) in enumerate(zip(*runs)):
        assert_tree_equal(b, a, f"batch {i}")
    # and the noise is exactly the documented function of (seed, epoch, index): nothing else
    x, y = runs[0][6]  # epoch 1, first batch
    for row, index in zip(x, y.tolist()):
        noise = np.random.default_rng(sample_seed(7, 1, index)).standard_normal(4).astype(np.float32)
        assert torch.equal(row, torch.from_numpy(np.full(4, index, dtype=np.float32) + noise))
    epoch0 = {int(i): row for x, y in runs[0][:6] for row, i in zip(x, y)}
    epoch1 = {int(i): row for x, y in runs[0][6:] for row, i in zip(x, y)}
    assert all(not torch.equal(epoch0[i], epoch1[i]) for i in epoch0), "each epoch must augment anew"


def test_sample_info_augmentation_survives_a_producer_killed_mid_epoch(spawn, endpoint):
    with RemoteLoader(dataset=Augmented(96), local_producers=1, batch_size=8, shuffle=True, seed=3,
                      timeout=60) as loader:
        expected = _augmented_batches(loader, epochs=1)
    with RemoteLoader(endpoint=endpoint, batch_size=8, shuffle=True, seed=3, timeout=60, heartbeat=0.1,
                      liveness=3) as loader:
        producers = {p.pid: p for p in (spawn(endpoint, "tests.random_datasets:Augmented",
                                              {"length": 96, "delay": 0.02}, threads=1, slots=1)
                                        for _ in range(3))}
        wait_for(lambda: loader.stats()["producers"] == 3, 30, "3 producers")
        got, victim = [], None
        for x, y in loader:
            got.append([x.clone(), y.clone()])
            # from batch 2 on, kill the first producer seen holding a task (producers are named host:pid);
            # the loop keeps consuming meanwhile, so the others stay busy
            if victim is None and len(got) >= 2:
                busy = [int(name.rsplit(":", 1)[1]) for name, figures in loader.stats()["per_producer"].items()
                        if figures["in_flight"] > 0]
                victim = next((producers[pid] for pid in busy if pid in producers), None)
                if victim is not None:
                    victim.kill()
        assert victim is not None, "no producer was ever seen holding a task"
        assert loader.stats()["reissued"] >= 1, "the killed producer held no task: nothing was re-issued"
    assert len(got) == len(expected) == 12
    for i, (a, b) in enumerate(zip(got, expected)):
        assert_tree_equal(a, b, f"batch {i}")


def test_worker_info_and_producer_init_in_each_producer():
    from .random_datasets import mark_init

    with RemoteLoader(dataset=WorkerView(), local_producers=2, batch_size=4, timeout=60,
                      producer_init=mark_init) as loader:
        rows = [tuple(map(int, r)) for batch in loader for r in zip(*batch)]
    assert sorted(r[0] for r in rows) == list(range(16))
    ids = {r[1] for r in rows}
    assert ids <= {0, 1} and all(r[2] == 2 for r in rows), rows
    assert all(r[3] == 100 + r[1] for r in rows), "producer_init ran with the producer's own worker id"


def test_producer_init_spec_for_producers_started_by_spec():
    with RemoteLoader(dataset="tests.random_datasets:WorkerView", local_producers=2, batch_size=4, timeout=60,
                      producer_init="tests.random_datasets:mark_init") as loader:
        rows = [tuple(map(int, r)) for batch in loader for r in zip(*batch)]
    assert {r[1] for r in rows} <= {0, 1} and all(r[2] == 2 and r[3] == 100 + r[1] for r in rows), rows


def test_sample_info_is_none_outside_a_producer():
    assert ferry.sample_info() is None
    assert sample_seed(1, 2, 3) == sample_seed(1, 2, 3) != sample_seed(1, 2, 4)
    assert 0 <= sample_seed(2**70, 0, 0) < 2**63
